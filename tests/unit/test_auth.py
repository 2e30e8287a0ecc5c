"""Keys and passwords: format, storage, authentication, revocation."""

import re

import pytest

import auth
from accounts import users
from keys import keyformat
from models import ApiKey, User
from orgs import keyactions


@pytest.mark.parametrize("key_type, prefix", [("development", "sk_test_"), ("production", "sk_live_")])
def test_issued_secret_has_the_contract_format(user, key_type, prefix):
    key, secret = keyactions.issue_key(user, "k", key_type)
    assert re.fullmatch(re.escape(prefix) + r"[A-Za-z0-9]{32,}", secret)
    assert key.key_type == key_type
    assert key.rate_limit_tier == "free"


def test_only_the_hash_and_a_display_prefix_are_stored(user):
    key, secret = keyactions.issue_key(user, "k", "production")
    stored = ApiKey.get_by_id(key.id)
    assert stored.key_hash == keyformat.hash_key(secret)
    assert stored.display_prefix == secret[:12]
    row = ApiKey.select().where(ApiKey.id == key.id).dicts().get()
    assert secret not in [str(value) for value in row.values()]


def test_secrets_differ(user):
    secrets = {keyactions.issue_key(user, f"k{i}", "development")[1] for i in range(20)}
    assert len(secrets) == 20


def test_authenticate_returns_the_key(user, api_key):
    key = auth.authenticate(api_key)
    assert (key.name, key.key_type, key.rate_limit_tier, key.user_id) == (
        "Alice dev", "development", "free", user.id)


@pytest.mark.parametrize("secret, code", [
    (None, "missing_api_key"),
    ("", "missing_api_key"),
    ("   ", "missing_api_key"),
    ("sk_test_short", "invalid_api_key"),
    ("pk_test_" + "a" * 40, "invalid_api_key"),
    ("sk_test_" + "a" * 40, "invalid_api_key"),
    ("sk_test_" + "é" * 40, "invalid_api_key"),
    ("sk_test_" + "a" * 39 + "\x00", "invalid_api_key"),
])
def test_authenticate_rejects(app, secret, code):
    with pytest.raises(auth.ApiKeyError) as raised:
        auth.authenticate(secret)
    assert raised.value.error_code == code
    assert raised.value.code == 401


def test_revoked_key_is_rejected_at_once(user, api_key):
    key = auth.authenticate(api_key)
    keyactions.revoke_key(ApiKey.get_by_id(key.id))
    with pytest.raises(auth.ApiKeyError) as raised:
        auth.authenticate(api_key)
    assert raised.value.error_code == "invalid_api_key"


@pytest.mark.parametrize("name, key_type, tier, message", [
    ("", "development", "free", "key name"),
    ("x" * 101, "development", "free", "key name"),
    ("k", "staging", "free", "development or production"),
    ("k", "development", "gold", "Unknown rate limit tier 'gold'"),
])
def test_issue_key_rejects_bad_input(user, name, key_type, tier, message):
    with pytest.raises(ValueError, match=message):
        keyactions.issue_key(user, name, key_type, tier)
    assert ApiKey.select().count() == 0


def test_passwords_are_hashed_with_a_kdf(user):
    stored = User.get_by_id(user.id)
    assert stored.password_hash.startswith("scrypt:")
    assert users.password_matches(stored, "correct horse battery")
    assert not users.password_matches(stored, "wrong")


@pytest.mark.parametrize("username, email, password, message", [
    ("al", "a@example.com", "long enough", "username"),
    ("bad name", "a@example.com", "long enough", "username"),
    ("bob", "not-an-email", "long enough", "email"),
    ("bob", "b@example.com", "short", "at least 8"),
    ("alice", "other@example.com", "long enough", "already taken"),
    ("bob", "ALICE@example.com", "long enough", "already belongs"),
])
def test_create_user_rejects(user, username, email, password, message):
    with pytest.raises(ValueError, match=message):
        users.create_user(username, email, password)
    assert User.select().count() == 1
