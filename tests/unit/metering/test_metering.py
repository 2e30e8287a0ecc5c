"""Several windows per tier, per-key overrides, the account allowance and credits with refill,
through Flask's test client and the CLI, on SQLite and PostgreSQL."""

import datetime

import pytest
from clock import fake_time
from peewee import OperationalError

from accounts import securitylog, users
from metering import credits
from models import ApiKey, SecurityEvent
from ops.note import Note
from orgs import keyactions

PROTECTED = "/api/v1/protected/test"
STATS = "/api/v1/usage/stats"


@pytest.fixture
def metered(make_app, database_url):
    """An app whose tier `multi` has two windows and whose accounts share 12 requests a minute."""
    app = make_app({
        "DATABASE_URL": database_url,
        "RATELIMIT_STORAGE_URL": "memory://",
        "RATE_LIMIT_TIERS": "free=3/minute,multi=3/second+10/minute,wide=1000/minute",
        "ACCOUNT_RATE_LIMIT": "12/minute",
        "PUBLIC_RATE_LIMIT": "off",
        "TESTING": True,
        "WTF_CSRF_ENABLED": False,
    })
    with app.app_context():
        yield app


@pytest.fixture
def owner(metered):
    return users.create_user("carol", "carol@example.com", "correct horse battery")


def issue(user, tier="wide", **options):
    key, secret = keyactions.issue_key(user, f"key {ApiKey.select().count()}", "development", tier, **options)
    return key, secret


def get(app, secret, path=PROTECTED):
    return app.test_client().get(path, headers={"X-API-Key": secret})


def window_count(app, key, policy):
    limiter = app.extensions["ratelimit"]
    found = ApiKey.get_by_id(key.id)
    found.has_credits = found.credits_remaining is not None
    plan = limiter.plan_for(found)
    window = next(window for window in plan.windows if window.policy == policy)
    return limiter.storage.get(window.key)


def test_a_tier_of_two_windows_admits_by_both_and_charges_neither_on_a_refusal(metered, owner, monkeypatch):
    clock = fake_time(monkeypatch, "limits.storage.memory", "store.limitstorage", "ratelimit")
    key, secret = issue(owner, "multi")
    statuses = []
    for second in range(4):
        clock.now += second and 1
        statuses.append([get(metered, secret).status_code for _ in range(4)])
    # 3 a second, and the minute's 10 reached in the fourth second.
    assert statuses == [[200, 200, 200, 429], [200, 200, 200, 429], [200, 200, 200, 429], [200, 429, 429, 429]]
    assert window_count(metered, key, "multi-minute") == 10
    assert window_count(metered, key, "multi-second") == 1
    refused = get(metered, secret)
    assert refused.get_json()["error"]["code"] == "rate_limit_exceeded"
    assert refused.headers["RateLimit-Policy"] == ('"multi-second";q=3;w=1, "multi-minute";q=10;w=60, '
                                                   '"account";q=12;w=60')
    assert refused.headers["X-RateLimit-Limit"] == "10"
    assert int(refused.headers["Retry-After"]) >= 1


def test_the_headers_describe_the_window_with_the_fewest_requests_left(metered, owner):
    _, secret = issue(owner, "multi")
    first = get(metered, secret)
    # The second's window has 2 left, the minute's 9, the account's 11.
    assert first.headers["X-RateLimit-Limit"] == "3"
    assert first.headers["X-RateLimit-Remaining"] == "2"
    assert first.headers["RateLimit"].startswith('"multi-second";r=2;t=')
    stats = get(metered, secret, STATS).get_json()
    assert stats["requests_remaining"] == 1
    assert "credits" not in stats


