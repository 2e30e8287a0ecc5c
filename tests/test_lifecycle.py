"""The key lifecycle with Flask's test client and the CLI runner, on SQLite and PostgreSQL:
checksummed secrets, expiry, scopes, roll with a grace period and leaked-key revocation."""

import datetime
import zlib

import pytest

import auth
import models
from models import SCOPES, ApiKey, utcnow

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
    secret = auth.generate_secret(key_type)
    head, tail = secret[:-6], secret[-6:]
    assert len(head) == len(auth.KEY_PREFIXES[key_type]) + 32
    assert base62_value(tail) == zlib.crc32(head.encode())


def test_a_checksum_of_a_small_crc_is_padded_with_zeros():
    assert auth.checksum("") == "000000"  # CRC32 of nothing is 0
    assert len(auth.checksum("sk_live_x")) == 6


def test_a_bad_checksum_is_refused_without_a_lookup(client, api_key, monkeypatch):
    assert len(api_key) == auth.CHECKSUMMED_LENGTH
    looked_up = []
    monkeypatch.setattr(auth, "find_active_key", lambda key_hash: looked_up.append(key_hash))
    broken = api_key[:-1] + ("A" if api_key[-1] != "A" else "B")
    response = get(client, "/api/v1/protected/test", broken)
    assert response.status_code == 401 and response.json["error"]["code"] == "invalid_api_key"
    assert looked_up == []


def test_keys_issued_before_checksums_keep_working(client, user):
    legacy = "sk_live_" + "L" * 40
    ApiKey.create(user=user, name="Legacy", key_type="production", display_prefix=legacy[:12],
                  key_hash=auth.hash_key(legacy))
    assert get(client, "/api/v1/protected/test", legacy).json["api_key_name"] == "Legacy"


def test_an_expired_key_fails_like_any_invalid_key_and_is_not_counted(client, user):
    key, secret = auth.issue_key(user, "Short", "development", expires_in=3600)
    _, other = auth.issue_key(user, "Long", "development")
    assert get(client, "/api/v1/protected/test", secret).status_code == 200
    assert get(client, "/api/v1/user/me", other).json["api_key_count"] == 2
    ApiKey.update(expires_at=utcnow() - datetime.timedelta(seconds=1)).where(ApiKey.id == key.id).execute()
    response = get(client, "/api/v1/protected/test", secret)
    assert response.status_code == 401
    assert response.json["error"] == {"code": "invalid_api_key", "message": "The API key is malformed, unknown or revoked."}
    assert get(client, "/api/v1/user/me", other).json["api_key_count"] == 1
    assert models.key_is_active(key.id) is False


@pytest.mark.parametrize("text, seconds", [("30d", 2592000), ("24h", 86400), ("90m", 5400), ("2s", 2),
                                           ("never", None), ("0", 0)])
def test_durations(text, seconds):
    assert auth.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["30", "1w", "-1d", "d", "soon", "9999999d"])
def test_bad_durations_get_a_sentence(text):
    with pytest.raises(ValueError, match="A duration is a number and a unit s, m, h or d"):
        auth.parse_duration(text)


@pytest.mark.parametrize("scope, path", [("test:read", "/api/v1/protected/test"), ("user:read", "/api/v1/user/me"),
                                         ("usage:read", "/api/v1/usage/stats")])
def test_a_key_without_the_scope_gets_403_and_is_not_counted(app, client, user, scope, path):
    others = [name for name in SCOPES if name != scope]
    key, restricted = auth.issue_key(user, "Restricted", "development", scopes=others)
    _, allowed = auth.issue_key(user, "Allowed", "development", scopes=[scope])
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
    full, _ = auth.issue_key(user, "Full", "development")
    assert full.scopes is None and ApiKey.get_by_id(full.id).scope_list() == list(SCOPES)
    some, _ = auth.issue_key(user, "Some", "development", scopes=["usage:read", "test:read"])
    assert ApiKey.get_by_id(some.id).scope_list() == ["test:read", "usage:read"]
    with pytest.raises(ValueError, match="Unknown scope 'admin'"):
        auth.issue_key(user, "Bad", "development", scopes=["admin"])


def test_a_roll_keeps_one_allowance_and_one_usage_for_both_secrets(app, client, user):
    key, old = auth.issue_key(user, "Rolled", "development")  # tier free: 3 a minute in tests
    assert get(client, "/api/v1/protected/test", old).status_code == 200
    new = auth.roll_key(ApiKey.get_by_id(key.id), 3600)
    assert new != old and len(new) == auth.CHECKSUMMED_LENGTH
    assert get(client, "/api/v1/protected/test", old).status_code == 200
    assert get(client, "/api/v1/protected/test", new).status_code == 200
    assert get(client, "/api/v1/protected/test", new).status_code == 429
    assert get(client, "/api/v1/protected/test", old).status_code == 429
    assert app.extensions["usage"].total(key.id) == 3
    stored = ApiKey.get_by_id(key.id)
    assert (stored.id, stored.name, stored.previous_display_prefix) == (key.id, "Rolled", old[:12])
    assert stored.display_prefix == new[:12]


def test_the_previous_secret_ends_with_its_grace_period_or_at_once(client, user):
    key, old = auth.issue_key(user, "Rolled", "production", tier="pro")
    new = auth.roll_key(ApiKey.get_by_id(key.id), 60)
    assert get(client, "/api/v1/protected/test", old).status_code == 200
    ApiKey.update(previous_expires_at=utcnow() - datetime.timedelta(seconds=1)).where(ApiKey.id == key.id).execute()
    assert get(client, "/api/v1/protected/test", old).status_code == 401
    newest = auth.roll_key(ApiKey.get_by_id(key.id), 0)
    assert get(client, "/api/v1/protected/test", new).status_code == 401
    assert get(client, "/api/v1/protected/test", newest).status_code == 200


def test_revoking_a_rolled_key_ends_both_secrets(client, user):
    key, old = auth.issue_key(user, "Rolled", "production", tier="pro")
    new = auth.roll_key(ApiKey.get_by_id(key.id), 3600)
    auth.revoke_key(ApiKey.get_by_id(key.id))
    assert get(client, "/api/v1/protected/test", old).status_code == 401
    assert get(client, "/api/v1/protected/test", new).status_code == 401


def test_whoever_holds_a_secret_can_revoke_it(client, user):
    _, secret = auth.issue_key(user, "Leaked", "production")
    response = client.post("/api/v1/keys/revoke", headers={"X-API-Key": secret})
    assert response.status_code == 200
    assert response.json == {"revoked": True, "api_key_name": "Leaked"}
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
    key, _ = auth.issue_key(user, "Gone", "development")
    auth.revoke_key(key)
    result = runner.invoke(args=["keys", "roll", str(key.id)])
    assert result.exit_code == 1 and f"Key {key.id} is revoked; it cannot be rolled." in result.output
