"""Keys, accounts and logs at their edges, with Flask's client, the CLI runner and the modules, on
SQLite and PostgreSQL: rolls limited and refused with a sentence on a race, a stale page or a running
grace period; a rolled-out secret revokes only itself; the security log bounded at every write;
no 500 when an account is deleted mid-request; log lines that cannot be forged; `keys scan` after
escapes; IPv6 clients limited by their /64. Live counterparts: tests/live/test_edges.py."""

import logging
import re

import pytest
from flask import g, request
from limits import RateLimitItemPerHour
from webforms import page

import auth
from accounts import securitylog, sessions, throttles, users
from keys import keycache
from models import ApiKey, SecurityEvent, User
from ops import clientaddress, logs
from orgs import keyactions


def flashed(response):
    return re.findall(r'class="flash[^"]*"[^>]*>\s*([^<]+?)\s*<', page(response))


def roll(client, key, **form):
    g.pop("csrf_token", None)
    return client.post(f"/settings/security/keys/{key.id}/roll", data={"grace": "0", **form})


def test_the_31st_roll_in_an_hour_is_refused_with_a_sentence(logged_in, user):
    key, _ = keyactions.issue_key(user, "Rolled often", "production")
    for _ in range(30):
        assert roll(logged_in, key).status_code == 302
    refused = roll(logged_in, key)
    assert refused.status_code == 429
    assert re.search(r"Too many keys rolled in the last hour; try again in \d+ minutes\.", page(refused))


def test_refused_rolls_count_too(logged_in, user, monkeypatch):
    monkeypatch.setattr(throttles, "KEY_ROLLS_PER_ACCOUNT", RateLimitItemPerHour(2))
    key, _ = keyactions.issue_key(user, "Stale", "production")
    assert roll(logged_in, key, current="sk_live_XXXX").status_code == 409
    assert roll(logged_in, key, current="sk_live_YYYY").status_code == 409
    assert roll(logged_in, key).status_code == 429


def test_a_roll_from_a_page_showing_another_secret_is_refused(logged_in, user):
    key, secret = keyactions.issue_key(user, "Twice", "production")
    assert roll(logged_in, key, current=secret[:12]).status_code == 302
    again = roll(logged_in, key, current=secret[:12])  # the same page, submitted again
    assert again.status_code == 409
    now = ApiKey.get_by_id(key.id).display_prefix
    assert (f"The page showed the secret {secret[:12]}... of &#39;Twice&#39;, but its secret is now {now}...: it was "
            "rolled since. Reload and try again.") in page(again)


def test_the_roll_form_carries_the_current_prefix(logged_in, user):
    key, secret = keyactions.issue_key(user, "Shown", "production")
    html = page(logged_in.get("/settings/security"))
    assert f'<input type="hidden" name="current" value="{secret[:12]}">' in html


def test_a_roll_that_lost_a_race_is_a_conflict_not_a_500(user):
    key, _ = keyactions.issue_key(user, "Raced", "production")
    read_by_both = ApiKey.get_by_id(key.id)
    keyactions.roll_key(read_by_both, 0)
    with pytest.raises(keyactions.RollConflict, match="rolled or revoked meanwhile"):
        keyactions.roll_key(read_by_both, 0)
    keyactions.revoke_key(ApiKey.get_by_id(key.id))
    with pytest.raises(keyactions.RollConflict, match="rolled or revoked meanwhile"):
        keyactions.roll_key(ApiKey.get_by_id(key.id), 0)


def test_a_roll_during_a_grace_period_needs_confirming(app, client, logged_in, user):
    key, first = keyactions.issue_key(user, "Graced", "production", tier="pro")
    assert roll(logged_in, key, grace="7d").status_code == 302
    second_prefix = ApiKey.get_by_id(key.id).display_prefix
    refused = roll(logged_in, key, current=second_prefix)
    assert refused.status_code == 409
    until = ApiKey.get_by_id(key.id).previous_expires_at.strftime("%Y-%m-%d %H:%M:%S UTC")
    assert (f"&#39;Graced&#39; still has a previous secret, {first[:12]}..., which works until {until}; rolling "
            "again ends it now. Tick “End the previous secret now” to confirm.") in page(refused)
    assert 'name="end_previous" value="1"' in page(logged_in.get("/settings/security"))
    assert client.get("/api/v1/protected/test", headers={"X-API-Key": first}).status_code == 200
    assert roll(logged_in, key, current=second_prefix, end_previous="1").status_code == 302
    assert client.get("/api/v1/protected/test", headers={"X-API-Key": first}).status_code == 401


