"""The worker's cache of API keys: its bound, and each signal that a kept key may be stale (SQLite's
counters, the key generation in Redis, a key's own expiry, the maximum age). The generation's own
counting: tests/unit/store/test_rediswindows.py; reads shared under gevent: test_keycache_reads.py."""

import sqlite3
import time
from urllib.parse import urlparse

import pytest
import redis
import services
from clock import fake_time
from flask import current_app
from limits.errors import StorageError

import models
from accounts import users
from app import close_app, create_app
from keys import keycache, keyformat
from orgs import keyactions
from store import rediswindows


def find(key_hash):
    """The app's cache lookup, as auth.admit makes it (with no form check)."""
    return current_app.extensions["keys"].find(key_hash)


def new_key(user, **options):
    key, secret = keyactions.issue_key(user, "cached", "production", **options)
    return key, keyformat.hash_key(secret)


@pytest.fixture
def sqlite_app(tmp_path):
    app = create_app({"DATABASE_URL": f"sqlite:///{tmp_path}/cache.db", "RATELIMIT_STORAGE_URL": "memory://",
                      "RATE_LIMIT_TIERS": "free=100/minute", "TESTING": True})
    with app.app_context():
        yield app
    close_app(app)


@pytest.fixture
def sqlite_user(sqlite_app):
    return users.create_user("kim", "kim@example.com", "correct horse battery")


def test_each_database_and_storage_gets_its_signal(tmp_path, make_app):
    sqlite = make_app({"DATABASE_URL": f"sqlite:///{tmp_path}/a.db", "RATELIMIT_STORAGE_URL": "memory://"})
    assert isinstance(sqlite.extensions["keys"].generation, keycache.SqliteGeneration)
    postgres_url = services.postgres_url()
    postgres_redis = make_app({"DATABASE_URL": postgres_url, "RATELIMIT_STORAGE_URL": services.redis_url()})
    assert isinstance(postgres_redis.extensions["keys"].generation, keycache.RedisGeneration)
    postgres_memory = make_app({"DATABASE_URL": postgres_url, "RATELIMIT_STORAGE_URL": "memory://"})
    assert isinstance(postgres_memory.extensions["keys"], keycache.Uncached)


def test_a_kept_key_costs_no_lookup_until_the_database_changes(sqlite_app, sqlite_user, lookups):
    key, key_hash = new_key(sqlite_user)
    assert find(key_hash)[0].id == key.id
    assert find(key_hash)[0].id == key.id
    assert find(key_hash) == (find(key_hash)[0], None)
    assert lookups == [key_hash]


def test_another_connection_s_commit_is_seen_at_the_next_lookup(sqlite_app, sqlite_user, lookups):
    # As the CLI or another worker would: its own connection to the same file.
    key, key_hash = new_key(sqlite_user)
    assert find(key_hash)[0] is not None
    path = urlparse(sqlite_app.config["DATABASE_URL"]).path[1:]
    with sqlite3.connect(path) as other:
        other.execute("UPDATE api_keys SET revoked_at = '2026-01-01 00:00:00' WHERE id = ?", (key.id,))
    assert find(key_hash) == (None, None)
    assert lookups == [key_hash, key_hash]


def test_this_connection_s_own_write_is_seen_at_the_next_lookup(sqlite_app, sqlite_user, lookups):
    key, key_hash = new_key(sqlite_user)
    assert find(key_hash)[0] is not None
    models.ApiKey.update(revoked_at=models.utcnow()).where(models.ApiKey.id == key.id).execute()
    assert find(key_hash) == (None, None)


def other_connection(app):
    """A connection of its own to the app's SQLite file, as the CLI or another worker has."""
    return sqlite3.connect(urlparse(app.config["DATABASE_URL"]).path[1:])


def test_a_usage_flush_leaves_every_kept_key_usable(sqlite_app, sqlite_user, lookups):
    """The flush writes each key's total and last use every second: were that a key change, a worker
    serving more keys than its flushes are apart would read nearly every key from the database."""
    key, key_hash = new_key(sqlite_user)
    find(key_hash)
    counter = sqlite_app.extensions["usage"]
    counter.add(key.id, "/api/v1/protected/test", 200, True)
    counter.flush()  # this connection's write
    with other_connection(sqlite_app) as other:  # another worker's flush
        other.execute("UPDATE api_keys SET total_requests = total_requests + 5, last_used_at = '2026-01-01 00:00:00' "
                      "WHERE id = ?", (key.id,))
    assert find(key_hash)[0].id == key.id
    assert lookups == [key_hash]
    assert models.ApiKey.get_by_id(key.id).total_requests == 6


