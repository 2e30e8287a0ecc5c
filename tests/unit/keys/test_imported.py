"""keys/imported.py through requests: an imported key of each scheme opens the API from the next
request, a slow hash is checked once and rehashed, failed checks are bounded per lookup prefix
without telling a known prefix from an unknown one, and a secret of no known form costs no read."""

import hashlib
import logging
import time

import pytest
from appconfig import APP_SETTINGS
from importfiles import argon2id_line, bcrypt_line, jsonl, made_secret, sha256_base64, sha256_hex
from limits import RateLimitItemPerMinute

from accounts import users
from keys import imported
from keys.models import AWAITING_FIRST_USE, ImportedKey
from models import ApiKey
from orgs import keyactions, keyimports

PROTECTED = "/api/v1/protected/test"
LINES = {"sha256-hex": (sha256_hex, "acme_live_"), "sha256-base64": (sha256_base64, "acme_live_"),
         "bcrypt": (bcrypt_line, "rails_tok_"), "argon2id": (argon2id_line, "argon_tok_")}


@pytest.fixture
def import_key(app, user):
    """import_key(scheme, secret=None, **fields) -> (the secret, its ApiKey), imported into alice's organisation."""
    org_id = users.personal_organisation_id(user)

    def make(scheme, secret=None, **fields):
        line, start = LINES[scheme]
        secret = secret or made_secret(start)
        [outcome] = keyimports.import_keys(org_id, jsonl(line(secret, **fields)))
        assert outcome.refused is None, outcome.refused
        return secret, ApiKey.get_by_id(outcome.key_id)

    return make


@pytest.fixture
def checks(monkeypatch):
    """The slow checks made, as (scheme, whether the secret matched)."""
    made = []
    matches = imported.matches

    def counted(scheme, slow_hash, secret):
        made.append((scheme, matches(scheme, slow_hash, secret)))
        return made[-1][1]

    monkeypatch.setattr(imported, "matches", counted)
    return made


def get(client, secret):
    return client.get(PROTECTED, headers={"X-API-Key": secret})


@pytest.mark.parametrize("scheme", LINES)
def test_an_imported_key_of_each_scheme_opens_the_api_from_the_next_request(client, import_key, checks, scheme):
    secret, key = import_key(scheme)
    for _ in range(2):
        response = get(client, secret)
        assert response.status_code == 200, response.text
        assert response.json["api_key_name"] == key.name
    row = ImportedKey.get_by_id(key.id)
    assert ApiKey.get_by_id(key.id).key_hash == hashlib.sha256(secret.encode()).hexdigest()
    assert row.slow_hash is None
    slow = scheme in ("bcrypt", "argon2id")
    assert checks == ([(scheme, True)] if slow else [])
    assert (row.rehashed_at is not None) == slow


def test_a_bcrypt_secret_longer_than_bcrypt_reads_is_checked_as_its_first_72_bytes(client, import_key):
    secret = made_secret("rails_tok_") + "x" * 100
    _, key = import_key("bcrypt", secret=secret)
    assert get(client, secret[:60] + "?" + secret[61:]).status_code == 401
    assert get(client, secret).status_code == 200
    assert ApiKey.get_by_id(key.id).key_hash == hashlib.sha256(secret.encode()).hexdigest()


def test_a_slow_key_is_rehashed_once_when_two_checks_pass(import_key):
    secret, key = import_key("bcrypt")
    imported.rehash(key.id, key.key_hash, hashlib.sha256(secret.encode()).hexdigest())
    rehashed_at = ImportedKey.get_by_id(key.id).rehashed_at
    imported.rehash(key.id, key.key_hash, hashlib.sha256(b"another").hexdigest())
    assert ApiKey.get_by_id(key.id).key_hash == hashlib.sha256(secret.encode()).hexdigest()
    assert ImportedKey.get_by_id(key.id).rehashed_at == rehashed_at