def test_the_cli_refuses_a_roll_during_a_grace_period_unless_told_to_end_it(runner, user):
    key, first = keyactions.issue_key(user, "CLI graced", "production")
    assert runner.invoke(args=["keys", "roll", str(key.id), "--grace", "7d"]).exit_code == 0
    refused = runner.invoke(args=["keys", "roll", str(key.id)])
    assert refused.exit_code == 1
    assert f"still has a previous secret, {first[:12]}..., which works until" in refused.output
    assert "Add --end-previous to confirm." in refused.output
    confirmed = runner.invoke(args=["keys", "roll", str(key.id), "--end-previous"])
    assert confirmed.exit_code == 0, confirmed.output
    assert auth.authenticate(confirmed.output.strip().splitlines()[-1]).id == key.id
    with pytest.raises(auth.ApiKeyError):
        auth.authenticate(first)


def test_a_rolled_out_secret_revokes_only_itself(client, user):
    key, old = keyactions.issue_key(user, "Handed over", "production", tier="pro")
    new = keyactions.roll_key(ApiKey.get_by_id(key.id), 3600)
    response = client.post("/api/v1/keys/revoke", headers={"X-API-Key": old})
    assert response.status_code == 200
    assert response.json == {"revoked": True, "api_key_name": "Handed over", "secret": "previous"}
    assert client.get("/api/v1/protected/test", headers={"X-API-Key": old}).status_code == 401
    assert client.get("/api/v1/protected/test", headers={"X-API-Key": new}).status_code == 200
    stored = ApiKey.get_by_id(key.id)
    assert stored.revoked_at is None and stored.previous_key_hash is None
    assert securitylog.recent(user.id)[0].event == "key.previous_secret_revoked"
    current = client.post("/api/v1/keys/revoke", headers={"X-API-Key": new})
    assert current.json == {"revoked": True, "api_key_name": "Handed over", "secret": "current"}
    assert client.get("/api/v1/protected/test", headers={"X-API-Key": new}).status_code == 401


def test_the_security_log_keeps_its_newest_events_at_every_write(user, monkeypatch):
    monkeypatch.setattr(securitylog, "KEPT", 5)
    key, _ = keyactions.issue_key(user, "Busy", "production")
    for _ in range(8):
        keyactions.roll_key(ApiKey.get_by_id(key.id), 0)
        assert SecurityEvent.select().where(SecurityEvent.org == key.org_id).count() <= 5
    events = securitylog.recent_in(key.org_id, limit=None)
    assert [event.event for event in events] == ["key.rolled"] * 5
    assert events[0].id == max(event.id for event in SecurityEvent.select())


def delete_after_counting(monkeypatch, app, user):
    """Delete the account right after a request was admitted and counted, before its view reads."""
    limiter = app.extensions["ratelimit"]
    count = limiter.count_request

    def count_then_delete(key, environ, generation=None):
        state = count(key, environ, generation)
        with users.db.atomic():
            ApiKey.delete().where(ApiKey.user == user.id).execute()
            User.delete().where(User.id == user.id).execute()
        return state

    monkeypatch.setattr(limiter, "count_request", count_then_delete)


@pytest.mark.parametrize("path", ["/api/v1/user/me", "/api/v1/usage/stats"])
def test_an_account_deleted_mid_request_is_a_401_not_a_500(app, client, user, pro_key, monkeypatch, path):
    delete_after_counting(monkeypatch, app, user)
    response = client.get(path, headers={"X-API-Key": pro_key})
    assert response.status_code == 401
    assert response.json["error"]["code"] == "invalid_api_key"


