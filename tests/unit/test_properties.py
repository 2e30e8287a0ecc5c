"""Property-based tests (hypothesis): key parsing, tier parsing, the rate-limit header values and
the cached timestamp strings."""

import datetime
import json
import math
import re
from unittest import mock

import pytest
from clock import FakeTime
from contract import DOCUMENT
from hypothesis import HealthCheck, assume, given, settings, strategies as st

import auth
import models
import ratelimit
import sockets
from keys import keyformat
from serving import envelope
from settings import TIER_NAME_PATTERN, rate

# The app fixture is only read from in these tests, so sharing it across examples is safe.
uses_app = settings(suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)

ANY_TEXT = st.text(st.characters(exclude_categories=()))
TIER_NAMES = st.from_regex(TIER_NAME_PATTERN, fullmatch=True)
AMOUNTS = st.integers(min_value=1, max_value=10**10 - 1)
SPACE = st.sampled_from(["", " ", "  ", "\t"])


@uses_app
@given(ANY_TEXT)
def test_authenticate_raises_only_api_key_errors(app, secret):
    with pytest.raises(auth.ApiKeyError) as raised:
        auth.authenticate(secret)
    expected = "missing_api_key" if not secret.strip() else "invalid_api_key"
    assert raised.value.error_code == expected


@uses_app
@given(st.from_regex(keyformat.KEY_PATTERN, fullmatch=True))
def test_well_formed_unknown_keys_are_invalid(app, secret):
    with pytest.raises(auth.ApiKeyError) as raised:
        auth.authenticate(secret)
    assert raised.value.error_code == "invalid_api_key"


@given(st.sampled_from(sorted(keyformat.KEY_PREFIXES)))
def test_issued_secrets_match_the_key_pattern(key_type):
    secret = keyformat.generate_secret(key_type)
    assert keyformat.KEY_PATTERN.fullmatch(secret)
    assert secret.startswith(keyformat.KEY_PREFIXES[key_type])
    assert len(secret) == keyformat.CHECKSUMMED_LENGTH and not keyformat.checksum_fails(secret)


@uses_app
@given(st.data())
def test_any_change_to_an_issued_key_is_rejected(app, api_key, data):
    position = data.draw(st.integers(min_value=0, max_value=len(api_key) - 1))
    replacement = data.draw(st.characters(min_codepoint=0x21, max_codepoint=0x7E))
    assume(replacement != api_key[position])
    changed = api_key[:position] + replacement + api_key[position + 1:]
    with pytest.raises(auth.ApiKeyError):
        auth.authenticate(changed)
    assert auth.authenticate(api_key).name == "Alice dev"


@given(st.dictionaries(TIER_NAMES, st.tuples(AMOUNTS, st.sampled_from(sorted(ratelimit.PERIODS))),
                       min_size=1, max_size=5), SPACE)
def test_tiers_round_trip(tiers, space):
    spec = ",".join(f"{space}{name}{space}={space}{amount}{space}/{space}{period}{space}"
                    for name, (amount, period) in tiers.items())
    parsed = ratelimit.parse_tiers(spec)
    assert parsed == {name: (ratelimit.PERIODS[period](amount),) for name, (amount, period) in tiers.items()}
    again = ",".join(f"{name}={'+'.join(f'{item.amount}/{item.GRANULARITY.name}' for item in items)}"
                     for name, items in parsed.items())
    assert ratelimit.parse_tiers(again) == parsed


@given(ANY_TEXT)
def test_tier_parsing_rejects_garbage_with_value_error_only(spec):
    try:
        tiers = ratelimit.parse_tiers(spec)
    except ValueError:
        return
    assert tiers and all(TIER_NAME_PATTERN.fullmatch(name) for name in tiers)
    assert all(item.amount >= 1 for items in tiers.values() for item in items)


@given(ANY_TEXT)
def test_rate_parsing_rejects_garbage_with_value_error_only(text):
    try:
        item = ratelimit.limit_item(rate(text, "PUBLIC_RATE_LIMIT"))
    except ValueError:
        return
    assert item.amount >= 1 and item.GRANULARITY.name in ratelimit.PERIODS


def header_schema(name):
    return DOCUMENT["components"]["headers"][name]["schema"]


@given(
    policy=st.one_of(TIER_NAMES, st.just(ratelimit.PUBLIC_POLICY)),
    limit=AMOUNTS,
    data=st.data(),
    window=st.sampled_from([item(1).get_expiry() for item in ratelimit.PERIODS.values()]),
    now=st.floats(min_value=1e9, max_value=4e9),
)
def test_rate_limit_headers_parse_back_to_the_state(policy, limit, data, window, now):
    remaining = data.draw(st.integers(min_value=0, max_value=limit))
    reset = now + data.draw(st.floats(min_value=0, max_value=window))
    state = ratelimit.RateLimitState(policy, limit, remaining, reset, window)
    with mock.patch.object(ratelimit, "time", FakeTime(now)):
        headers = dict(envelope.header_lines(state))

    assert int(headers["X-RateLimit-Limit"]) == limit
    assert int(headers["X-RateLimit-Remaining"]) == remaining
    assert int(headers["X-RateLimit-Reset"]) == math.ceil(reset)
    policy_match = re.fullmatch(r'"(.+)";q=(\d+);w=(\d+)', headers["RateLimit-Policy"])
    assert (policy_match[1], int(policy_match[2]), int(policy_match[3])) == (policy, limit, window)
    current = re.fullmatch(r'"(.+)";r=(\d+);t=(\d+)', headers["RateLimit"])
    assert (current[1], int(current[2]), int(current[3])) == (policy, remaining, math.ceil(reset - now))
    for name in ("RateLimit-Policy", "RateLimit"):
        assert re.search(header_schema(name)["pattern"], headers[name])


@given(st.floats(min_value=0, max_value=4_102_444_799.999, allow_nan=False))
def test_now_strings_truncate_to_the_millisecond(now):
    with mock.patch.object(models, "time", FakeTime(now)):
        iso, display = models.now_strings()
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", iso)
    shown = datetime.datetime.strptime(iso, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=datetime.UTC).timestamp()
    assert shown <= now < shown + 0.001 + 1e-6
    assert display == models.display_time(models.utc_from_epoch(math.floor(now)))


@given(ANY_TEXT, st.text(), st.text())
def test_the_echo_reply_is_what_json_dumps_writes(message, timestamp, server_time):
    assert sockets.echo_reply(message, timestamp, server_time) == json.dumps(
        {"type": "echo", "message": message, "timestamp": timestamp, "server_time": server_time})