def test_failed_checks_on_a_lookup_prefix_stop_at_ten_a_minute_and_the_answer_stays_an_unknown_key_s(
        client, import_key, checks):
    secret, _ = import_key("bcrypt")
    wrong = secret[:-1] + ("A" if secret[-1] != "A" else "B")
    unknown = get(client, made_secret("other_tok_"))
    for _ in range(imported.FAILED_CHECKS_PER_PREFIX.amount):
        assert get(client, wrong).status_code == 401
    assert checks == [("bcrypt", False)] * 10
    refused = get(client, secret)
    assert checks == [("bcrypt", False)] * 10
    assert (refused.status_code, refused.json, refused.headers["WWW-Authenticate"]) == (
        unknown.status_code, unknown.json, unknown.headers["WWW-Authenticate"])
    assert ApiKey.select().where(ApiKey.key_hash.startswith(AWAITING_FIRST_USE)).count() == 1


def test_a_secret_is_read_only_in_a_known_form_or_with_a_declared_start(client, api_key, import_key, lookups):
    import_key("sha256-hex")
    for secret in ["x" * 40, "sk_live_" + "A" * 38, made_secret("nobody_"), "acme_live_short"]:
        assert get(client, secret).status_code == 401
    assert lookups == []
    assert get(client, made_secret("acme_live_")).status_code == 401
    assert get(client, api_key).status_code == 200
    assert len(lookups) == 2


def test_a_start_declared_as_empty_lets_every_secret_of_the_form_through(client, import_key, lookups):
    secret, _ = import_key("sha256-hex", secret="anything-goes-0123456789", prefix="")
    assert get(client, "no-declared-start-here-123").status_code == 401
    assert get(client, "short").status_code == 401
    assert len(lookups) == 1
    assert get(client, secret).status_code == 200


def test_another_process_s_import_works_from_the_next_request(app, make_app, import_key):
    other = make_app({**app.config, "DATABASE_URL": app.config["DATABASE_URL"]}).test_client()
    assert get(other, made_secret("rails_tok_")).status_code == 401
    secret, _ = import_key("bcrypt")
    if not app.config["DATABASE_URL"].startswith("sqlite"):
        # PostgreSQL with limits in memory keeps no key generation: the starts are read again each second.
        time.sleep(1.1)
    assert get(other, secret).status_code == 200


def test_rolling_a_key_awaiting_its_first_use_ends_its_old_secret(client, import_key, checks):
    secret, key = import_key("argon2id")
    new_secret = keyactions.roll_key(key, grace=3600)
    assert get(client, secret).status_code == 401
    assert get(client, new_secret).status_code == 200
    assert checks == [] and ImportedKey.get_by_id(key.id).slow_hash is None


def test_the_revoke_endpoint_revokes_an_imported_sha256_key(client, import_key):
    secret, key = import_key("sha256-base64")
    response = client.post("/api/v1/keys/revoke", headers={"X-API-Key": secret})
    assert (response.status_code, response.json["revoked"]) == (200, True)
    assert ApiKey.get_by_id(key.id).leak_report == "api"
    assert get(client, secret).status_code == 401


def test_the_revoke_endpoint_makes_no_slow_check(client, import_key, checks):
    secret, key = import_key("bcrypt")
    assert client.post("/api/v1/keys/revoke", headers={"X-API-Key": secret}).status_code == 401
    assert checks == [] and ApiKey.get_by_id(key.id).revoked_at is None


def test_a_bcrypt_hash_that_bcrypt_cannot_read_opens_nothing_and_is_no_500(client, import_key, monkeypatch):
    secret, key = import_key("bcrypt")
    ImportedKey.update(slow_hash="$2b$04$" + "z" * 53).where(ImportedKey.key == key.id).execute()
    assert get(client, secret).status_code == 401


