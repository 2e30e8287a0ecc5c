"""Revocation against the workers' key caches, on real servers: two instances on PostgreSQL and
Redis, each holding a key in its cache, and a key revoked, rolled, changed or expired through the
other instance or the CLI fails (as changed) on the very next request; the same on one SQLite process with the CLI
revoking from outside. In both run modes (gunicorn, and `python app.py`'s fallback server)."""

import datetime
import sqlite3
import time

import psycopg
import pytest
import requests
import services
from liveserver import PASSWORD, SECRET_PATTERN, Browser, cli, cli_session, service_env, serving

from keys import keyformat

ROUNDS = 50


def status(server, secret):
    response = requests.get(server.base + "/api/v1/protected/test", headers={"X-API-Key": secret}, timeout=10)
    return response.status_code


def hold(server, secret):
    """Have the server keep the key in its cache under the newest generation it knows: the first
    request may learn of a newer one (an earlier round's change) and so tag the key as older."""
    assert status(server, secret) == 200
    assert status(server, secret) == 200


def insert_keys(connection, mark, username, count, expires_at=None):
    """Make `count` keys for the user straight in the database (the web application would refuse as
    many) through a DB-API connection whose parameter mark is `mark`; return [(id, secret)]."""
    user_id, org_id = connection.execute(
        f"SELECT u.id, o.id FROM users u JOIN organisations o ON o.personal_for_id = u.id WHERE u.username = {mark}",
        (username,)).fetchone()
    keys = []
    for number in range(count):
        secret = keyformat.generate_secret("production")
        key_id = connection.execute(
            "INSERT INTO api_keys (org_id, user_id, name, key_type, rate_limit_tier, display_prefix, key_hash, "
            f"created_at, total_requests, expires_at) VALUES ({mark}, {mark}, {mark}, 'production', 'free', {mark}, "
            f"{mark}, {mark}, 0, {mark}) RETURNING id",
            (org_id, user_id, f"cached {number}", secret[:12], keyformat.hash_key(secret), utcnow(),
             expires_at)).fetchone()[0]
        keys.append((key_id, secret))
    return keys


def utcnow():
    return datetime.datetime.now(datetime.UTC).replace(tzinfo=None)


@pytest.fixture(scope="module")
def pair(tmp_path_factory, run_mode):
    """(a, b, env, browser): two instances of one worker each (so that the worker that answers holds
    the key it cached) on one PostgreSQL database and one Redis; browser is signed up on a."""
    tmp_path = tmp_path_factory.mktemp("keycache")
    env = service_env(tmp_path, "postgresql", RATELIMIT_STORAGE_URL=services.redis_url(), WEB_CONCURRENCY="1",
                      TRUSTED_PROXIES="1", MAX_KEYS_PER_USER="1000")
    with (serving(tmp_path_factory.mktemp("a"), env, run_mode) as a,
          serving(tmp_path_factory.mktemp("b"), env, run_mode) as b):
        browser = Browser(a).signup()
        yield a, b, env, browser


def postgres_keys(env, username, count, expires_at=None):
    with psycopg.connect(env["DATABASE_URL"], autocommit=True) as connection:
        return insert_keys(connection, "%s", username, count, expires_at)


@pytest.fixture(scope="module")
def commands(pair):
    """The command line, against both instances' database and Redis."""
    with cli_session(pair[2]) as session:
        yield session


def revoke_through_the_api(a, commands, browser, key_id, secret):
    response = requests.post(a.base + "/api/v1/keys/revoke", headers={"X-API-Key": secret}, timeout=10)
    assert response.status_code == 200


def revoke_in_the_web_application(a, commands, browser, key_id, secret):
    response = browser.post(f"/settings/security/keys/{key_id}/revoke", form_page="/settings/security")
    assert response.status_code == 302


def revoke_through_the_cli(a, commands, browser, key_id, secret):
    commands("keys", "revoke", str(key_id))


@pytest.mark.parametrize("revoke", [revoke_through_the_api, revoke_in_the_web_application, revoke_through_the_cli])
def test_a_revoked_key_fails_at_once_on_both_instances(pair, commands, revoke):
    a, b, env, browser = pair
    for key_id, secret in postgres_keys(env, browser.username, ROUNDS):
        hold(a, secret)
        hold(b, secret)
        revoke(a, commands, browser, key_id, secret)
        assert status(b, secret) == 401
        assert status(a, secret) == 401


def narrow_in_the_web_application(commands, browser, key_id):
    response = browser.post(f"/settings/security/keys/{key_id}/edit", {"scopes_shown": "1", "scopes": ["usage:read"]})
    assert response.status_code == 302


