"""A key's Edit form (web/keyedit.py) and `keys update`: the current values shown, a change in force
on the next request, only the roles that may roll a key editing it, and a narrowing role offered and
allowed only what narrows."""

import re

import pytest
from teams import ACTORS

from accounts import throttles
from models import ApiKey, SecurityEvent
from orgs import keyactions, roles


def edit_path(key):
    return f"/settings/security/keys/{key.id}/edit"


@pytest.fixture
def ci_key(user):
    key, secret = keyactions.issue_key(user, "CI", "production", "free", scopes=["test:read", "usage:read"],
                                       credits_given=100)
    return key, secret


def test_the_form_shows_the_key_as_it_is_and_a_change_takes_effect_on_the_next_request(logged_in, ci_key):
    key, secret = ci_key
    api = logged_in.application.test_client()
    assert api.get("/api/v1/protected/test", headers={"X-API-Key": secret}).status_code == 200
    form = logged_in.get(edit_path(key))
    assert form.status_code == 200
    assert 'value="CI"' in form.text and '<option value="free" selected>' in form.text
    assert re.search(r'value="test:read" checked>', form.text) and re.search(r'value="user:read">', form.text)
    assert "99 left." in form.text and "Keep: never" in form.text  # the request above spent one

    changed = logged_in.post(edit_path(key), data={"name": "CI runner", "tier": "pro", "scopes_shown": "1",
                                                    "scopes": ["usage:read"], "allow_ips": "", "expires_in": "7d",
                                                    "rates": "", "credits_set": "", "refill": ""})
    assert changed.status_code == 302 and changed.headers["Location"] == f"/settings/security/keys/{key.id}"
    page = logged_in.get(changed.headers["Location"]).text
    assert "Changed name, scopes, expiry and tier of “CI runner”. Its new limits apply from the next request." in page
    answer = api.get("/api/v1/protected/test", headers={"X-API-Key": secret})
    assert answer.status_code == 403 and answer.json["error"]["code"] == "insufficient_scope"
    row = ApiKey.get_by_id(key.id)
    assert (row.name, row.rate_limit_tier, row.credits_remaining, row.expires_at is not None) == (
        "CI runner", "pro", 99, True)
    assert SecurityEvent.get(SecurityEvent.event == "key.updated").user.username == "alice"


def test_a_form_that_sends_only_some_fields_changes_only_those(logged_in, ci_key):
    key, _ = ci_key
    assert logged_in.post(edit_path(key), data={"credits_add": "5"}).status_code == 302
    row = ApiKey.get_by_id(key.id)
    assert (row.name, row.scopes, row.credits_remaining) == ("CI", "test:read,usage:read", 105)
    assert "Nothing changed: “CI” already had these." in logged_in.post(
        edit_path(key), data={"name": "CI"}, follow_redirects=True).text


@pytest.mark.parametrize(("data", "message"), [
    ({"name": ""}, "A key name is 1 to 100 characters."),
    ({"scopes_shown": "1"}, "Choose at least one scope."),
    ({"scopes": ""}, "Choose at least one scope."),
    ({"allow_ips": "10.0.0.0/33"}, "is not an IP address or CIDR network"),
    ({"expires_in": "soon"}, "A duration is a number and a unit"),
    ({"tier": "gold"}, "Unknown rate limit tier"),
    ({"rates": "fast"}, "A key&#39;s limit must be a rate like"),
    ({"credits_set": "-1"}, "The credits to set must be a whole number"),
    ({"refill": "5/week"}, "A refill is a whole number"),
])
def test_a_bad_value_is_a_400_on_the_form_with_what_was_sent(logged_in, ci_key, data, message):
    key, _ = ci_key
    answer = logged_in.post(edit_path(key), data={"name": "Kept?", **data} if "name" not in data else data)
    assert answer.status_code == 400 and message in answer.text
    assert 'value="Kept?"' in answer.text or "name" in data
    assert ApiKey.get_by_id(key.id).name == "CI"


@pytest.mark.parametrize("role", list(ACTORS))
def test_each_role_edits_exactly_the_keys_it_may_roll(team, log_in, role):
    client = log_in(ACTORS[role])
    for owner, own in [(ACTORS[role], True), ("tess", False)]:
        key = team.keys[owner]
        allowed = roles.allows(role, roles.KEY_CHANGE, own_key=own)
        assert client.get(edit_path(key)).status_code == (200 if allowed else 403)
        assert client.post(edit_path(key), data={"name": f"renamed by {role}"}).status_code == (
            302 if allowed else 403)
        assert (ApiKey.get_by_id(key.id).name == f"renamed by {role}") == allowed
        assert (f'href="{edit_path(key)}"' in client.get(f"/settings/security/keys/{key.id}").text) == allowed
    assert client.get(edit_path(team.keys["gina"])).status_code == 404