def test_the_account_window_is_shared_by_its_keys_and_refuses_with_its_own_code(metered, owner):
    first_key, first = issue(owner)
    second_key, second = issue(owner)
    other = users.create_user("dave", "dave@example.com", "correct horse battery")
    _, outsider = issue(other)
    assert [get(metered, first).status_code for _ in range(7)] == [200] * 7
    assert [get(metered, second).status_code for _ in range(5)] == [200] * 5
    refused = get(metered, second)
    assert refused.status_code == 429
    assert refused.get_json()["error"]["code"] == "account_rate_limit_exceeded"
    assert 0 < int(refused.headers["Retry-After"]) <= 60
    assert refused.headers["RateLimit"].startswith('"account";r=0;')
    # Refused by the account: not charged to the key's own window, nor counted.
    assert window_count(metered, second_key, "wide") == 5
    assert get(metered, outsider).status_code == 200
    metered.extensions["usage"].flush()
    assert ApiKey.get_by_id(second_key.id).total_requests == 5


def test_an_override_replaces_the_tiers_windows_from_the_next_request(metered, owner):
    key, secret = issue(owner, "free")
    runner = metered.test_cli_runner()
    assert get(metered, secret).headers["X-RateLimit-Limit"] == "3"
    result = runner.invoke(args=["keys", "limit", str(key.id), "2/second + 5/hour"])
    assert result.exit_code == 0, result.output
    assert "2/second+5/hour" in result.output
    response = get(metered, secret)
    assert response.headers["RateLimit-Policy"] == '"key-second";q=2;w=1, "key-hour";q=5;w=3600, "account";q=12;w=60'
    listed = runner.invoke(args=["keys", "list", "carol"]).output.strip().split("\t")
    assert listed[-1] == "limit=2/second+5/hour"
    assert SecurityEvent.get(SecurityEvent.event == "key.limit_changed").detail.endswith("2/second+5/hour")
    assert runner.invoke(args=["keys", "limit", str(key.id), "--tier"]).exit_code == 0
    assert get(metered, secret).headers["RateLimit-Policy"] == '"free";q=3;w=60, "account";q=12;w=60'
    assert runner.invoke(args=["keys", "list", "carol"]).output.strip().split("\t")[-1] == "-"


@pytest.mark.parametrize("args, message", [
    (["2/fortnight"], "A key's limit must be a rate like 1000/hour"),
    (["1/second+2/second"], "two rates per second"),
    ([], "or --tier, not both"),
    (["5/hour", "--tier"], "or --tier, not both"),
])
def test_a_bad_override_is_refused_with_a_sentence(metered, owner, args, message):
    key, _ = issue(owner)
    result = metered.test_cli_runner().invoke(args=["keys", "limit", str(key.id), *args])
    assert result.exit_code != 0
    assert message in result.output
    assert ApiKey.get_by_id(key.id).rate_limits is None


def test_credits_admit_exactly_their_number_then_refuse_without_charging(metered, owner):
    key, secret = issue(owner, credits_given=3)
    answers = [get(metered, secret) for _ in range(5)]
    assert [answer.status_code for answer in answers] == [200, 200, 200, 429, 429]
    assert [answer.headers["X-Credits-Remaining"] for answer in answers] == ["2", "1", "0", "0", "0"]
    refused = answers[-1]
    assert refused.get_json()["error"]["code"] == "credits_exhausted"
    # No refill: waiting does not help, so no Retry-After.
    assert "Retry-After" not in refused.headers
    assert window_count(metered, key, "wide") == 3
    # The account's window has the fewest left: 12 - 3.
    assert refused.headers["X-RateLimit-Remaining"] == "9"
    metered.extensions["usage"].flush()
    assert ApiKey.get_by_id(key.id).total_requests == 3
    assert ApiKey.get_by_id(key.id).credits_remaining == 0


def test_a_plain_key_carries_no_credit_header(metered, owner):
    _, secret = issue(owner)
    assert "X-Credits-Remaining" not in get(metered, secret).headers