@pytest.mark.parametrize("change", [
    "name = 'renamed'", "scopes = 'user:read'", "allow_ips = '10.0.0.0/8'", "rate_limit_tier = 'gold'",
    "rate_limits = '5/minute'", "expires_at = '2999-01-01 00:00:00'", "key_type = 'development'",
    "credits_remaining = 10", "credits_refill_amount = 5", "user_id = user_id",
])
def test_a_change_to_what_admission_reads_is_seen_at_the_next_lookup(sqlite_app, sqlite_user, lookups, change):
    key, key_hash = new_key(sqlite_user)
    find(key_hash)
    with other_connection(sqlite_app) as other:
        other.execute(f"UPDATE api_keys SET {change} WHERE id = ?", (key.id,))
    find(key_hash)
    # Setting a column to its own value changes nothing, so nothing is read again.
    assert lookups == [key_hash] * (1 if change == "user_id = user_id" else 2)


def test_a_spent_credit_keeps_the_key_and_a_grant_makes_it_stale(sqlite_app, sqlite_user, lookups):
    """A kept key's credits only ever go down between grants (metering/credits.py checks each spend
    in the database); a grant raises them, and a key kept as spent must be read again."""
    key, key_hash = new_key(sqlite_user, credits_given=3)
    find(key_hash)
    with other_connection(sqlite_app) as other:
        other.execute("UPDATE api_keys SET credits_remaining = credits_remaining - 1 WHERE id = ?", (key.id,))
    find(key_hash)
    assert lookups == [key_hash]
    with other_connection(sqlite_app) as other:
        other.execute("UPDATE api_keys SET credits_remaining = 50, credits_granted = 50 WHERE id = ?", (key.id,))
    assert find(key_hash)[0].credits_remaining == 50
    assert lookups == [key_hash, key_hash]


def test_a_key_deleted_with_its_organisation_by_another_connection_is_gone(sqlite_app, sqlite_user, lookups):
    key, key_hash = new_key(sqlite_user)
    find(key_hash)
    with other_connection(sqlite_app) as other:
        other.execute("PRAGMA foreign_keys = ON")
        other.execute("DELETE FROM organisations WHERE id = ?", (key.org_id,))
    assert find(key_hash) == (None, None)


def test_a_revocation_empties_the_cache(sqlite_app, sqlite_user):
    key, key_hash = new_key(sqlite_user)
    assert find(key_hash)[0] is not None
    keyactions.revoke_key(key)
    assert sqlite_app.extensions["keys"].entries == {}
    assert find(key_hash) == (None, None)


def test_a_kept_key_expires_on_time_without_a_change(sqlite_app, sqlite_user, lookups):
    # 3 s: the first find comes before the end on a loaded machine too; the sleep runs to it.
    key, key_hash = new_key(sqlite_user, expires_in=3)
    assert find(key_hash)[0] is not None
    time.sleep(max(0.0, (key.expires_at - models.utcnow()).total_seconds()) + 0.05)
    assert find(key_hash) == (None, None)


def test_a_rolled_out_secret_is_kept_until_its_grace_period_ends(sqlite_app, sqlite_user):
    key, old_hash = new_key(sqlite_user)
    new_secret = keyactions.roll_key(key, grace=3)  # as above: 3 s for the finds on a loaded machine
    assert find(old_hash)[0].id == key.id
    assert find(keyformat.hash_key(new_secret))[0].id == key.id
    entry = sqlite_app.extensions["keys"].entries[old_hash]
    assert entry.usable_until - time.time() <= 3
    time.sleep(max(0.0, entry.usable_until - time.time()) + 0.05)
    assert find(old_hash) == (None, None)
    assert find(keyformat.hash_key(new_secret))[0].id == key.id


def test_on_sqlite_a_kept_key_has_no_maximum_age(sqlite_app, sqlite_user, lookups, monkeypatch):
    # The triggers see every change, one made by hand included (the tests above): age adds nothing.
    _, key_hash = new_key(sqlite_user)
    find(key_hash)
    fake_time(monkeypatch, "keys.keycache", start=time.time() + 100 * keycache.MAX_AGE)
    assert find(key_hash)[0] is not None
    assert lookups == [key_hash]


def test_the_cache_holds_at_most_its_size_and_lets_the_oldest_go(sqlite_app, sqlite_user, lookups):
    cache = sqlite_app.extensions["keys"]
    cache.size = 3
    hashes = [new_key(sqlite_user)[1] for _ in range(4)]
    for key_hash in hashes:
        find(key_hash)
    assert list(cache.entries) == hashes[1:]
    find(hashes[3])
    assert len(lookups) == 4


def test_unknown_secrets_are_not_kept(sqlite_app, lookups):
    for number in range(5):
        assert find(keyformat.hash_key(f"sk_live_{number}")) == (None, None)
    assert sqlite_app.extensions["keys"].entries == {}


@pytest.fixture
def redis_app():
    app = create_app({"DATABASE_URL": services.postgres_url(), "RATELIMIT_STORAGE_URL": services.redis_url(),
                      "RATE_LIMIT_TIERS": "free=100/minute", "TESTING": True})
    with app.app_context():
        yield app
    close_app(app)


