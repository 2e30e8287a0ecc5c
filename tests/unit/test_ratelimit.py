"""Tier parsing, fixed windows, and the usage counter's flushes."""

import collections
import gc
import subprocess
import sys
import threading
import types

import pytest
from clock import fake_time
from limits import RateLimitItemPerHour, RateLimitItemPerMinute, RateLimitItemPerSecond
from liveserver import ROOT
from redis.crc import key_slot

import ratelimit
from metering import thresholds, usage
from models import ApiKey, UsageHour, db, start_of_hour, utcnow
from ops.note import Note
from orgs import keyactions


def test_parse_tiers():
    tiers = ratelimit.parse_tiers("free=1000/hour, pro = 5 / second,team=20/minute,big=1/day")
    assert tiers["free"] == (RateLimitItemPerHour(1000),)
    assert tiers["pro"] == (RateLimitItemPerSecond(5),)
    assert tiers["team"] == (RateLimitItemPerMinute(20),)
    assert tiers["big"][0].get_expiry() == 86400


def test_a_tier_may_have_several_windows():
    tiers = ratelimit.parse_tiers("free=10/second + 1000/hour,pro=5/minute")
    assert tiers["free"] == (RateLimitItemPerSecond(10), RateLimitItemPerHour(1000))
    assert tiers["pro"] == (RateLimitItemPerMinute(5),)


@pytest.mark.parametrize("spec", ["", "free", "free=", "free=abc/hour", "free=-1/hour", "free=1/week",
                                  "Free Tier=1/hour", "free=1/hour,", "free=1/hour+", "free=+1/hour",
                                  "free=1/hour+2/hour", "account=5/hour", "key=5/hour", "public=5/hour"])
def test_parse_tiers_rejects(spec):
    with pytest.raises(ValueError):
        ratelimit.parse_tiers(spec)


def FakeClock(monkeypatch):
    return fake_time(monkeypatch, "limits.storage.memory", "store.limitstorage", "ratelimit")


def test_fixed_window_starts_with_first_request_and_resets(app, monkeypatch):
    clock = FakeClock(monkeypatch)
    limiter = app.extensions["ratelimit"]
    item = RateLimitItemPerMinute(2)
    with app.test_request_context():
        first = limiter.hit(item, "w", "t")
        assert (first.remaining, first.reset) == (1, clock.now + 60)
        clock.now += 59.9
        assert limiter.hit(item, "w", "t").remaining == 0
        with pytest.raises(ratelimit.RateLimitExceeded) as raised:
            limiter.hit(item, "w", "t")
        assert raised.value.retry_after == 1
        clock.now += 0.1
        fresh = limiter.hit(item, "w", "t")
        assert (fresh.remaining, fresh.reset) == (1, clock.now + 60)


def test_storage_failure_is_503_and_lets_nothing_through(app, client, api_key, monkeypatch):
    from limits.errors import StorageError

    def fail(*args, **kwargs):
        raise StorageError(ConnectionError("redis is down"))

    monkeypatch.setattr(app.extensions["ratelimit"].storage, "incr", fail)
    monkeypatch.setattr(app.extensions["ratelimit"], "count_hit", fail)
    response = client.get("/api/v1/protected/test", headers={"X-API-Key": api_key})
    assert response.status_code == 503
    assert response.get_json()["error"]["code"] == "service_unavailable"
    # The refusal is recorded as the key's 503, but counts nothing against total_requests.
    assert app.extensions["usage"].pending == {(key_id(api_key), "/api/v1/protected/test", 503, False, False): 1}


ENDPOINT = "/api/v1/protected/test"


def key_id(secret):
    from keys import keyformat

    return ApiKey.get(ApiKey.key_hash == keyformat.hash_key(secret)).id


def test_usage_counter_flushes_in_one_go(app, user, pro_key):
    counter = usage.UsageCounter(db.obj, interval=3600)
    kid = key_id(pro_key)
    for _ in range(7):
        counter.add(kid, ENDPOINT, 200, True)
    assert counter.total(kid) == 7
    assert ApiKey.get_by_id(kid).total_requests == 0
    counter.flush()
    assert counter.pending == {}
    assert ApiKey.get_by_id(kid).total_requests == 7
    assert counter.total(kid) == 7
    counter.close()


def test_usage_counter_adds_hourly_counts_in_the_same_flush(app, user, api_key, pro_key):
    counter = usage.UsageCounter(db.obj, interval=3600)
    dev, live = key_id(api_key), key_id(pro_key)
    for kid, count in [(dev, 2), (live, 5)]:
        for _ in range(count):
            counter.add(kid, ENDPOINT, 200, True)
    counter.flush()
    counter.add(live, ENDPOINT, 200, True)
    counter.close()
    hour = start_of_hour(utcnow())
    rows = {(row.api_key_id, row.hour, row.endpoint, row.status): row.requests for row in UsageHour.select()}
    assert rows == {(dev, hour, ENDPOINT, 200): 2, (live, hour, ENDPOINT, 200): 6}