def narrow_through_the_cli(commands, browser, key_id):
    commands("keys", "update", str(key_id), "--scopes", "usage:read")


@pytest.mark.parametrize("narrow", [narrow_in_the_web_application, narrow_through_the_cli])
def test_a_key_changed_on_one_instance_is_refused_as_changed_on_the_other_at_once(pair, commands, narrow):
    a, b, env, browser = pair
    for key_id, secret in postgres_keys(env, browser.username, 10):
        hold(a, secret)
        hold(b, secret)
        narrow(commands, browser, key_id)
        assert status(b, secret) == 403 and status(a, secret) == 403


def limit_of(server, secret):
    response = requests.get(server.base + "/api/v1/protected/test", headers={"X-API-Key": secret}, timeout=10)
    return response.status_code, response.headers.get("X-RateLimit-Limit")


def test_a_key_s_tier_and_allow_list_changed_on_one_instance_hold_on_the_other_at_once(pair, commands):
    a, b, env, browser = pair
    for key_id, secret in postgres_keys(env, browser.username, 5):
        hold(a, secret)
        hold(b, secret)
        response = browser.post(f"/settings/security/keys/{key_id}/edit", {"tier": "tiny"})
        assert response.status_code == 302
        assert limit_of(b, secret) == (200, "2") and limit_of(a, secret) == (200, "2")
        assert limit_of(b, secret)[0] == 429
        # The tests' clients come from 127.0.0.1: an allow-list without it refuses them.
        commands("keys", "update", str(key_id), "--allow-ips", "203.0.113.7")
        response = requests.get(b.base + "/api/v1/protected/test", headers={"X-API-Key": secret}, timeout=10)
        assert (response.status_code, response.json()["error"]["code"]) == (403, "ip_not_allowed")


def test_a_secret_rolled_out_without_grace_fails_at_once_on_the_other_instance(pair):
    a, b, env, browser = pair
    # An account rolls at most 30 keys an hour in the web application.
    for key_id, secret in postgres_keys(env, browser.username, 25):
        hold(b, secret)
        response = browser.post(f"/settings/security/keys/{key_id}/roll", {"grace": "0"},
                                form_page="/settings/security")
        assert response.status_code == 302
        assert status(b, secret) == 401
        new_secret = SECRET_PATTERN.search(browser.get("/settings/security").text)[1]
        assert status(b, new_secret) == 200


def test_a_secret_rolled_out_through_the_cli_fails_at_once(pair, commands):
    a, b, env, browser = pair
    for key_id, secret in postgres_keys(env, browser.username, 10):
        hold(a, secret)
        hold(b, secret)
        new_secret = commands("keys", "roll", str(key_id), "--grace", "0").strip().splitlines()[-1]
        assert status(b, secret) == 401 and status(a, secret) == 401
        assert status(b, new_secret) == 200


def test_keys_expire_on_time_on_both_instances(pair):
    a, b, env, browser = pair
    # Time for the 200 requests that hold the keys before they expire, on a loaded machine too.
    expires_at = utcnow() + datetime.timedelta(seconds=15)
    keys = postgres_keys(env, browser.username, ROUNDS, expires_at)
    for _, secret in keys:
        hold(a, secret)
        hold(b, secret)
    time.sleep(max(0.0, (expires_at - utcnow()).total_seconds()))
    assert [status(server, secret) for _, secret in keys for server in (a, b)] == [401] * 2 * ROUNDS


def test_a_deleted_account_s_keys_fail_at_once_on_the_other_instance(pair):
    a, b, env, _ = pair
    owner = Browser(a).signup()
    keys = postgres_keys(env, owner.username, 5)
    for _, secret in keys:
        hold(b, secret)
    response = owner.post("/settings/profile/delete", {"password": PASSWORD}, form_page="/settings/profile")
    assert response.status_code == 302
    assert [status(b, secret) for _, secret in keys] == [401] * 5


def test_one_sqlite_process_sees_the_cli_s_revocations_at_once(tmp_path, run_mode):
    env = service_env(tmp_path, WEB_CONCURRENCY="1")
    cli(env, "users", "create", "dana", "--email", "dana@example.com", "--password-stdin", stdin="a long password\n")
    with serving(tmp_path, env, run_mode) as server, cli_session(env) as commands:
        with sqlite3.connect(env["DATABASE_URL"].removeprefix("sqlite:///")) as connection:
            keys = insert_keys(connection, "?", "dana", ROUNDS)
        for key_id, secret in keys:
            hold(server, secret)
            commands("keys", "revoke", str(key_id))
            assert status(server, secret) == 401
