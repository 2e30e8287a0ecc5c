"""The key lifecycle with Flask's test client and the CLI runner, on SQLite and PostgreSQL:
checksummed secrets, expiry, scopes, roll with a grace period and leaked-key revocation."""

import datetime
import re
import zlib
from pathlib import Path

import pytest

import auth
import cli.keys
from accounts import securitylog, users
from keys import keycache, keyformat, lookup
from models import SCOPES, ApiKey, User, personal_organisation, utcnow
from orgs import keyactions

BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def base62_value(text):
    value = 0
    for character in text:
        value = value * 62 + BASE62.index(character)
    return value


def get(client, path, secret):
    return client.get(path, headers={"X-API-Key": secret})


@pytest.mark.parametrize("key_type", ["production", "development"])
def test_new_secrets_end_with_the_crc32_of_the_rest_in_base62(key_type):
    secret = keyformat.generate_secret(key_type)
    head, tail = secret[:-6], secret[-6:]
    assert len(head) == len(keyformat.KEY_PREFIXES[key_type]) + 32
    assert base62_value(tail) == zlib.crc32(head.encode())


def test_a_checksum_of_a_small_crc_is_padded_with_zeros():
    assert keyformat.checksum("") == "000000"  # CRC32 of nothing is 0
    assert len(keyformat.checksum("sk_live_x")) == 6


def test_a_bad_checksum_is_refused_without_a_lookup(client, api_key, monkeypatch):
    assert len(api_key) == keyformat.CHECKSUMMED_LENGTH
    looked_up = []
    monkeypatch.setattr(keycache, "find_active_key", lambda key_hash: looked_up.append(key_hash))
    broken = api_key[:-1] + ("A" if api_key[-1] != "A" else "B")
    response = get(client, "/api/v1/protected/test", broken)
    assert response.status_code == 401 and response.json["error"]["code"] == "invalid_api_key"
    assert looked_up == []


def test_keys_issued_before_checksums_keep_working(client, user):
    legacy = "sk_live_" + "L" * 40
    ApiKey.create(org=personal_organisation(user.id), user=user, name="Legacy", key_type="production",
                  display_prefix=legacy[:12], key_hash=keyformat.hash_key(legacy))
    assert get(client, "/api/v1/protected/test", legacy).json["api_key_name"] == "Legacy"


def test_an_expired_key_fails_like_any_invalid_key_and_is_not_counted(client, user):
    key, secret = keyactions.issue_key(user, "Short", "development", expires_in=3600)
    _, other = keyactions.issue_key(user, "Long", "development")
    assert get(client, "/api/v1/protected/test", secret).status_code == 200
    assert get(client, "/api/v1/user/me", other).json["api_key_count"] == 2
    ApiKey.update(expires_at=utcnow() - datetime.timedelta(seconds=1)).where(ApiKey.id == key.id).execute()
    response = get(client, "/api/v1/protected/test", secret)
    assert response.status_code == 401
    assert response.json["error"] == {"code": "invalid_api_key",
                                      "message": "The API key is malformed, unknown or revoked."}
    assert get(client, "/api/v1/user/me", other).json["api_key_count"] == 1
    assert lookup.secret_is_active(keyformat.hash_key(secret)) is False


@pytest.mark.parametrize("text, seconds", [("30d", 2592000), ("24h", 86400), ("90m", 5400), ("2s", 2),
                                           ("never", None), ("0", 0)])
def test_durations(text, seconds):
    assert keyactions.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["30", "1w", "-1d", "d", "soon", "9999999d"])
def test_bad_durations_get_a_sentence(text):
    with pytest.raises(ValueError, match="A duration is a number and a unit s, m, h or d"):
        keyactions.parse_duration(text)


@pytest.mark.parametrize("scope, path", [("test:read", "/api/v1/protected/test"), ("user:read", "/api/v1/user/me"),
                                         ("usage:read", "/api/v1/usage/stats")])
