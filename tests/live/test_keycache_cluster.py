"""The key cache on a real Redis Cluster (three masters, three replicas, started for the module):
each hash tag of the keys' windows has a generation of its own in their slot, a kept key costs no
database read, a change moves its keys' tags' generations (and no other's) so that another
instance reads the key again at its next request, a key is never kept under a generation its
change moved, a key's credits are spent under its tag, a cluster that cannot tell a generation
refuses the key (closed) or admits it read and uncached (open), an unknown key ends no outage it
never asked the cluster about, and counts waiting together share a call with the windows of their
own tag only."""

import gevent
import pytest
import redis
import services
from limits.errors import StorageError
from redistopologies import masters, redis_cluster

import models
from accounts import users
from app import close_app, create_app
from keys import keycache, keyformat
from ops.outage import StorageOutage
from orgs import keyactions, keyedits, members, organisations
from store import rediswindows
from store.limitstorage import LimitStorageUnavailable, open_storage

PASSWORD = "correct horse battery"


@pytest.fixture(scope="module")
def cluster_url(tmp_path_factory):
    with redis_cluster(tmp_path_factory.mktemp("cluster")) as url:
        yield url


@pytest.fixture(params=["per key", "per organisation"])
def cluster_app(request, cluster_url):
    """An app on the emptied cluster (each test's database starts empty too, its ids from 1 again),
    its windows tagged by key or, with an organisation allowance, by organisation."""
    for host, port in masters(cluster_url):
        redis.Redis(host=host, port=port).flushall()
    settings = {"DATABASE_URL": services.postgres_url(), "RATELIMIT_STORAGE_URL": cluster_url,
                "RATE_LIMIT_TIERS": "free=1000/minute", "TESTING": True}
    if request.param == "per organisation":
        settings["ACCOUNT_RATE_LIMIT"] = "5000/minute"
    app = create_app(settings)
    with app.app_context():
        yield app
    close_app(app)


@pytest.fixture
def other_instance(cluster_app):
    """The windows of another instance on the same cluster: its own connection and generations."""
    return rediswindows.RedisWindows(open_storage(cluster_app.config["RATELIMIT_STORAGE_URL"]))


def redis_of(windows):
    return windows.storage.get_connection()


def protected(app, secret):
    return app.test_client().get("/api/v1/protected/test", headers={"X-API-Key": secret})


def tag_generation(app, key):
    """The Redis key and token of the generation of the key's tag, as the cluster holds it now."""
    return app.extensions["keys"].generation.of(key)


def test_a_kept_key_costs_no_database_read_and_its_count_checks_its_tag_s_generation(cluster_app, lookups):
    assert isinstance(cluster_app.extensions["keys"], keycache.TaggedKeyCache)
    user = users.create_user("kai", "kai@example.com", PASSWORD)
    key, secret = keyactions.issue_key(user, "kept", "production")
    assert protected(cluster_app, secret).headers["X-RateLimit-Remaining"] == "999"
    # Read once to learn its tag, and again after the tag's generation.
    assert lookups == [keyformat.hash_key(secret)] * 2
    for remaining in range(998, 990, -1):
        assert protected(cluster_app, secret).headers["X-RateLimit-Remaining"] == str(remaining)
    assert len(lookups) == 2
    generation_key, _ = tag_generation(cluster_app, key)
    tag = cluster_app.extensions["ratelimit"].hash_tag(key)
    assert tag in generation_key and tag in (f"{{key:{key.id}}}", f"{{org:{key.org_id}}}")