def test_an_account_deleted_while_its_page_creates_a_key_logs_the_browser_out(logged_in, user, monkeypatch):
    def delete_account_first(user_then):
        with users.db.atomic():
            User.delete().where(User.id == user.id).execute()

    monkeypatch.setattr(throttles, "count_key_creation", delete_account_first)
    response = logged_in.post("/settings/security/keys", data={"name": "Late", "type": "production"})
    assert response.status_code == 302 and response.headers["Location"] == "/login"
    assert ApiKey.select().count() == 0


def test_an_account_deleted_meanwhile_cannot_sign_out_everywhere_or_change_its_password(user):
    User.delete().where(User.id == user.id).execute()
    with pytest.raises(users.AccountGone):
        sessions.end_all_sessions(user)
    with pytest.raises(users.AccountGone):
        users.change_password(user, "correct horse battery", "another long password")


def test_log_messages_escape_control_characters_in_what_they_quote():
    path = '/a\n1.2.3.4 "GET /admin" 200\\'
    record = logging.LogRecord("app", logging.ERROR, __file__, 1, "Unhandled error on %s %s", ("GET", path), None)
    logs.RedactSecrets().filter(record)
    assert record.getMessage() == 'Unhandled error on GET /a\\x0a1.2.3.4 "GET /admin" 200\\\\'
    assert logs.escape_controls("tab\there\x1b[31m\x85") == "tab\\x09here\\x1b[31m\\x85"


@pytest.mark.parametrize("before", ["\\n", "\\t", "\\r", '\\"', "\\u0022", "%3D", "%20", "_", "=", "'", "\\x3d",
                                    "\\047", "%253D", "=3D", "\x1b[32m", "mask_"])
def test_keys_scan_finds_a_secret_after_any_escape(runner, user, tmp_path, before):
    _, secret = keyactions.issue_key(user, "Escaped", "production")
    path = tmp_path / "config.json"
    path.write_text(f'{{"env": "KEY{before}{secret}"}}\n')
    result = runner.invoke(args=["keys", "scan", str(path)])
    assert result.exit_code == 1
    assert result.output.splitlines() == [f"{path}:1: {secret[:12]}... checksum ok"]


@pytest.mark.parametrize("address, identity", [
    ("192.0.2.7", "192.0.2.7"),
    ("2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"),
    ("2001:db8:1:2::9", "2001:db8:1:2::/64"),
    ("::ffff:192.0.2.7", "192.0.2.7"),
])
def test_per_ip_limits_name_an_ipv6_client_by_its_64(address, identity):
    assert clientaddress.client_identity(address) == identity


def test_addresses_of_one_ipv6_64_share_the_public_allowance(client):
    # The fixture's PUBLIC_RATE_LIMIT is 5/minute.
    for n in range(5):
        assert client.get("/api/v1/status", environ_base={"REMOTE_ADDR": f"2001:db8:7:7::{n + 1}"}).status_code == 200
    assert client.get("/api/v1/status", environ_base={"REMOTE_ADDR": "2001:db8:7:7:ffff::1"}).status_code == 429
    assert client.get("/api/v1/status", environ_base={"REMOTE_ADDR": "2001:db8:7:8::1"}).status_code == 200


def test_an_account_keeps_its_newest_inactive_keys_and_every_active_one(user, monkeypatch):
    monkeypatch.setattr(keyactions, "MAX_INACTIVE_KEYS_KEPT", 3)
    active, _ = keyactions.issue_key(user, "Kept", "production")
    revoked = []
    for n in range(5):
        key, _ = keyactions.issue_key(user, f"Gone {n}", "production")
        keyactions.revoke_key(key)
        revoked.append(key.id)
    keyactions.issue_key(user, "Newest", "production")
    remaining = {key.id for key in ApiKey.select().where(ApiKey.user == user.id)}
    assert active.id in remaining and revoked[-3:] == [key_id for key_id in revoked if key_id in remaining]
    assert len(remaining) == 5