def test_a_key_without_the_scope_gets_403_and_is_not_counted(app, client, user, scope, path):
    others = [name for name in SCOPES if name != scope]
    key, restricted = keyactions.issue_key(user, "Restricted", "development", scopes=others)
    _, allowed = keyactions.issue_key(user, "Allowed", "development", scopes=[scope])
    response = get(client, path, restricted)
    assert response.status_code == 403
    assert response.json["error"] == {
        "code": "insufficient_scope",
        "message": f"This API key lacks the scope {scope!r}, which GET {path} needs.",
    }
    assert "X-RateLimit-Remaining" not in response.headers
    assert app.extensions["usage"].total(key.id) == 0
    assert get(client, path, allowed).status_code == 200
    assert get(client, "/api/v1/status", restricted).json["authenticated"] is True


def test_scopes_are_stored_only_when_restricted(user):
    full, _ = keyactions.issue_key(user, "Full", "development")
    assert full.scopes is None and ApiKey.get_by_id(full.id).scope_list() == list(SCOPES)
    some, _ = keyactions.issue_key(user, "Some", "development", scopes=["usage:read", "test:read"])
    assert ApiKey.get_by_id(some.id).scope_list() == ["test:read", "usage:read"]
    with pytest.raises(ValueError, match="Unknown scope 'admin'"):
        keyactions.issue_key(user, "Bad", "development", scopes=["admin"])


def test_a_roll_keeps_one_allowance_and_one_usage_for_both_secrets(app, client, user):
    key, old = keyactions.issue_key(user, "Rolled", "development")  # tier free: 3 a minute in tests
    assert get(client, "/api/v1/protected/test", old).status_code == 200
    new = keyactions.roll_key(ApiKey.get_by_id(key.id), 3600)
    assert new != old and len(new) == keyformat.CHECKSUMMED_LENGTH
    assert get(client, "/api/v1/protected/test", old).status_code == 200
    assert get(client, "/api/v1/protected/test", new).status_code == 200
    assert get(client, "/api/v1/protected/test", new).status_code == 429
    assert get(client, "/api/v1/protected/test", old).status_code == 429
    assert app.extensions["usage"].total(key.id) == 3
    stored = ApiKey.get_by_id(key.id)
    assert (stored.id, stored.name, stored.previous_display_prefix) == (key.id, "Rolled", old[:12])
    assert stored.display_prefix == new[:12]


def test_the_previous_secret_ends_with_its_grace_period_or_at_once(client, user):
    key, old = keyactions.issue_key(user, "Rolled", "production", tier="pro")
    new = keyactions.roll_key(ApiKey.get_by_id(key.id), 60)
    assert get(client, "/api/v1/protected/test", old).status_code == 200
    ApiKey.update(previous_expires_at=utcnow() - datetime.timedelta(seconds=1)).where(ApiKey.id == key.id).execute()
    assert get(client, "/api/v1/protected/test", old).status_code == 401
    newest = keyactions.roll_key(ApiKey.get_by_id(key.id), 0)
    assert get(client, "/api/v1/protected/test", new).status_code == 401
    assert get(client, "/api/v1/protected/test", newest).status_code == 200


def test_revoking_a_rolled_key_ends_both_secrets(client, user):
    key, old = keyactions.issue_key(user, "Rolled", "production", tier="pro")
    new = keyactions.roll_key(ApiKey.get_by_id(key.id), 3600)
    keyactions.revoke_key(ApiKey.get_by_id(key.id))
    assert get(client, "/api/v1/protected/test", old).status_code == 401
    assert get(client, "/api/v1/protected/test", new).status_code == 401


def test_whoever_holds_a_secret_can_revoke_it(client, user):
    _, secret = keyactions.issue_key(user, "Leaked", "production")
    response = client.post("/api/v1/keys/revoke", headers={"X-API-Key": secret})
    assert response.status_code == 200
    assert response.json == {"revoked": True, "api_key_name": "Leaked", "secret": "current"}
    assert response.headers["Cache-Control"] == "no-store"
    assert get(client, "/api/v1/protected/test", secret).status_code == 401
    again = client.post("/api/v1/keys/revoke", headers={"X-API-Key": secret})
    assert again.status_code == 401 and again.json["error"]["code"] == "invalid_api_key"
    assert client.post("/api/v1/keys/revoke").json["error"]["code"] == "missing_api_key"