def test_the_fast_lane_s_status_endpoint_tells_an_imported_key_outside_any_app_context(make_app, tmp_path):
    app = make_app({**APP_SETTINGS, "DATABASE_URL": f"sqlite:///{tmp_path}/status.db"})
    secret = made_secret()
    with app.app_context():
        user = users.create_user("sam", "sam@example.com", "correct horse battery")
        keyimports.import_keys(users.personal_organisation_id(user), jsonl(sha256_hex(secret)))
    client = app.test_client()
    for sent, authenticated in [(secret, True), (made_secret(), False), ("x" * 30, False)]:
        response = client.get("/api/v1/status", headers={"X-API-Key": sent})
        assert (response.status_code, response.json["authenticated"]) == (200, authenticated)


def test_failed_checks_are_also_bounded_per_organisation_and_per_client(client, import_key, checks, monkeypatch):
    monkeypatch.setattr(imported, "FAILED_CHECKS_PER_ORGANISATION", RateLimitItemPerMinute(3))
    monkeypatch.setattr(imported, "FAILED_CHECKS_PER_CLIENT", RateLimitItemPerMinute(5))
    secrets = [import_key("bcrypt")[0] for _ in range(3)]
    for secret in secrets:
        for _ in range(2):
            assert get(client, secret[:-1] + "!").status_code == 401
    assert len(checks) == 3
    monkeypatch.setattr(imported, "FAILED_CHECKS_PER_ORGANISATION", RateLimitItemPerMinute(100))
    for secret in secrets:
        assert get(client, secret[:-1] + "?").status_code == 401
    assert len(checks) == 5
    assert get(client, secrets[0]).status_code == 401 and len(checks) == 5


def test_a_worker_stops_checking_a_prefix_another_worker_rehashed(app, make_app, import_key, checks):
    other_app = make_app({**app.config})
    other = other_app.test_client()
    secret, _ = import_key("bcrypt")
    assert get(other, secret[:-1] + "!").status_code == 401
    assert get(app.test_client(), secret).status_code == 200
    assert get(other, secret[:-1] + "?").status_code == 401
    assert secret[:14] not in other_app.extensions["keys"].forms.awaiting.get(14, set())
    assert get(other, secret[:-1] + "#").status_code == 401
    assert checks == [("bcrypt", False), ("bcrypt", True)]
    assert get(other, secret).status_code == 200


def test_every_request_that_read_by_hash_before_another_worker_s_rehash_reads_again(app, make_app, import_key):
    other_app = make_app({**app.config})
    secret, _ = import_key("bcrypt")
    assert get(other_app.test_client(), secret[:-1] + "!").status_code == 401  # the start is read there
    keys = other_app.extensions["keys"]
    read_before = keys.forms.settles
    assert get(app.test_client(), secret).status_code == 200
    # Two requests of the other worker whose reads by hash came before the rehash: the first finds
    # the key no longer awaiting, the second finds the prefix already forgotten. Both read again.
    assert [keys.first_use.opens(secret, keys.forms, read_before) for _ in range(2)] == [True, True]
    # A request that reads by hash from now on, with a wrong secret, is not given a second read.
    assert not keys.first_use.opens(secret[:-1] + "?", keys.forms, keys.forms.settles)


def test_a_worker_reads_only_the_keys_imported_since_its_last_read(app, client, user, import_key, caplog):
    forms = app.extensions["keys"].forms
    _, first = import_key("sha256-hex")
    assert get(client, made_secret("nobody_")).status_code == 401
    assert forms.read_past == first.id
    keyactions.revoke_key(keyactions.issue_key(user, "moves the generation", "development")[0])
    if not app.config["DATABASE_URL"].startswith("sqlite"):
        time.sleep(1.1)  # PostgreSQL with limits in memory: the starts are read again each second
    with caplog.at_level(logging.DEBUG, logger="peewee"):
        assert get(client, made_secret("nobody_")).status_code == 401
    # One read, of the keys past the last one read: none since, however many were imported before.
    [read] = [record.getMessage() for record in caplog.records if 'FROM "imported_keys"' in record.getMessage()]
    assert '"key_id" > ' in read and read.endswith(f"[{first.id}])")