def test_credits_through_the_cli_set_add_and_refill(metered, owner):
    runner = metered.test_cli_runner()
    created = runner.invoke(args=["keys", "create", "carol", "--name", "metered", "--type", "development",
                                  "--tier", "wide", "--credits", "2", "--refill", "100/month"])
    assert created.exit_code == 0, created.output
    secret = created.output.strip().splitlines()[-1]
    key = ApiKey.get(ApiKey.name == "metered")
    first_of_next_month = credits.next_refill_at("month")
    next_refill = first_of_next_month.strftime("%Y-%m-%dT00:00:00Z")
    assert created.output.strip().splitlines()[-3] == (
        f"Its credits: credits=2 refill=100/month next_refill={next_refill}.")
    shown = runner.invoke(args=["keys", "credits", str(key.id)])
    assert (shown.exit_code, shown.output) == (
        0, f"Key {key.id} ('metered'): credits=2 refill=100/month next_refill={next_refill}.\n")
    stats = get(metered, secret, STATS).get_json()
    assert stats["credits"] == {"remaining": 1, "refill": {
        "amount": 100, "interval": "month", "next_at": first_of_next_month.strftime("%Y-%m-%dT00:00:00.000Z")}}
    assert get(metered, secret).status_code == 200
    def until_refill():
        return (first_of_next_month - datetime.datetime.now(datetime.UTC).replace(tzinfo=None)).total_seconds()

    # Measured on both sides of the request, which may take a while on a loaded machine.
    longest = until_refill()
    refused = get(metered, secret)
    shortest = until_refill()
    assert refused.get_json()["error"]["code"] == "credits_exhausted"
    assert shortest - 2 <= int(refused.headers["Retry-After"]) <= longest + 2
    result = runner.invoke(args=["keys", "credits", str(key.id), "--add", "5"])
    assert result.exit_code == 0, result.output
    assert "credits=5 refill=100/month" in result.output
    assert get(metered, secret).headers["X-Credits-Remaining"] == "4"
    assert runner.invoke(args=["keys", "credits", str(key.id), "--set", "1", "--no-refill"]).exit_code == 0
    stats = get(metered, secret, STATS).get_json()
    assert stats["credits"] == {"remaining": 0, "refill": None}
    assert get(metered, secret).get_json()["error"]["code"] == "credits_exhausted"
    assert "Retry-After" not in get(metered, secret).headers
    assert [event.event for event in SecurityEvent.select().where(SecurityEvent.event == "key.credits_changed")] == [
        "key.credits_changed"] * 2


@pytest.mark.parametrize("command", [["credits", "--set", "7"], ["limit", "5/second"]])
def test_a_key_change_whose_security_event_fails_is_not_made(metered, owner, monkeypatch, command):
    """keys credits and keys limit: the change and its security event commit together or not at all."""
    key, _ = issue(owner, credits_given=3)

    def refuse(*args, **kwargs):
        raise OperationalError("disk I/O error")

    monkeypatch.setattr(securitylog, "record_in", refuse)
    result = metered.test_cli_runner().invoke(args=["keys", command[0], str(key.id), *command[1:]])
    assert result.exit_code == 1 and "The database cannot be used right now: disk I/O error" in result.output
    stored = ApiKey.get_by_id(key.id)
    assert (stored.credits_remaining, stored.rate_limits) == (3, None)


def test_the_cli_shows_the_credits_of_a_key_without_a_refill_or_without_credits(metered, owner):
    runner = metered.test_cli_runner()
    counted, _ = issue(owner, credits_given=3)
    plain, _ = issue(owner)
    assert runner.invoke(args=["keys", "credits", str(counted.id)]).output == (
        f"Key {counted.id} ({counted.name!r}): credits=3 refill=none.\n")
    assert runner.invoke(args=["keys", "credits", str(plain.id)]).output == (
        f"Key {plain.id} ({plain.name!r}) has no credits: only its windows limit it.\n")
    created = runner.invoke(args=["keys", "create", "carol", "--name", "plain", "--type", "development"])
    assert "credits" not in created.output