def test_the_cli_creates_lists_and_rolls_keys_with_expiry_and_scopes(runner, user):
    result = runner.invoke(args=["keys", "create", "alice", "--name", "CLI", "--type", "production",
                                 "--expires-in", "30d", "--scopes", "test:read,time:stream"])
    assert result.exit_code == 0, result.output
    secret = result.output.strip().splitlines()[-1]
    key = auth.authenticate(secret)
    listed = runner.invoke(args=["keys", "list", "alice"]).output.strip().split("\t")
    assert listed[:6] == [str(key.id), "CLI", "production", f"{secret[:12]}...", "free", "active"]
    expiry = datetime.datetime.strptime(listed[6], "%Y-%m-%dT%H:%M:%SZ")
    assert abs(expiry - (utcnow() + datetime.timedelta(days=30))) < datetime.timedelta(minutes=1)
    assert listed[7] == "test:read,time:stream"
    rolled = runner.invoke(args=["keys", "roll", str(key.id), "--grace", "0"])
    assert rolled.exit_code == 0, rolled.output
    assert "the previous secret works no longer" in rolled.output
    new = rolled.output.strip().splitlines()[-1]
    assert auth.authenticate(new).id == key.id
    with pytest.raises(auth.ApiKeyError):
        auth.authenticate(secret)


@pytest.mark.parametrize("args, message", [
    (["--expires-in", "soon"], "A duration is a number and a unit"),
    (["--scopes", "test:read,admin"], "Unknown scope 'admin'"),
])
def test_the_cli_refuses_bad_expiry_and_scopes_with_a_sentence(runner, user, args, message):
    result = runner.invoke(args=["keys", "create", "alice", "--name", "x", "--type", "development", *args])
    assert result.exit_code == 1 and message in result.output


def test_rolling_a_revoked_key_is_refused(runner, user):
    key, _ = keyactions.issue_key(user, "Gone", "development")
    keyactions.revoke_key(key)
    result = runner.invoke(args=["keys", "roll", str(key.id)])
    assert result.exit_code == 1 and f"Key {key.id} is revoked; it cannot be rolled." in result.output


def security_tab(client):
    return client.get("/settings/security").get_data(as_text=True)


def test_the_web_form_creates_a_key_with_expiry_and_scopes(logged_in):
    response = logged_in.post("/settings/security/keys", data={
        "name": "Scoped", "type": "production", "expires_in": "7d", "scopes_shown": "1",
        "scopes": ["test:read", "time:stream"]})
    assert response.status_code == 302
    page = security_tab(logged_in)
    secret = re.search(r'id="new-secret"[^>]*>(sk_live_[A-Za-z0-9]+)<', page)[1]
    key = auth.authenticate(secret)
    assert key.scope_list() == ["test:read", "time:stream"]
    assert abs(key.expires_at - (utcnow() + datetime.timedelta(days=7))) < datetime.timedelta(minutes=1)
    row = security_tab(logged_in).split(f'id="key-{key.id}"', 1)[1].split("</tr>", 1)[0]
    assert '<span class="expiring">expires in 7 days</span>' in row
    key_page = logged_in.get(f"/settings/security/keys/{key.id}").get_data(as_text=True)
    assert "<code>test:read</code> <code>time:stream</code>" in key_page


def test_the_web_form_refuses_no_scope_at_all(logged_in):
    response = logged_in.post("/settings/security/keys", data={"name": "None", "type": "production",
                                                               "scopes_shown": "1"})
    assert response.status_code == 400 and "Choose at least one scope." in response.get_data(as_text=True)
    assert ApiKey.select().count() == 0