def test_another_instance_s_change_is_seen_at_the_next_request_and_only_for_its_tag(cluster_app, other_instance,
                                                                                   lookups):
    user = users.create_user("kai", "kai@example.com", PASSWORD)
    changed, changed_secret = keyactions.issue_key(user, "changed", "production")
    other_org = members.create("Elsewhere", user)
    kept, kept_secret = keyactions.issue_key(user, "kept", "production", org=other_org.id)
    for secret in (changed_secret, kept_secret) * 2:
        assert protected(cluster_app, secret).status_code == 200
    reads = len(lookups)
    # The other instance revokes: the same database and cluster, its own cache.
    models.ApiKey.update(revoked_at=models.utcnow()).where(models.ApiKey.id == changed.id).execute()
    other_instance.announce_key_change([tag_generation(cluster_app, changed)[0]])
    response = protected(cluster_app, changed_secret)
    assert response.status_code == 401
    assert len(lookups) == reads + 1
    limiter = cluster_app.extensions["ratelimit"]
    window = limiter.plan_for(changed).windows[0].key
    assert limiter.storage.get(window) == 2  # the 401 was not counted
    # The key of another tag is still kept.
    assert protected(cluster_app, kept_secret).status_code == 200
    assert len(lookups) == reads + 1


@pytest.mark.parametrize("change", ["revoke", "roll", "limit", "update", "grant credits", "delete account"])
def test_each_change_moves_the_generation_of_its_keys_tags(cluster_app, change):
    user = users.create_user("kai", "kai@example.com", PASSWORD)
    key, _ = keyactions.issue_key(user, "changed", "production")
    before = tag_generation(cluster_app, key)
    if change == "revoke":
        keyactions.revoke_key(key)
    elif change == "roll":
        keyactions.roll_key(key, grace=0)
    elif change == "limit":
        keyactions.limit_key(key, "5/minute")
    elif change == "update":
        keyedits.update_key(key.id, may_widen=True, name="renamed")
    elif change == "grant credits":
        keyactions.grant_credits(key, set_to=10)
    else:
        organisations.delete_account(user, PASSWORD)
    after = tag_generation(cluster_app, key)
    assert after[0] == before[0] and after[1] != before[1]
    # The other tag too, which the servers check when their ACCOUNT_RATE_LIMIT is set otherwise.
    windows = cluster_app.extensions["ratelimit"].windows
    assert all(redis_of(windows).ttl(windows.tagged_generation_key(tag)) > 0
               for tag in cluster_app.extensions["ratelimit"].hash_tags(key))


def test_a_change_committed_during_a_first_read_is_never_kept_under_the_generation_it_moved(
        cluster_app, other_instance, monkeypatch):
    """The first read learns the key's tag; the change commits and is announced before the tag's
    generation is read; the second read, after it, finds the key revoked."""
    user = users.create_user("kai", "kai@example.com", PASSWORD)
    key, secret = keyactions.issue_key(user, "raced", "production")
    read = keycache.find_active_key
    reads = []

    def read_then_revoke(key_hash):
        found = read(key_hash)
        reads.append(found is not None)
        if len(reads) == 1:
            models.ApiKey.update(revoked_at=models.utcnow()).where(models.ApiKey.id == key.id).execute()
            other_instance.announce_key_change([tag_generation(cluster_app, key)[0]])
        return found

    monkeypatch.setattr(keycache, "find_active_key", read_then_revoke)
    assert protected(cluster_app, secret).status_code == 401
    assert reads == [True, False]
    assert cluster_app.extensions["keys"].entries == {}


@pytest.mark.parametrize("failure_mode", ["closed", "open"])
def test_a_cluster_that_cannot_tell_a_generation_refuses_or_admits_the_key_read_and_uncached(
        cluster_url, make_app, monkeypatch, failure_mode):
    """Closed: a 503, at once (the count, in the same slot, could not be made either). Open: the key
    read now and kept for none, and for the outage's second not asked of the cluster again."""
    for host, port in masters(cluster_url):
        redis.Redis(host=host, port=port).flushall()
    app = make_app({"DATABASE_URL": services.postgres_url(), "RATELIMIT_STORAGE_URL": cluster_url,
                    "RATE_LIMIT_ON_STORAGE_FAILURE": failure_mode, "TESTING": True})
    with app.app_context():
        user = users.create_user("kai", "kai@example.com", PASSWORD)
        key, secret = keyactions.issue_key(user, "unconfirmed", "production")
        asked = []

        def unavailable(generation_key):
            asked.append(generation_key)
            raise StorageError(ConnectionError("no node answers"))

        monkeypatch.setattr(app.extensions["ratelimit"].windows, "read_tagged_generation", unavailable)
        keys = app.extensions["keys"]
        if failure_mode == "closed":
            with pytest.raises(LimitStorageUnavailable):
                keys.find(keyformat.hash_key(secret), secret)
            assert protected(app, secret).status_code == 503
            return
        for _ in range(2):
            found, generation = keys.find(keyformat.hash_key(secret), secret)
            assert found.id == key.id and generation is None
        assert len(asked) == 1 and keys.entries == {}
        assert protected(app, secret).status_code == 200


