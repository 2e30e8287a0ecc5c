"""Passkey log-in against an attacker (Flask's client, SQLite and PostgreSQL), with a software
authenticator that signs real assertions: a replayed answer, a sign counter that goes back, no user
verification, another origin, another account's passkey at the second step."""

import re

import pyotp
import pytest
from softauthenticator import USER_PRESENT, SoftAuthenticator
from twofactorsteps import is_logged_in

from accounts import users
from accounts.models import Passkey
from app import load_config
from models import db

PASSWORD = "correct horse battery"


@pytest.fixture
def authenticator(user):
    """A passkey of alice's, registered."""
    soft = SoftAuthenticator()
    Passkey.create(user=user.id, name="Soft", credential_id=soft.credential_id, public_key=soft.public_key())
    return soft


def log_in_with(client, authenticator, path="/login/passkey", **shape):
    options = client.post(f"{path}/options").json
    return client.post(path, json={"credential": authenticator.assertion(options, **shape)})


def test_a_passkey_logs_in_alone(client, user, authenticator):
    response = log_in_with(client, authenticator, user_handle=str(user.id).encode())
    assert response.status_code == 200 and response.json == {"redirect": "/settings/profile"}
    assert is_logged_in(client)
    assert Passkey.get().sign_count == authenticator.count


def test_a_replayed_answer_is_refused(client, authenticator):
    options = client.post("/login/passkey/options").json
    answer = authenticator.assertion(options)
    assert client.post("/login/passkey", json={"credential": answer}).status_code == 200
    client.post("/logout")
    assert client.post("/login/passkey", json={"credential": answer}).status_code == 400
    client.post("/login/passkey/options")  # a new challenge does not make the old answer good
    assert client.post("/login/passkey", json={"credential": answer}).status_code == 400
    assert not is_logged_in(client)


def test_a_sign_counter_that_goes_back_is_refused(client, authenticator):
    assert log_in_with(client, authenticator, count=7).status_code == 200
    client.post("/logout")
    for count in (7, 3):
        response = log_in_with(client, authenticator, count=count)
        assert response.status_code == 400 and not is_logged_in(client)
    assert Passkey.get().sign_count == 7


def test_a_passkey_without_user_verification_is_refused(client, authenticator):
    assert log_in_with(client, authenticator, flags=USER_PRESENT).status_code == 400
    assert not is_logged_in(client)


def test_an_answer_made_for_another_origin_is_refused(client, authenticator):
    assert log_in_with(client, authenticator, origin="https://evil.example").status_code == 400
    assert not is_logged_in(client)


def test_a_user_handle_of_another_account_is_refused(client, authenticator):
    assert log_in_with(client, authenticator, user_handle=b"999").status_code == 400
    assert not is_logged_in(client)


def test_another_accounts_passkey_cannot_be_the_second_factor(client, logged_in, user, authenticator):
    page = logged_in.post("/settings/security/2fa/setup").get_data(as_text=True)
    secret = re.search(r'data-totp-secret="([A-Z2-7]+)"', page)[1]
    logged_in.post("/settings/security/2fa/enable", data={"code": pyotp.TOTP(secret).now()})
    logged_in.post("/logout")
    mallory = users.create_user("mallory", "mallory@example.com", "another long password")
    theirs = SoftAuthenticator()
    Passkey.create(user=mallory.id, name="Mallory's", credential_id=theirs.credential_id,
                   public_key=theirs.public_key())
    assert client.post("/login", data={"username": "alice", "password": PASSWORD}).headers["Location"] == "/login/2fa"
    assert log_in_with(client, theirs, "/login/2fa/passkey").status_code == 400
    assert not is_logged_in(client)
    assert log_in_with(client, authenticator, "/login/2fa/passkey").status_code == 200
    assert is_logged_in(client)


def test_the_second_step_by_passkey_needs_a_pending_log_in(client, authenticator):
    assert client.post("/login/2fa/passkey/options").status_code == 400
    assert client.post("/login/2fa/passkey", json={"credential": "{}"}).status_code == 400