@pytest.mark.parametrize("args, message", [
    (["--refill", "5/day"], "Give either --set N or --add N."),
    (["--set", "1", "--add", "1"], "Give either --set N or --add N."),
    (["--set", "-1"], "--set must be a whole number"),
    (["--add", "x"], "--add must be a whole number"),
    (["--set", "1", "--refill", "5/week"], "A refill is a whole number"),
    (["--set", "1", "--refill", "5/day", "--no-refill"], "not both"),
])
def test_bad_credit_commands_are_refused_with_a_sentence(metered, owner, args, message):
    key, _ = issue(owner)
    result = metered.test_cli_runner().invoke(args=["keys", "credits", str(key.id), *args])
    assert result.exit_code != 0
    assert message in result.output
    assert ApiKey.get_by_id(key.id).credits_remaining is None


def spend_at(key, moment):
    try:
        return credits.spend(key, Note(None, None), now=moment)[0]
    except credits.CreditsExhausted as refusal:
        return refusal.retry_after


def test_a_daily_refill_sets_the_credits_once_a_day_however_often_and_late_it_is_read(metered, owner):
    day = datetime.datetime(2026, 11, 25)
    key, _ = issue(owner, credits_given=1, refill=(5, "day"))
    ApiKey.update(credits_refilled_for=day).where(ApiKey.id == key.id).execute()
    key = ApiKey.get_by_id(key.id)
    assert spend_at(key, day + datetime.timedelta(hours=23)) == 0
    # Exhausted: Retry-After counts the hour left until 00:00 UTC.
    assert spend_at(key, day + datetime.timedelta(hours=23)) == 3600
    midnight = day + datetime.timedelta(days=1)
    # Two processes at 00:00: the first applies the refill, the second spends from it.
    assert [spend_at(key, midnight), spend_at(key, midnight)] == [4, 3]
    # A process asleep at 00:00 three days later: set to 5, not 15, and not skipped.
    assert spend_at(key, midnight + datetime.timedelta(days=3, hours=5)) == 4
    assert credits.effective_remaining(ApiKey.get_by_id(key.id), midnight + datetime.timedelta(days=4)) == 5


def test_a_monthly_refill_comes_on_the_first(metered, owner):
    key, _ = issue(owner, credits_given=1, refill=(3, "month"))
    ApiKey.update(credits_refilled_for=datetime.datetime(2026, 11, 1)).where(ApiKey.id == key.id).execute()
    key = ApiKey.get_by_id(key.id)
    assert spend_at(key, datetime.datetime(2026, 11, 30, 12)) == 0
    assert spend_at(key, datetime.datetime(2026, 11, 30, 12)) == 12 * 3600
    assert spend_at(key, datetime.datetime(2026, 12, 1, 0, 0, 1)) == 2
    assert credits.next_refill_at("month", datetime.datetime(2026, 12, 31, 23)) == datetime.datetime(2027, 1, 1)


def test_set_during_a_due_refill_stands_until_the_next_one(metered, owner):
    key, _ = issue(owner, credits_given=0, refill=(50, "day"))
    ApiKey.update(credits_refilled_for=datetime.datetime(2026, 1, 1)).where(ApiKey.id == key.id).execute()
    credits.grant(key.id, set_to=2)
    key = ApiKey.get_by_id(key.id)
    assert spend_at(key, datetime.datetime.now(datetime.UTC).replace(tzinfo=None)) == 1


def test_a_refill_alone_starts_the_credits_at_its_amount(metered, owner):
    key, secret = issue(owner, refill=(7, "day"))
    assert get(metered, secret).headers["X-Credits-Remaining"] == "6"


@pytest.mark.parametrize("text", ["", " 5/Day ", "1/month"])
def test_refills_parse(text):
    assert credits.parse_refill(text) == {"": None, " 5/Day ": (5, "day"), "1/month": (1, "month")}[text]


@pytest.mark.parametrize("text", ["0/day", "5/week", "-1/day", "\u0661/day", "10000000000000/day"])
def test_a_refill_of_nothing_or_of_no_known_period_is_refused(text):
    with pytest.raises(ValueError, match="A refill is a whole number from 1"):
        credits.parse_refill(text)


@pytest.mark.parametrize("text", ["\u00b2", "\u0661\u0662", "1.5", "", "10000000000001"])
def test_credits_are_ascii_digits_only(text):
    with pytest.raises(ValueError, match="Credits must be a whole number from 0"):
        credits.parse_credits(text)


