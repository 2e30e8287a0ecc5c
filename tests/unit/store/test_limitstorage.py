"""The adapters over limits' storages: the one round trip window count on Redis, shared by the
requests waiting together, and what every storage does alike (test_memorystorage.py: the memory
storage's sweep and shared lock). They reach into limits; these tests fail if it moves."""

import time

import gevent
import pytest
import redis
import services
from limits import RateLimitItemPerHour
from limits.errors import StorageError
from limits.storage import MemoryStorage, storage_from_string

import ratelimit
from store import limitstorage, rediswindows


@pytest.fixture
def redis_storage():
    url = services.redis_url()
    storage = storage_from_string(url, wrap_exceptions=True)
    yield storage
    redis.Redis.from_url(url).flushdb()


def test_a_keyed_request_costs_one_redis_round_trip(redis_storage, monkeypatch):
    limiter = ratelimit.Limiter(redis_storage, {}, None)
    item = RateLimitItemPerHour(100)
    limiter.hit(item, "warm", "free")  # loads the script
    commands = []
    # The pool's one idle connection, which the next call takes: this client's alone is counted.
    pool = redis_storage.get_connection().connection_pool
    connection = pool.get_connection()
    pool.release(connection)
    send = connection.send_command

    def counting_send(*args, **kwargs):
        commands.append(args[0])
        return send(*args, **kwargs)

    monkeypatch.setattr(connection, "send_command", counting_send)
    state = limiter.hit(item, "w", "free")
    assert commands == ["EVALSHA"]
    assert state.remaining == 99 and 3599 <= state.reset - time.time() <= 3600


def test_redis_hit_shares_limits_keys_and_sets_the_window_once(redis_storage):
    # limits' own get, incr and get_expiry must see the windows the script counts (give_back and
    # used_up use them): this fails if limits changes how it prefixes keys.
    hit = limitstorage.window_counter(redis_storage)
    before = time.time()
    count, end = hit("shared", 60)
    assert count == 1 and before + 59 <= end <= time.time() + 60
    assert redis_storage.get("shared") == 1
    assert redis_storage.incr("shared", 60) == 2
    count, second_end = hit("shared", 60)
    assert count == 3
    assert abs(second_end - end) < 0.5  # the window keeps its end
    assert abs(redis_storage.get_expiry("shared") - end) <= 1
    assert redis.Redis.from_url(services.redis_database()).ttl(redis_storage.prefixed_key("shared")) in (59, 60)


def test_redis_hit_gives_a_window_without_expiry_one(redis_storage):
    client = redis.Redis.from_url(services.redis_database())
    client.set(redis_storage.prefixed_key("stuck"), 5)
    count, end = limitstorage.window_counter(redis_storage)("stuck", 30)
    assert count == 6 and end > time.time() + 29
    assert 0 < client.ttl(redis_storage.prefixed_key("stuck")) <= 30


def test_redis_windows_end_and_start_afresh(redis_storage):
    hit = limitstorage.window_counter(redis_storage)
    assert hit("short", 0.3)[0] == 1
    assert hit("short", 0.3)[0] == 2
    time.sleep(0.4)
    assert hit("short", 0.3)[0] == 1


def test_redis_hit_fails_as_a_storage_error():
    storage = storage_from_string("redis://127.0.0.1:1", wrap_exceptions=True, socket_connect_timeout=1)
    hit = limitstorage.window_counter(storage)
    with pytest.raises(StorageError):
        hit("w", 60)


def test_other_storages_count_through_limits_own_calls():
    storage = MemoryStorage()
    hit = limitstorage.window_counter(storage)
    count, end = hit("w", 60)
    assert count == 1 and end > time.time() + 59
    assert hit("w", 60)[0] == 2


@pytest.fixture
def batching(redis_storage, monkeypatch):
    """RedisWindows as in a gevent worker, its round trip slowed so that requests pile up behind
    it (the sockets here are not gevent's, so a real call would block every greenlet)."""
    monkeypatch.setattr(rediswindows, "greenlets_share_thread", lambda: True)
    windows = rediswindows.RedisWindows(redis_storage)
    batches, real_count = [], windows.count

    def slow_count(found, generation_key=None):
        batches.append(len(found))
        gevent.sleep(0.01)
        return real_count(found, generation_key)

    monkeypatch.setattr(windows, "count", slow_count)
    return windows, batches