def test_every_new_endpoint_needs_the_csrf_token(app, logged_in):
    app.config["WTF_CSRF_ENABLED"] = True
    for path in ("/settings/security/2fa/setup", "/settings/security/2fa/enable", "/settings/security/2fa/disable",
                 "/settings/security/passkeys/options", "/settings/security/passkeys", "/login/2fa",
                 "/login/passkey/options", "/login/passkey", "/login/2fa/passkey/options", "/login/2fa/passkey"):
        assert logged_in.post(path, json={}, headers={"Accept": "application/json"}).status_code == 400, path


def test_the_configured_relying_party_is_the_one_checked(app, client, user):
    assert load_config({"WEBAUTHN_RP_ID": "example.com", "WEBAUTHN_ORIGIN": "https://example.com"})[
        "WEBAUTHN_ORIGIN"] == "https://example.com"
    app.config.update(WEBAUTHN_RP_ID="example.com", WEBAUTHN_ORIGIN="https://example.com")
    soft = SoftAuthenticator()
    Passkey.create(user=user.id, name="Soft", credential_id=soft.credential_id, public_key=soft.public_key())
    assert client.post("/login/passkey/options").json["rpId"] == "example.com"
    assert log_in_with(client, soft).status_code == 400  # made for http://localhost
    assert log_in_with(client, soft, origin="https://example.com").status_code == 200


def test_an_account_deleted_in_the_database_leaves_no_passkey_or_second_factor_to_the_next(
        database_url, logged_in, user, authenticator):
    """Attacker's review: a passkey or an authenticator left behind by a deletion that bypassed the
    foreign keys (the sqlite3 shell's way) must not open, or lock, a new account given the same id:
    in a database whose newest account was deleted so before the upgrade to AUTOINCREMENT ids, the
    upgrade knows only the highest id left, and gives the deleted one again."""
    if not database_url.startswith("sqlite"):
        pytest.skip("PostgreSQL always enforces the foreign keys, and never reuses an id")
    logged_in.post("/settings/security/2fa/setup")
    db.execute_sql("PRAGMA foreign_keys = OFF")
    try:
        db.execute_sql("DELETE FROM users WHERE id = ?", (user.id,))
    finally:
        db.execute_sql("PRAGMA foreign_keys = ON")
    db.execute_sql("UPDATE sqlite_sequence SET seq = (SELECT coalesce(max(id), 0) FROM users) WHERE name = 'users'")
    bob = users.create_user("bob", "bob@example.com", "another long password")
    assert bob.id == user.id
    client = logged_in.application.test_client()
    assert log_in_with(client, authenticator).status_code == 400
    assert client.post("/login", data={"username": "bob", "password": "another long password"}).headers[
        "Location"] == "/settings/profile"


@pytest.mark.parametrize("raw_id", ["a\x00b", "x" * 2000, "é"])
def test_a_credential_id_that_cannot_be_one_is_a_400(client, logged_in, authenticator, raw_id):
    """Attacker's review: the id goes into a query; NUL made PostgreSQL fail with a 500."""
    client.post("/login/passkey/options")
    credential = authenticator.assertion(client.post("/login/passkey/options").json)
    forged = credential.replace(authenticator.credential_id, raw_id.replace("\x00", "\\u0000"))
    response = client.post("/login/passkey", json={"credential": forged})
    assert response.status_code == 400 and response.json["error"]["code"] == "invalid_request"


@pytest.mark.parametrize("name", [5, None, ["Laptop"], "", "a\x00b", "x" * 65])
def test_a_passkey_name_that_cannot_be_one_is_a_400(logged_in, name):
    logged_in.post("/settings/security/passkeys/options", json={})
    response = logged_in.post("/settings/security/passkeys", json={"name": name, "credential": "{}"})
    assert response.status_code == 400 and set(response.json["error"]) == {"code", "message"}