def test_a_window_refusal_of_a_key_with_credits_says_its_credits(metered, owner):
    _, secret = issue(owner, "multi", credits_given=100)
    answers = [get(metered, secret) for _ in range(4)]
    assert [answer.status_code for answer in answers] == [200, 200, 200, 429]
    assert [answer.headers["X-Credits-Remaining"] for answer in answers] == ["99", "98", "97", "97"]


def test_a_key_id_beyond_the_database_is_no_key(metered):
    result = metered.test_cli_runner().invoke(args=["keys", "credits", str(2**70), "--set", "1"])
    assert result.exit_code != 0 and "There is no API key with id" in result.output


def test_a_spend_that_finds_no_credit_gives_back_the_places_its_windows_counted(metered, owner):
    key, _ = issue(owner, "multi", credits_given=1)
    # Another process spent the last credit after this one read the key.
    found = ApiKey.get_by_id(key.id)
    found.has_credits = True
    ApiKey.update(credits_remaining=0).where(ApiKey.id == key.id).execute()
    note = Note(metered, None)
    with pytest.raises(credits.CreditsExhausted):
        metered.extensions["ratelimit"].count_request(found, note)
    assert [window_count(metered, key, policy) for policy in ("multi-second", "multi-minute", "account")] == [0, 0, 0]
    assert note.credits_remaining == 0


def test_a_place_given_back_announces_no_usage_threshold(metered, owner, monkeypatch):
    key, secret = issue(owner, "free", credits_given=2)
    assert [get(metered, secret).status_code for _ in range(2)] == [200, 200]
    # Read before its last credit went: the third place of free=3/minute, its 100 %, is given back.
    stale = ApiKey.get_by_id(key.id)
    stale.has_credits, stale.credits_remaining = True, 1
    deferred = metered.extensions["webhook_events"]
    deferred.take()
    with pytest.raises(credits.CreditsExhausted):
        metered.extensions["ratelimit"].count_request(stale, Note(metered, None))
    assert deferred.take() == []
    assert window_count(metered, key, "free") == 2


def test_a_key_known_to_have_no_credit_is_refused_before_its_windows_until_its_refill(metered, owner):
    day = datetime.datetime(2026, 11, 25, 12)
    key, _ = issue(owner, "multi", credits_given=1, refill=(5, "day"))
    ApiKey.update(credits_refilled_for=datetime.datetime(2026, 11, 25)).where(ApiKey.id == key.id).execute()
    found = ApiKey.get_by_id(key.id)
    assert credits.spend(found, Note(None, None), now=day) == (0, 1)
    # The kept key remembers it has none: no window is counted for it ...
    assert credits.has_none(found, now=day)
    # ... until the next day's refill is due.
    assert not credits.has_none(found, now=day + datetime.timedelta(days=1))


def test_a_window_refusal_of_a_key_without_credit_says_its_credits_are_exhausted(metered, owner):
    key, secret = issue(owner, "multi", credits_given=3)
    assert [get(metered, secret).status_code for _ in range(3)] == [200, 200, 200]
    refused = get(metered, secret)
    assert refused.get_json()["error"] == {"code": "credits_exhausted",
                                           "message": "This API key has no credits left."}
    assert refused.headers["X-Credits-Remaining"] == "0"
    # Read before its last credit went: the second's window, full, refuses it, and the credits
    # are what it waits for.
    stale = ApiKey.get_by_id(key.id)
    stale.has_credits, stale.credits_remaining = True, 1
    note = Note(metered, None)
    with pytest.raises(credits.CreditsExhausted):
        metered.extensions["ratelimit"].count_request(stale, note)
    assert note.credits_remaining == 0 and credits.has_none(stale)


def test_a_request_the_windows_refuse_keeps_its_credit(metered, owner):
    key, secret = issue(owner, "multi", credits_given=5)
    assert [get(metered, secret).status_code for _ in range(4)] == [200, 200, 200, 429]
    assert ApiKey.get_by_id(key.id).credits_remaining == 2