def fail_statements_starting(monkeypatch, prefix):
    """Make the database raise OperationalError for SQL starting with prefix, alone or in a batch."""
    import peewee

    class FailingCursor:
        def __init__(self, cursor):
            self.cursor = cursor

        def executemany(self, sql, rows):
            if sql.startswith(prefix):
                raise peewee.OperationalError("disk I/O error")
            return self.cursor.executemany(sql, rows)

        def __getattr__(self, name):
            return getattr(self.cursor, name)

    cursor = db.obj.cursor
    monkeypatch.setattr(db.obj, "cursor", lambda *args, **kwargs: FailingCursor(cursor(*args, **kwargs)))


def test_a_failed_hourly_write_rolls_back_the_lifetime_count(app, user, pro_key, monkeypatch):
    import peewee

    counter = usage.UsageCounter(db.obj, interval=3600)
    kid = key_id(pro_key)
    counter.add(kid, ENDPOINT, 200, True)
    with monkeypatch.context() as failing:
        fail_statements_starting(failing, "INSERT INTO usage_hours")
        with pytest.raises(peewee.OperationalError):
            counter.flush()
    assert ApiKey.get_by_id(kid).total_requests == 0
    counter.close()
    assert ApiKey.get_by_id(kid).total_requests == 1
    assert UsageHour.get(UsageHour.api_key == kid).requests == 1


def test_usage_counter_keeps_counts_when_the_write_fails(app, user, pro_key, monkeypatch):
    import peewee

    counter = usage.UsageCounter(db.obj, interval=3600)
    kid = key_id(pro_key)
    for _ in range(4):
        counter.add(kid, ENDPOINT, 200, True)
    with monkeypatch.context() as failing:
        fail_statements_starting(failing, "UPDATE")
        with pytest.raises(peewee.OperationalError):
            counter.flush()
        counter.add(kid, ENDPOINT, 200, True)
    counter.close()
    assert ApiKey.get_by_id(kid).total_requests == 5


def five_keys(user):
    from orgs import keyactions

    return [keyactions.issue_key(user, f"Key {index}", "production", "pro")[0].id for index in range(5)]


def test_a_flush_writes_its_keys_in_slices_and_yields_between(app, user, monkeypatch):
    monkeypatch.setattr(usage, "KEYS_PER_TRANSACTION", 2)
    counter = usage.UsageCounter(db.obj, interval=3600)
    keys = five_keys(user)
    for count, kid in enumerate(keys, start=1):
        for _ in range(count):
            counter.add(kid, ENDPOINT, 200, True)
    events = []
    write = counter.write
    monkeypatch.setattr(usage, "pause_between_transactions",
                        lambda: events.append("yield" if not db.obj.in_transaction() else "yield in a transaction"))
    monkeypatch.setattr(counter, "write", lambda batch, *rest: (
        events.append((sorted({kid for kid, *_ in batch}), db.obj.in_transaction())), write(batch, *rest)))
    counter.flush()
    assert events == [(keys[0:2], True), "yield", (keys[2:4], True), "yield", (keys[4:5], True)]
    assert [ApiKey.get_by_id(kid).total_requests for kid in keys] == [1, 2, 3, 4, 5]
    counter.close()


def test_a_failed_slice_keeps_its_counts_and_those_after_it_and_nothing_is_counted_twice(app, user, monkeypatch):
    import peewee

    monkeypatch.setattr(usage, "KEYS_PER_TRANSACTION", 2)
    counter = usage.UsageCounter(db.obj, interval=3600)
    keys = five_keys(user)
    for kid in keys:
        counter.add(kid, ENDPOINT, 200, True)
        counter.add(kid, ENDPOINT, 429, False)
    write = counter.write

    def fail_on_the_fourth_key(batch, *rest):
        write(batch, *rest)
        if any(kid == keys[3] for kid, *_ in batch):
            raise peewee.OperationalError("disk I/O error")

    monkeypatch.setattr(counter, "write", fail_on_the_fourth_key)
    with pytest.raises(peewee.OperationalError):
        counter.flush()
    # The first slice was written; the second was rolled back and waits with the third.
    assert [ApiKey.get_by_id(kid).total_requests for kid in keys] == [1, 1, 0, 0, 0]
    assert {kid for kid, *_ in counter.pending} == set(keys[2:]) and sum(counter.pending.values()) == 6
    monkeypatch.setattr(counter, "write", write)
    counter.close()
    assert [ApiKey.get_by_id(kid).total_requests for kid in keys] == [1] * 5
    rows = collections.Counter()
    for row in UsageHour.select():
        rows[row.api_key_id, row.status] += row.requests
    assert rows == {(kid, status): 1 for kid in keys for status in (200, 429)}