def test_a_developer_is_offered_only_narrowing_and_refused_widening(team, log_in):
    client = log_in("dora")
    key = team.keys["dora"]
    keyactions.revoke_key(team.keys["olive"])
    ApiKey.update(scopes="test:read", rate_limit_tier="pro").where(ApiKey.id == key.id).execute()
    form = client.get(edit_path(key)).text
    assert "you may only narrow the key" in form
    assert re.search(r'value="usage:read" disabled>', form) and 'name="credits_add"' not in form
    assert 'name="rates"' not in form
    assert '<option value="free">free: 3 per 1 minute</option>' in form
    assert '<option value="pro" selected>pro: 100 per 1 minute (current)</option>' in form
    windows = client.post(edit_path(key), data={"rates": "1/minute"})
    assert windows.status_code == 403 and "this change would change its own windows" in windows.text
    refused = client.post(edit_path(key), data={"scopes": ["test:read", "usage:read"], "name": "Wider"})
    assert refused.status_code == 403
    assert "Only owners and admins may widen a key: this change would grant the scope usage:read." in refused.text
    assert client.post(edit_path(key), data={"tier": "free", "allow_ips": "192.0.2.1"}).status_code == 302
    row = ApiKey.get_by_id(key.id)
    assert (row.name, row.rate_limit_tier, row.allow_ips) == ("dora's key", "free", "192.0.2.1/32")
    assert '<option value="pro"' not in client.get(edit_path(key)).text


def test_a_revoked_or_expired_key_has_no_edit_form(logged_in, user, ci_key):
    key, _ = ci_key
    keyactions.revoke_key(key)
    assert logged_in.get(edit_path(key)).status_code == 404
    assert logged_in.post(edit_path(key), data={"name": "Back"}).status_code == 404
    assert f'href="{edit_path(key)}"' not in logged_in.get(f"/settings/security/keys/{key.id}").text


def test_keys_update_changes_the_named_fields_and_says_which(runner, ci_key):
    key, _ = ci_key
    result = runner.invoke(args=["keys", "update", str(key.id), "--name", "Nightly", "--scopes", "usage:read",
                                 "--expires-in", "30d", "--tier", "pro", "--allow-ips", "198.51.100.0/24"])
    assert result.exit_code == 0, result.output
    assert f"Changed name, scopes, allow_ips, expires_at, tier of key {key.id} ('Nightly')." in result.output
    row = ApiKey.get_by_id(key.id)
    assert (row.scopes, row.rate_limit_tier, row.allow_ips) == ("usage:read", "pro", "198.51.100.0/24")
    again = runner.invoke(args=["keys", "update", str(key.id), "--tier", "pro"])
    assert again.exit_code == 0 and "already has these; nothing changed" in again.output
    assert runner.invoke(args=["keys", "update", str(key.id), "--allow-ips", ""]).exit_code == 0
    assert ApiKey.get_by_id(key.id).allow_ips is None


@pytest.mark.parametrize(("args", "message"), [
    ([], "Name what to change"),
    (["--scopes", ","], "Name at least one scope."),
    (["--tier", "gold"], "Unknown rate limit tier 'gold'"),
    (["--expires-in", "0"], "A key's expiry must be in the future."),
])
def test_keys_update_refuses_with_a_sentence(runner, ci_key, args, message):
    key, _ = ci_key
    result = runner.invoke(args=["keys", "update", str(key.id), *args])
    assert result.exit_code == 1 and message in result.output


def test_keys_update_refuses_a_revoked_or_unknown_key(runner, ci_key):
    key, _ = ci_key
    keyactions.revoke_key(key)
    result = runner.invoke(args=["keys", "update", str(key.id), "--name", "Back"])
    assert result.exit_code == 1 and "'CI' is revoked; it cannot be changed." in result.output
    unknown = runner.invoke(args=["keys", "update", "999999", "--name", "x"])
    assert "There is no API key with id 999999" in unknown.output


def test_key_changes_are_throttled_per_account_with_a_429_that_says_when(logged_in, ci_key):
    key, _ = ci_key
    for number in range(throttles.KEY_CHANGES_PER_ACCOUNT.amount):
        assert logged_in.post(edit_path(key), data={"name": f"CI {number}"}).status_code == 302
    refused = logged_in.post(edit_path(key), data={"name": "One too many"})
    assert refused.status_code == 429 and "Too many key changes in the last hour; try again in" in refused.text
    assert ApiKey.get_by_id(key.id).name == f"CI {throttles.KEY_CHANGES_PER_ACCOUNT.amount - 1}"