def test_a_key_with_credits_spends_them_under_its_tag_and_a_grant_is_seen_at_the_next_request(cluster_app):
    user = users.create_user("kai", "kai@example.com", PASSWORD)
    key, secret = keyactions.issue_key(user, "metered", "production", credits_given=3)
    answers = [protected(cluster_app, secret) for _ in range(4)]
    assert [answer.status_code for answer in answers] == [200, 200, 200, 429]
    assert answers[-1].json["error"]["code"] == "credits_exhausted"
    keyactions.grant_credits(models.ApiKey.get_by_id(key.id), set_to=2)
    assert [protected(cluster_app, secret).status_code for _ in range(3)] == [200, 200, 429]


def test_counts_waiting_together_share_a_call_with_their_own_tag_only(cluster_url, monkeypatch):
    """As in a gevent worker, the round trip slowed so that requests pile up behind it: the windows
    of one tag (one slot) go in one script call, each counted in the order it came, while another
    tag's call goes on at the same time."""
    monkeypatch.setattr(rediswindows, "greenlets_share_thread", lambda: True)
    windows = rediswindows.RedisWindows(open_storage(cluster_url))
    calls, real_count = [], windows.count

    def slow_count(found, generation_key=None):
        calls.append((generation_key, len(found)))
        gevent.sleep(0.01)
        return real_count(found, generation_key)

    monkeypatch.setattr(windows, "count", slow_count)
    tags = ["{key:7001}", "{key:7002}"]
    generations = {tag: windows.read_tagged_generation(windows.tagged_generation_key(tag)) for tag in tags}
    asked = [tag for _ in range(20) for tag in tags]
    hits = [gevent.spawn(windows.hit, f"{tag}window", 60, (windows.tagged_generation_key(tag), generations[tag]))
            for tag in asked]
    gevent.joinall(hits, timeout=60, raise_error=True)
    for tag in tags:
        assert [hit.value[0] for hit, its_tag in zip(hits, asked) if its_tag == tag] == list(range(1, 21))
    generation_keys = [windows.tagged_generation_key(tag) for tag in tags]
    # Each tag's first request goes alone, the other tag's meanwhile; the rest wait behind it.
    assert calls == [(generation_keys[0], 1), (generation_keys[1], 1), (generation_keys[0], 19),
                     (generation_keys[1], 19)]
    assert windows.lanes == {}


def test_an_unknown_key_does_not_end_an_outage_it_never_asked_the_cluster_about(cluster_url, make_app):
    """Open, after the outage's second: a request with an unknown key asks the cluster nothing, so
    the others go on not asking it (a hung Redis would hold each for its timeout)."""
    app = make_app({"DATABASE_URL": services.postgres_url(), "RATELIMIT_STORAGE_URL": cluster_url,
                    "RATE_LIMIT_ON_STORAGE_FAILURE": "open", "TESTING": True})
    with app.app_context():
        clock = [1000.0]
        outage = StorageOutage(clock=lambda: clock[0])
        app.extensions["ratelimit"].outage = outage
        outage.failed("no node answers")
        clock[0] += 1
        assert app.extensions["keys"].find(keyformat.hash_key("sk_live_" + "0" * 40)) == (None, None)
        assert outage.recent()