def test_usage_counter_is_exact_under_concurrent_adds_and_flushes(app, user, pro_key):
    counter = usage.UsageCounter(db.obj, interval=0.01)
    counter.start()
    kid = key_id(pro_key)

    def add_many():
        for _ in range(2000):
            counter.add(kid, ENDPOINT, 200, True)

    threads = [threading.Thread(target=add_many) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    counter.close()
    assert ApiKey.get_by_id(kid).total_requests == 16000


def test_periodic_flush_writes_without_requests(app, user, pro_key):
    counter = usage.UsageCounter(db.obj, interval=0.01)
    counter.start()
    kid = key_id(pro_key)
    counter.add(kid, ENDPOINT, 200, True)
    for _ in range(500):
        if ApiKey.get_by_id(kid).total_requests == 1:
            break
        threading.Event().wait(0.01)
    assert ApiKey.get_by_id(kid).total_requests == 1
    counter.close()


def test_a_keys_window_is_limits_own_key_made_once_per_kept_key(app, user, pro_key, monkeypatch):
    limiter = app.extensions["ratelimit"]
    key = ApiKey.get_by_id(key_id(pro_key))
    item, = limiter.tiers[key.rate_limit_tier]
    assert limiter.count_request(key, Note(app, None)).remaining == item.amount - 1
    # The same name as limits gives it, so windows already in Redis keep their counts.
    assert key.limit_plan.windows == [ratelimit.Window(item, item.key_for(f"key:{key.id}"), key.rate_limit_tier)]
    assert key.limit_plan.simple

    def made_again(*identifiers):
        raise AssertionError("the window key was made again")

    monkeypatch.setattr(type(item), "key_for", made_again)
    assert limiter.count_request(key, Note(app, None)).remaining == item.amount - 2
    monkeypatch.undo()
    # A key moved to another tier (read again, so a new object) counts in that tier's window.
    key.rate_limit_tier = "free"
    key.limit_plan = None
    other, = limiter.tiers["free"]
    assert limiter.count_request(key, Note(app, None)).limit == other.amount
    assert key.limit_plan.windows[0][:2] == (other, other.key_for(f"key:{key.id}"))


@pytest.mark.parametrize("organisation_rate", [None, "60/minute"])
def test_a_kept_key_s_plan_adds_no_object_for_collections_beyond_its_windows(app, user, organisation_rate,
                                                                               monkeypatch):
    """A key in the key cache keeps its plan, and every full collection walks each object the
    collector tracks: the plan's storage windows, plain values, are tracked by none once
    collections have seen them, and its threshold marks are those of every plan of its amounts."""
    limiter = app.extensions["ratelimit"]
    monkeypatch.setattr(limiter, "organisation_rate", organisation_rate and ratelimit.limit_item((60, "minute")))
    monkeypatch.setitem(limiter.tiers, "two", ratelimit.limit_items("10/second+1000/hour"))
    plans = []
    for name in ("one", "another"):
        key, _ = keyactions.issue_key(user, name, "development")
        key.rate_limit_tier = "two"
        plans.append(limiter.plan_for(key))
    plan, other = plans
    assert len(plan.storage_windows) == len(plan.marks) == (3 if organisation_rate else 2)
    assert plan.storage_windows != other.storage_windows
    assert plan.marks is other.marks
    assert plan.marks[:2] == (thresholds.marks(10), thresholds.marks(1000))
    gc.collect()
    gc.collect()  # a tuple of tuples: the inner ones are let go first
    assert not gc.is_tracked(plan.storage_windows)


@pytest.mark.parametrize("organisation_rate", [None, "60/minute"])
def test_on_a_redis_cluster_a_request_s_windows_share_one_slot(app, user, organisation_rate, monkeypatch):
    """Tagged with the organisation where it has a window, else with the key: never the two
    slots that a cluster refuses to give one script (CROSSSLOT)."""
    limiter = app.extensions["ratelimit"]
    monkeypatch.setattr(limiter, "windows", types.SimpleNamespace(cluster=True))
    monkeypatch.setattr(limiter, "organisation_rate", organisation_rate and ratelimit.limit_item((60, "minute")))
    monkeypatch.setitem(limiter.tiers, "two", ratelimit.limit_items("10/second+1000/hour"))
    key, _ = keyactions.issue_key(user, "two windows", "development")
    key.rate_limit_tier = "two"
    plan = limiter.plan_for(key)
    assert len(plan.windows) == (3 if organisation_rate else 2)
    tag = f"{{org:{key.org_id}}}" if organisation_rate else f"{{key:{key.id}}}"
    assert all(tag in window.key for window in plan.windows)
    assert len({key_slot(f"LIMITS:{window.key}".encode()) for window in plan.windows}) == 1


def test_on_one_redis_a_key_s_windows_keep_limits_own_names(app, user):
    key, _ = keyactions.issue_key(user, "plain", "development")
    assert "{" not in app.extensions["ratelimit"].plan_for(key).windows[0].key


def test_the_hot_path_locks_are_the_os_threads_own_under_gevent_too():
    # gevent's patched locks cost 5,000-9,000 instructions a use; a library change that made
    # store/locks.py hand one out again would go unnoticed in a run without gevent.
    check = ("from gevent import monkey; monkey.patch_all()\n"
             "import threading\nfrom store import limitstorage, locks\n"
             "assert type(threading.Lock()).__module__.startswith('gevent')\n"
             "for lock in (locks.short_lock(), locks.short_rlock(), limitstorage.SharedLock().lock):\n"
             "    assert type(lock).__module__ == '_thread', type(lock)\n")
    subprocess.run([sys.executable, "-c", check], cwd=ROOT, check=True)