def test_rolling_in_the_web_application_shows_the_new_secret_once_and_the_previous_deadline(logged_in, user):
    key, old = keyactions.issue_key(user, "Web rolled", "production", tier="pro")
    response = logged_in.post(f"/settings/security/keys/{key.id}/roll", data={"grace": "1h"})
    assert response.status_code == 302
    page = security_tab(logged_in)
    assert "The new secret of “Web rolled”" in page
    new = re.search(r'id="new-secret"[^>]*>(sk_live_[A-Za-z0-9]+)<', page)[1]
    assert auth.authenticate(new).id == auth.authenticate(old).id == key.id
    page = security_tab(logged_in)
    assert new not in page
    until = ApiKey.get_by_id(key.id).previous_expires_at.strftime("%Y-%m-%d %H:%M")
    assert f"previous secret <code>{old[:12]}...</code> valid until\n" in page and f"{until} UTC" in page


@pytest.mark.parametrize("grace", ["forever", "never", ""])
def test_a_bad_grace_gets_a_sentence(logged_in, user, grace):
    key, _ = keyactions.issue_key(user, "Web rolled", "production")
    response = logged_in.post(f"/settings/security/keys/{key.id}/roll", data={"grace": grace})
    assert response.status_code == 400 and "A duration is a number and a unit" in response.get_data(as_text=True)


def test_another_users_key_cannot_be_rolled(logged_in):
    other = users.create_user("mallory", "m@example.com", "a long enough password")
    key, _ = keyactions.issue_key(other, "Theirs", "production")
    assert logged_in.post(f"/settings/security/keys/{key.id}/roll", data={"grace": "0"}).status_code == 404


def test_every_security_event_is_logged_without_secrets(app, client, runner):
    password = "correct horse battery"
    client.post("/signup", data={"username": "erin", "email": "erin@example.com", "password": password})
    client.post("/logout")
    client.post("/login", data={"username": "erin", "password": "not it"})
    client.post("/login", data={"username": "erin", "password": password})
    client.post("/settings/security/keys", data={"name": "Logged", "type": "production"})
    secret = re.search(r'id="new-secret"[^>]*>(sk_live_[A-Za-z0-9]+)<', security_tab(client))[1]
    key = auth.authenticate(secret)
    client.post(f"/settings/security/keys/{key.id}/roll", data={"grace": "0"})
    rolled = re.search(r'id="new-secret"[^>]*>(sk_live_[A-Za-z0-9]+)<', security_tab(client))[1]
    client.post(f"/settings/security/keys/{key.id}/revoke")
    _, leaked = keyactions.issue_key(User.get(User.username == "erin"), "Leaked", "development")
    client.post("/api/v1/keys/revoke", headers={"X-API-Key": leaked})
    client.post("/settings/profile/password", data={"current_password": password, "new_password": "a newer passphrase"})
    client.post("/settings/security/sessions/revoke")
    result = runner.invoke(args=["audit", "erin"])
    assert result.exit_code == 0
    events = [line.split("\t") for line in result.output.strip().splitlines()]
    assert [event[1] for event in reversed(events)] == [
        "user.signup", "user.login", "user.logout", "user.login_failed", "user.login", "key.created", "key.rolled",
        "key.revoked", "key.created", "key.revoked_as_leaked", "user.password_changed", "user.login",
        "user.sessions_revoked"]
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", event[0]) for event in events)
    assert {event[2] for event in events} == {"127.0.0.1", "cli"}
    for text in (secret, rolled, leaked, password, "a newer passphrase"):
        assert text not in result.output and text[8:] not in result.output
    assert secret[:12] in result.output  # the display prefix names the key


def test_the_security_tab_shows_the_newest_50_events(logged_in, user):
    for n in range(55):
        keyactions.revoke_key(keyactions.issue_key(user, f"k{n}", "development")[0])
    page = security_tab(logged_in)
    log = page.split('id="log-heading"', 1)[1]
    assert log.count("<tr><td") == 50
    assert "k54 (id" in log and "k0 (id" not in log