def test_requests_waiting_together_share_one_call_and_each_gets_its_own_count(batching, redis_storage):
    windows, batches = batching
    hits = [gevent.spawn(windows.hit, "shared" if i % 2 else f"own-{i}", 60) for i in range(300)]
    gevent.joinall(hits, timeout=60, raise_error=True)
    shared = sorted(hit.value[0] for i, hit in enumerate(hits) if i % 2)
    assert shared == list(range(1, 151))
    assert all(hit.value[0] == 1 for i, hit in enumerate(hits) if i % 2 == 0)
    assert redis_storage.get("shared") == 150
    # The first request goes alone; the rest wait behind it, at most MAX_BATCH a call.
    assert batches == [1, 256, 43]
    assert windows.lanes == {}


def test_a_failed_call_reaches_every_waiter_and_the_next_request_goes_through(batching, monkeypatch):
    windows, batches = batching
    calls = iter([None, StorageError(ConnectionError("down")), None])
    real_count = windows.count

    def sometimes_failing(found, generation_key=None):
        error = next(calls)
        if error:
            batches.append(len(found))
            raise error
        return real_count(found, generation_key)

    monkeypatch.setattr(windows, "count", sometimes_failing)
    hits = [gevent.spawn(windows.hit, "w", 60) for _ in range(20)]
    gevent.joinall(hits, timeout=60)
    assert all(hit.ready() for hit in hits)
    assert [type(hit.exception) for hit in hits] == [type(None)] + [StorageError] * 19
    assert windows.hit("w", 60)[0] == 2  # the failed call counted nothing; the next one works


def test_a_sender_killed_mid_call_fails_its_waiters_and_hands_over(batching):
    windows, batches = batching
    first = gevent.spawn(windows.hit, "w", 60)
    gevent.sleep(0)
    waiting = [gevent.spawn(windows.hit, "w", 60) for _ in range(5)]
    gevent.sleep(0.001)
    first.join(timeout=60)
    [lane] = windows.lanes.values()
    sender = lane.sender
    assert sender is not None and batches == [1, 5]
    later = gevent.spawn(windows.hit, "w", 60)
    gevent.sleep(0)
    sender.kill()
    gevent.joinall(waiting + [later], timeout=60)
    assert [type(hit.exception) for hit in waiting] == [StorageError] * 5
    assert later.value[0] == 2  # sent by the sender started in the killed one's place


def test_when_a_call_fails_everyone_waiting_fails_with_it_without_another_call(batching, monkeypatch):
    windows, batches = batching
    outcomes = iter(["count", "fail"])
    real_count = rediswindows.RedisWindows.count.__get__(windows)

    def count_then_fail(found, generation_key=None):
        batches.append(len(found))
        gevent.sleep(0.01)
        if next(outcomes, "fail") == "fail":
            raise StorageError(TimeoutError("Timeout reading from socket"))
        return real_count(found, generation_key)

    monkeypatch.setattr(windows, "count", count_then_fail)
    hits = [gevent.spawn(windows.hit, "w", 60) for _ in range(601)]
    gevent.joinall(hits, timeout=60)
    assert [type(hit.exception) for hit in hits] == [type(None)] + [StorageError] * 600
    assert batches == [1, 256]  # the 344 beyond the failed call were not sent behind it
    assert windows.lanes == {}


@pytest.mark.parametrize("storage_kind", ["memory", "redis"])
def test_hit_all_counts_every_window_or_none(storage_kind, request):
    storage = (limitstorage.SweptMemoryStorage() if storage_kind == "memory"
               else request.getfixturevalue("redis_storage"))
    admit = limitstorage.window_admitter(storage)
    windows = [("short", 60, 3), ("long", 3600, 10)]
    try:
        assert [admit(windows)[0] for _ in range(4)] == [-1, -1, -1, 0]
        # Refused by the short window: the long one still holds only the three admitted.
        assert storage.get("long") == 3
        refused, counts = admit([("long", 3600, 10), ("short", 60, 3)])
        assert refused == 1 and [count for count, _ in counts] == [3, 3]
        assert 3595 < counts[0][1] - time.time() <= 3600
        assert admit([("long", 3600, 4)]) == (-1, [(4, pytest.approx(counts[0][1], abs=1))])
    finally:
        if storage_kind == "memory":
            storage.close()