def test_a_stale_key_is_read_again_before_it_is_counted(redis_app, lookups):
    user = users.create_user("lee", "lee@example.com", "correct horse battery")
    key, secret = keyactions.issue_key(user, "cached", "production")
    client = redis_app.test_client()
    headers = {"X-API-Key": secret}
    assert client.get("/api/v1/protected/test", headers=headers).status_code == 200
    assert client.get("/api/v1/protected/test", headers=headers).headers["X-RateLimit-Remaining"] == "98"
    reads = len(lookups)
    # Another instance revokes: its own cache and windows, the same database and Redis.
    other = rediswindows.RedisWindows(redis_app.extensions["ratelimit"].storage)
    models.ApiKey.update(revoked_at=models.utcnow()).where(models.ApiKey.id == key.id).execute()
    other.announce_key_change()
    response = client.get("/api/v1/protected/test", headers=headers)
    assert response.status_code == 401
    assert len(lookups) == reads + 1
    limiter = redis_app.extensions["ratelimit"]
    assert limiter.storage.get(limiter.tiers["free"][0].key_for(f"key:{key.id}")) == 2  # the 401 was not counted


def test_with_redis_a_kept_key_is_read_again_after_the_maximum_age(redis_app, lookups, monkeypatch):
    # What bounds a change Redis was not told of: an UPDATE by hand, a CLI run without its URL.
    user = users.create_user("lee", "lee@example.com", "correct horse battery")
    _, key_hash = new_key(user)
    find(key_hash)
    read_at = redis_app.extensions["keys"].entries[key_hash].read_at
    clock = fake_time(monkeypatch, "keys.keycache", start=read_at + keycache.MAX_AGE - 1)
    find(key_hash)
    assert lookups == [key_hash]
    clock.now += 2
    find(key_hash)
    assert lookups == [key_hash, key_hash]


def test_an_announcement_that_cannot_reach_redis_is_a_sentence(redis_app, monkeypatch):
    user = users.create_user("lee", "lee@example.com", "correct horse battery")
    key, _ = keyactions.issue_key(user, "cached", "production")
    windows = redis_app.extensions["ratelimit"].windows
    monkeypatch.setattr(windows.storage, "get_connection",
                        lambda: redis.Redis.from_url("redis://127.0.0.1:1", socket_connect_timeout=1))
    with pytest.raises(keycache.ChangeNotAnnounced):
        keyactions.revoke_key(key)
    assert models.ApiKey.get_by_id(key.id).revoked_at is not None


def test_a_revoked_key_kept_in_the_cache_is_a_401_not_a_403(redis_app):
    # The key lacks user:read; once revoked elsewhere it must be refused as revoked, not as short of a scope.
    user = users.create_user("lee", "lee@example.com", "correct horse battery")
    key, secret = keyactions.issue_key(user, "narrow", "production", scopes=["test:read"])
    client = redis_app.test_client()
    for _ in range(2):
        assert client.get("/api/v1/protected/test", headers={"X-API-Key": secret}).status_code == 200
    assert client.get("/api/v1/user/me", headers={"X-API-Key": secret}).status_code == 403
    models.ApiKey.update(revoked_at=models.utcnow()).where(models.ApiKey.id == key.id).execute()
    rediswindows.RedisWindows(redis_app.extensions["ratelimit"].storage).announce_key_change()
    response = client.get("/api/v1/user/me", headers={"X-API-Key": secret})
    assert response.status_code == 401
    assert response.get_json()["error"]["code"] == "invalid_api_key"


def test_revoking_a_revoked_key_again_announces_again(redis_app):
    user = users.create_user("lee", "lee@example.com", "correct horse battery")
    key, _ = keyactions.issue_key(user, "twice", "production")
    windows = redis_app.extensions["ratelimit"].windows
    keyactions.revoke_key(key)
    first = windows.generation
    keyactions.revoke_key(models.ApiKey.get_by_id(key.id))
    assert windows.generation == first
    keyactions.revoke_key(models.ApiKey.get_by_id(key.id), again=True)
    assert windows.generation != first
    assert redis.Redis.from_url(services.redis_database()).get(windows.generation_key).decode() == windows.generation


def test_an_announcement_is_tried_again_before_it_fails(redis_app, monkeypatch):
    windows = redis_app.extensions["ratelimit"].windows
    announce, failures = windows.announce_key_change, [StorageError(OSError("timeout"))] * 2

    def flaky(generation_keys):
        if failures:
            raise failures.pop()
        announce(generation_keys)

    monkeypatch.setattr(windows, "announce_key_change", flaky)
    keycache.announce_change()
    assert failures == []


def test_the_cli_says_when_servers_that_use_redis_may_not_hear_of_a_change(app, runner, api_key):
    key_id = models.ApiKey.get(models.ApiKey.key_hash == keyformat.hash_key(api_key)).id
    result = runner.invoke(args=["keys", "revoke", str(key_id)])
    assert result.exit_code == 0
    postgres = not app.config["DATABASE_URL"].startswith("sqlite")
    assert ("RATELIMIT_STORAGE_URL is not Redis here" in result.stderr) == postgres