def test_keys_scan_reports_secrets_without_printing_them(runner, user, tmp_path):
    tmp_path = tmp_path / "project"
    tmp_path.mkdir()
    _, valid = keyactions.issue_key(user, "Found", "production")
    broken = valid[:-1] + ("A" if valid[-1] != "A" else "B")
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "settings.py").write_text(f'API_KEY = "{valid}"\n# and a typo: {broken}\n')
    (tmp_path / "notes.txt").write_text("nothing here\n")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "config").write_text(valid)
    result = runner.invoke(args=["keys", "scan", str(tmp_path)])
    assert result.exit_code == 1
    assert result.output.splitlines() == [
        f"{tmp_path}/app/settings.py:1: {valid[:12]}... checksum ok",
        f"{tmp_path}/app/settings.py:2: {broken[:12]}... checksum bad",
    ]
    assert valid[12:] not in result.output
    clean = runner.invoke(args=["keys", "scan", str(tmp_path / "notes.txt")])
    assert clean.exit_code == 0 and clean.output == ""
    typo_only = tmp_path / "typo.txt"
    typo_only.write_text(broken)
    assert runner.invoke(args=["keys", "scan", str(typo_only)]).exit_code == 0


def test_revoking_twice_at_once_records_one_event(user):
    key, _ = keyactions.issue_key(user, "Twice", "production")
    stale = ApiKey.get_by_id(key.id)
    keyactions.revoke_key(ApiKey.get_by_id(key.id))
    keyactions.revoke_key(stale)
    events = [event.event for event in securitylog.recent(user.id)]
    assert events.count("key.revoked") == 1


def test_a_roll_from_a_stale_read_is_refused(user):
    key, _ = keyactions.issue_key(user, "Stale", "production")
    stale = ApiKey.get_by_id(key.id)
    keyactions.roll_key(ApiKey.get_by_id(key.id), 3600)
    with pytest.raises(ValueError, match="The key was rolled or revoked meanwhile"):
        keyactions.roll_key(stale, 3600)


def test_a_long_client_address_is_cut_to_fit_the_log(app, user):
    with app.test_request_context(environ_base={"REMOTE_ADDR": "x" * 300}):
        securitylog.record(user.id, "user.logout")
    assert securitylog.recent(user.id)[0].ip == "x" * 64


def test_others_failed_log_ins_cannot_bury_the_log(client, user):
    for n in range(25):
        client.post("/login", data={"username": "alice", "password": "a guess"},
                    environ_base={"REMOTE_ADDR": f"10.3.0.{n}"})
    events = [event.event for event in securitylog.recent(user.id, limit=None)]
    assert events.count("user.login_failed") == securitylog.FAILURES_RECORDED_PER_HOUR


def test_keys_scan_reads_long_lines_in_pieces_and_ignores_lookalikes(runner, user, tmp_path, monkeypatch):
    monkeypatch.setattr(cli.keys, "SCAN_PIECE", 64)
    _, valid = keyactions.issue_key(user, "Found", "production")
    path = tmp_path / "bundle.min.js"
    lookalikes = "sk_live_short; sk_test_" + "A" * 38 + "; "
    path.write_text("first line\n" + "x = 1; " * 30 + f'k="{valid}"; ' + "y = 2; " * 30 + lookalikes + "\n")
    result = runner.invoke(args=["keys", "scan", str(path)])
    assert result.exit_code == 1
    assert result.output.splitlines() == [f"{path}:2: {valid[:12]}... checksum ok",
                                          f"{path}:2: sk_test_AAAA... checksum bad"]


def test_keys_scan_tells_an_unreadable_file_from_a_found_secret(runner, user):
    # A regular file that fails to read even for root (the tests' user here): its first bytes are
    # this process's unmapped page zero.
    path = Path("/proc/self/mem")
    result = runner.invoke(args=["keys", "scan", str(path)])
    assert result.exit_code == 2
    assert f"{path}: cannot be read: Input/output error" in result.stderr


def test_the_cli_refuses_an_empty_scope_list(runner, user):
    result = runner.invoke(args=["keys", "create", "alice", "--name", "x", "--type", "development", "--scopes", ""])
    assert result.exit_code == 1 and "Name at least one scope." in result.output