def test_redis_hit_all_counts_nothing_for_a_stale_key_generation(redis_storage):
    windows = rediswindows.redis_windows(redis_storage)
    admit = limitstorage.window_admitter(redis_storage, windows)
    admit([("kept", 60, 5)])
    current = windows.generation
    with pytest.raises(rediswindows.KeysChanged):
        admit([("kept", 60, 5)], "an older generation")
    assert redis_storage.get("kept") == 1
    assert admit([("kept", 60, 5)], current)[1][0][0] == 2


@pytest.mark.parametrize("storage_kind", ["memory", "redis"])
def test_take_back_leaves_a_window_started_since_and_never_goes_below_zero(storage_kind, request):
    storage = (limitstorage.SweptMemoryStorage() if storage_kind == "memory"
               else request.getfixturevalue("redis_storage"))
    admit, take_back = limitstorage.window_admitter(storage), limitstorage.window_taker(storage)
    try:
        _, [(_, end)] = admit([("held", 60, 5)])
        admit([("held", 60, 5)])
        take_back([("held", end, 30)])
        assert storage.get("held") == 1
        # The window the request was counted in ended; the one now running never held it.
        take_back([("held", end - 120, 30)])
        assert storage.get("held") == 1
        # A window that is gone is not made again at -1.
        take_back([("gone", end, 30)])
        assert storage.get("gone") == 0 and admit([("gone", 60, 1)])[0] == -1
    finally:
        if storage_kind == "memory":
            storage.close()


def test_redis_hit_all_gives_a_used_up_window_without_expiry_one(redis_storage):
    client = redis.Redis.from_url(services.redis_database())
    client.set(redis_storage.prefixed_key("stuck"), 2)
    refused, _ = limitstorage.window_admitter(redis_storage)([("stuck", 30, 2)])
    assert refused == 0 and 0 < client.ttl(redis_storage.prefixed_key("stuck")) <= 30


def test_a_reply_read_late_never_lets_take_back_reach_the_next_window(redis_storage):
    windows = rediswindows.redis_windows(redis_storage)
    counted = windows.admit_script

    def read_late(*args, **kwargs):
        replies = counted(*args, **kwargs)
        time.sleep(1.1)  # a busy worker comes back to the reply after 1.1 s of a 2 s window
        return replies

    windows.admit_script = read_late
    _, [(_, end)] = windows.hit_all([("late", 2, 5)])
    windows.admit_script = counted
    deadline = time.monotonic() + 10
    while redis_storage.get("late") and time.monotonic() < deadline:
        time.sleep(0.05)
    # The next window, with the places of five others: the late request's take-back is not its to make.
    assert [windows.hit_all([("late", 2, 5)])[0] for _ in range(5)] == [-1] * 5
    windows.take_back([("late", end, 1)])
    assert redis_storage.get("late") == 5


def test_two_take_backs_racing_on_other_storages_never_restart_the_window():
    class Racing(MemoryStorage):
        """limits' own storage (the read-then-decrement path), where another take-back runs between
        this one's read of the count and its decrement, as two processes on Redis Cluster may."""

        meanwhile = None

        def get(self, key):
            count = super().get(key)
            if self.meanwhile is not None:
                meanwhile, self.meanwhile = self.meanwhile, None
                meanwhile()
            return count

    storage = Racing()
    admit, take_back = limitstorage.window_admitter(storage), limitstorage.window_taker(storage)
    _, [(_, end)] = admit([("raced", 60, 5)])
    storage.meanwhile = lambda: take_back([("raced", end, 30)])
    take_back([("raced", end, 30)])
    assert storage.get("raced") == 0
    assert storage.get_expiry("raced") - time.time() > 55


def test_when_the_first_call_fails_those_waiting_behind_it_fail_with_it_without_another_call(batching, monkeypatch):
    windows, batches = batching

    def failing(found, generation_key=None):
        batches.append(len(found))
        gevent.sleep(0.01)
        raise StorageError(TimeoutError("Timeout reading from socket"))

    monkeypatch.setattr(windows, "count", failing)
    hits = [gevent.spawn(windows.hit, "w", 60) for _ in range(6)]
    gevent.joinall(hits, timeout=60)
    assert [type(hit.exception) for hit in hits] == [StorageError] * 6
    assert batches == [1] and windows.lanes == {}
