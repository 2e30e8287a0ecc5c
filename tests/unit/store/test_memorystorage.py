"""The adapter over limits' memory storage: its rare sweep in slices, reads that expire at once,
no lock per key, and a hit that answers as limits' incr and get_expiry would. It reaches into
limits; these tests fail if it moves (the Redis adapter: test_limitstorage.py)."""

import gc
import threading

from clock import fake_time
from limits.storage import MemoryStorage

from store import limitstorage


def FakeClock(monkeypatch):
    # limits' memory storage and the adapter over it read the same clock.
    return fake_time(monkeypatch, "limits.storage.memory", "store.limitstorage")


def test_limits_still_has_what_the_memory_adapter_overrides():
    # SweptMemoryStorage replaces these private methods by their mangled names; renamed, the
    # overrides would be silently ignored and limits' sweep after every hit would come back.
    assert callable(MemoryStorage._MemoryStorage__schedule_expiry)
    assert callable(MemoryStorage._MemoryStorage__expire_events)
    storage = limitstorage.SweptMemoryStorage()
    storage.timer.join()
    storage.incr("k", 60)
    assert storage.timer.interval == limitstorage.SweptMemoryStorage.SWEEP_INTERVAL
    storage.timer.cancel()


def test_memory_storage_sweeps_rarely_but_reads_expire_at_once(monkeypatch):
    clock = FakeClock(monkeypatch)
    storage = limitstorage.SweptMemoryStorage()
    storage.timer.join()  # the one sweep limits schedules on construction
    for i in range(100):
        storage.incr(f"k{i}", 1)
    assert storage.timer.interval == limitstorage.SweptMemoryStorage.SWEEP_INTERVAL
    assert storage.timer.daemon
    clock.now += 1
    assert storage.get("k1") == 0
    assert len(storage.storage) == 99
    storage._MemoryStorage__expire_events()
    assert len(storage.storage) == 0
    storage.timer.cancel()


def test_memory_storage_sweeps_in_slices_and_keeps_live_windows(monkeypatch):
    clock = FakeClock(monkeypatch)
    storage = limitstorage.SweptMemoryStorage()
    storage.timer.join()
    for i in range(5000):
        storage.incr(f"old{i}", 1)
    clock.now += 1
    for i in range(10):
        storage.incr(f"new{i}", 60)
    yields, sweeper = [], threading.get_ident()

    def sleep(seconds):
        # Only this thread's: another test's sweep timer may still run in this module.
        if threading.get_ident() == sweeper:
            yields.append(seconds)

    monkeypatch.setattr(clock, "sleep", sleep, raising=False)
    storage._MemoryStorage__expire_events()
    assert yields == [0, 0, 0]  # 5,010 keys in slices of 2,000
    assert sorted(storage.storage) == [f"new{i}" for i in range(10)]
    assert sorted(storage.expirations) == sorted(storage.storage)
    storage.timer.cancel()


def test_memory_storage_keeps_no_lock_per_key_and_stays_exact_across_threads():
    storage = limitstorage.SweptMemoryStorage()
    tracked_before = len(gc.get_objects())

    def hit_many(offset):
        for i in range(2000):
            storage.incr("shared", 60)
            storage.incr(f"own-{offset}-{i}", 60)

    threads = [threading.Thread(target=hit_many, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert storage.get("shared") == 8000
    assert len(storage.storage) == 8001
    # A lock per key would add ~3 tracked objects per key for every full collection to walk.
    assert len(gc.get_objects()) - tracked_before < 1000
    storage.timer.cancel()


def test_memory_hit_counts_and_reports_the_window_end(monkeypatch):
    clock = FakeClock(monkeypatch)
    storage = limitstorage.SweptMemoryStorage()
    hit = limitstorage.window_counter(storage)
    assert hit("w", 60) == (1, clock.now + 60)
    clock.now += 10
    assert hit("w", 60) == (2, clock.now + 50)
    clock.now += 50
    assert hit("w", 60) == (1, clock.now + 60)
    storage.timer.cancel()


def test_memory_hit_matches_limits_incr_and_get_expiry(monkeypatch):
    # SweptMemoryStorage.hit does limits' incr and get_expiry in one step; replayed against
    # limits' own storage, every answer must be the same (give_backs and expiries included).
    clock = FakeClock(monkeypatch)
    ours, theirs = limitstorage.SweptMemoryStorage(), MemoryStorage()
    steps = [("hit", "a", 60), ("hit", "a", 60), ("give_back", "a"), ("give_back", "a"), ("hit", "a", 60),
             ("wait", 30), ("hit", "a", 60), ("hit", "b", 10), ("wait", 10), ("hit", "b", 10), ("wait", 31),
             ("hit", "a", 60), ("hit", "a", 60)]
    for step in steps:
        if step[0] == "wait":
            clock.now += step[1]
        elif step[0] == "give_back":
            ours.incr(step[1], 60, amount=-1)
            theirs.incr(step[1], 60, amount=-1)
        else:
            expected = (theirs.incr(step[1], step[2]), theirs.get_expiry(step[1]))
            assert ours.hit(step[1], step[2]) == expected, step
    ours.timer.cancel()
    theirs.timer.cancel()