def test_revoking_with_a_secret_that_a_roll_made_previous_meanwhile_ends_only_that_secret(client, user, monkeypatch):
    key, old = keyactions.issue_key(user, "Raced revoke", "production", tier="pro")
    authenticate, rolled = auth.authenticate, []

    def authenticate_then_roll(secret, *args):
        found = authenticate(secret, *args)
        if not rolled:  # the owner rolls between the lookup and the revocation
            rolled.append(keyactions.roll_key(ApiKey.get_by_id(key.id), 3600))
        return found

    monkeypatch.setattr(auth, "authenticate", authenticate_then_roll)
    response = client.post("/api/v1/keys/revoke", headers={"X-API-Key": old})
    assert response.json == {"revoked": True, "api_key_name": "Raced revoke", "secret": "previous"}
    assert client.get("/api/v1/protected/test", headers={"X-API-Key": rolled[0]}).status_code == 200


def test_revoking_a_revoked_key_again_in_the_web_application_announces_nothing(logged_in, user, monkeypatch):
    key, _ = keyactions.issue_key(user, "Twice revoked", "production")
    announced = []
    monkeypatch.setattr(keycache, "announce_change", lambda *keys: announced.append([key.id for key in keys]))
    assert logged_in.post(f"/settings/security/keys/{key.id}/revoke").status_code == 302
    assert logged_in.post(f"/settings/security/keys/{key.id}/revoke").status_code == 302
    assert announced == [[key.id]]


def test_the_cli_announces_a_revocation_again(runner, user, monkeypatch):
    key, _ = keyactions.issue_key(user, "CLI twice", "production")
    announced = []
    monkeypatch.setattr(keycache, "announce_change", lambda *keys: announced.append([key.id for key in keys]))
    runner.invoke(args=["keys", "revoke", str(key.id)])
    assert "already revoked" in runner.invoke(args=["keys", "revoke", str(key.id)]).output
    assert announced == [[key.id], [key.id]]


@pytest.mark.parametrize("forwarded, seen", [
    ("192.0.2.8", "192.0.2.8"),
    ("192.0.2.8:4711", "192.0.2.8"),
    ("[2001:db8::8]:4711", "2001:db8::8"),
    ('9.9.9.9\tkey.revoked\t\x85FORGED', "127.0.0.1"),
    ('a" 200 - "b', "127.0.0.1"),
])
def test_a_forwarded_client_address_is_kept_only_when_it_is_an_address(database_url, make_app, forwarded, seen):
    app = make_app({"DATABASE_URL": database_url, "TRUSTED_PROXIES": 1, "TESTING": True})
    app.add_url_rule("/whoami", "whoami", lambda: request.remote_addr)
    response = app.test_client().get("/whoami", headers={"X-Forwarded-For": forwarded})
    assert response.get_data(as_text=True) == seen


@pytest.mark.parametrize("address, identity", [
    ("192.0.2.7:4711", "192.0.2.7"),
    ("[2001:db8:1:2::9]:4711", "2001:db8:1:2::/64"),
    ("2002:c000:0204::1", "192.0.2.4"),
    ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "192.0.2.45"),
    ("garbage", clientaddress.UNPARSABLE_ADDRESS),
    ("other garbage", clientaddress.UNPARSABLE_ADDRESS),
])
def test_per_ip_limits_read_ports_brackets_and_tunnels(address, identity):
    assert clientaddress.client_identity(address) == identity


def test_keys_scan_reads_utf16_files_and_keys_glued_to_what_follows(runner, user, tmp_path):
    _, secret = keyactions.issue_key(user, "PowerShell", "production")
    exported = tmp_path / "env.txt"
    exported.write_text(f"API_KEY={secret}\r\n", encoding="utf-16")  # with its byte order mark
    glued = tmp_path / "glued.txt"
    glued.write_text(f"token:{secret}ENDOFTOKEN\n")
    result = runner.invoke(args=["keys", "scan", str(exported), str(glued)])
    assert result.exit_code == 1
    assert result.output.splitlines() == [f"{exported}:1: {secret[:12]}... checksum ok",
                                          f"{glued}:1: {secret[:12]}... checksum ok"]
