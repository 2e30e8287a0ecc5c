"""The `limits` library's storages, adapted where its own behaviour costs too much (Redis's, in
store/rediswindows.py), and the three things the limiter asks of a storage: count a request in a
window, in several windows at once or in none, and take one back. This module reaches into limits
(MemoryStorage's private sweep); tests/unit/store/test_limitstorage.py fails loudly if a new version moves
what it relies on."""

import math
import threading
import time

from limits.errors import ConfigurationError
from limits.storage import MemoryStorage, RedisClusterStorage, storage_from_string
from werkzeug.exceptions import ServiceUnavailable

from settings import ConfigError
from store import locks
from store.rediswindows import redis_windows


class LimitStorageUnavailable(ServiceUnavailable):
    """The limit storage cannot be reached (storage_error: what the storage raised, where known);
    limits fail closed (HTTP 503, with a Retry-After of about a Redis failover's time)."""

    description = "The rate-limit storage is unavailable; try again shortly."
    RETRY_AFTER = 5

    def __init__(self, storage_error=None):
        super().__init__(retry_after=self.RETRY_AFTER)
        self.storage_error = storage_error


class SweptMemoryStorage(MemoryStorage):
    """limits' memory storage, with its sweep of expired windows run every few seconds instead of
    10 ms after any hit: each sweep walks every key, which starves a busy worker with many keys.
    Reads still expire a stale window on the spot, so counts are unaffected."""

    SWEEP_INTERVAL = 10.0
    SWEEP_SLICE = 2000

    def __init__(self, **options):
        # A flag rather than limits' timer.is_alive(), which under gevent takes a lock: 4 % of a
        # keyed request. limits' constructor starts the first sweep.
        self.sweep_scheduled = True
        super().__init__(**options)
        self.locks = SharedLock()

    def hit(self, key, expiry):
        """Count one request in key's window; return (count, epoch seconds when the window ends).
        limits' incr then get_expiry, in one step: an expired window starts afresh, as does one
        whose count a give_back brought to 0."""
        self._MemoryStorage__schedule_expiry()
        with self.locks.lock:
            now = time.time()
            if self.expirations.get(key, 0) <= now:
                self.storage.pop(key, None)
                self.expirations.pop(key, None)
            count = self.storage[key] + 1
            self.storage[key] = count
            if count == 1:
                self.expirations[key] = now + expiry
            return count, self.expirations[key]

    def hit_all(self, windows, generation=None):
        """Count one request in every window [(key, expiry, amount), ...] or, when one is used up,
        in none; return (index of the first used-up window or -1, [(count, window end), ...]),
        the counts after this request when admitted, as they stand when refused."""
        self._MemoryStorage__schedule_expiry()
        with self.locks.lock:
            now = time.time()
            counts = []
            for key, expiry, _ in windows:
                if self.expirations.get(key, 0) <= now:
                    self.storage.pop(key, None)
                    self.expirations.pop(key, None)
                counts.append((self.storage[key], self.expirations.get(key, now + expiry)))
            refused = next((i for i, ((count, _), (_, _, amount)) in enumerate(zip(counts, windows))
                            if count >= amount), -1)
            if refused >= 0:
                return refused, counts
            for key, expiry, _ in windows:
                self.storage[key] += 1
                self.expirations.setdefault(key, now + expiry)
            return -1, [(self.storage[key], self.expirations[key]) for key, _, _ in windows]

    def take_back(self, windows):
        """Take one request back out of each window [(key, end, slack), ...] it was counted in, where
        the window is still that one (it ends by end + slack: a window started since ends later)."""
        with self.locks.lock:
            now = time.time()
            for key, end, slack in windows:
                if now < self.expirations.get(key, 0) <= end + slack and self.storage[key] > 0:
                    self.storage[key] -= 1

    def _MemoryStorage__schedule_expiry(self):
        if not self.sweep_scheduled:
            self.sweep_scheduled = True
            self.timer = threading.Timer(self.SWEEP_INTERVAL, self._MemoryStorage__expire_events)
            self.timer.daemon = True
            self.timer.start()

    def close(self):
        """Cancel a scheduled sweep, so the storage leaves no thread behind (tests make many)."""
        self.timer.cancel()

    def _MemoryStorage__expire_events(self):
        """Drop expired windows a slice of keys at a time, letting requests run in between:
        limits walks every key in one go, which held the worker for 20 ms at 100,000 keys. Only
        fixed windows live here, so limits' moving-window events need no sweep."""
        try:
            keys = list(self.expirations)
            for start in range(0, len(keys), self.SWEEP_SLICE):
                with self.locks.lock:
                    now = time.time()
                    for key in keys[start:start + self.SWEEP_SLICE]:
                        if self.expirations.get(key, math.inf) <= now:
                            del self.expirations[key]
                            self.storage.pop(key, None)
                time.sleep(0)  # under gevent, a yield to the waiting requests
        finally:
            self.sweep_scheduled = False


class SharedLock:
    """Stands in for limits' table of one lock per key with one lock for all keys. The sections
    it guards are a few dict operations that never wait (so a real lock: store/locks.py); a lock per key
    left three objects per key for every full garbage collection to walk: pauses of 100 ms with
    60,000 keys."""

    def __init__(self):
        self.lock = locks.short_rlock()

    def __getitem__(self, key):
        return self.lock

    def pop(self, key, default=None):
        return default

    def clear(self):
        """Nothing to forget: no key has a lock of its own."""


class ClusterStorage(RedisClusterStorage):
    """limits' Redis Cluster storage, with redis-py's own cluster errors among the storage's failures:
    a cluster none of whose nodes answers raises RedisClusterException, which is no RedisError,
    and would reach the client as a 500 rather than the limits' 503."""

    @property
    def base_exceptions(self):
        # redis itself, as limits loads it: `import app` leaves redis unloaded where it is not used.
        return self.dependency.RedisError, self.dependency.exceptions.RedisClusterException


def open_storage(url):
    """Return the limits storage for a storage URI; its errors surface as StorageError. A URI the
    storage refuses (a missing driver, a bad option) raises ConfigError."""
    if url.strip() == "memory://":
        return SweptMemoryStorage(wrap_exceptions=True)
    options = {}
    if url.startswith(("redis://", "rediss://", "redis+")):
        # Without timeouts a Redis that hangs would hang every protected request with it.
        options = {"socket_timeout": 1, "socket_connect_timeout": 1}
    try:
        if url.startswith("redis+cluster://"):
            return ClusterStorage(url, wrap_exceptions=True, **options)
        return storage_from_string(url, wrap_exceptions=True, **options)
    except (ConfigurationError, ValueError) as error:
        # limits and redis-py name what is wrong without quoting the URI (which may hold a password).
        raise ConfigError(f"RATELIMIT_STORAGE_URL cannot be used: {error}") from None


def window_counter(storage, windows=None):
    """Return the storage's hit(key, expiry) -> (count, window end): one round trip on Redis
    (through `windows`, the storage's RedisWindows, when the caller already made it)."""
    windows = windows or redis_windows(storage)
    if windows is not None:
        return windows.hit
    if isinstance(storage, SweptMemoryStorage):
        return storage.hit

    def hit(key, expiry):
        return storage.incr(key, expiry), storage.get_expiry(key)

    return hit


def window_admitter(storage, windows=None):
    """Return the storage's hit_all(windows, generation=None) (SweptMemoryStorage.hit_all): atomic
    in memory and on Redis (a Redis Cluster too, where a request's windows share one slot: the
    limiter gives them one hash tag); with limits' other storages each window is counted,
    and taken back again when one is over, so a refused request can briefly hold a place that a
    concurrent one is refused for."""
    windows = windows or redis_windows(storage)
    if windows is not None:
        return windows.hit_all
    if isinstance(storage, SweptMemoryStorage):
        return storage.hit_all

    def hit_all(limited, generation=None):
        counts = [(storage.incr(key, expiry), storage.get_expiry(key)) for key, expiry, _ in limited]
        refused = next((i for i, ((count, _), (_, _, amount)) in enumerate(zip(counts, limited))
                        if count > amount), -1)
        if refused < 0:
            return -1, counts
        for key, expiry, _ in limited:
            storage.incr(key, expiry, amount=-1)
        return refused, [(count - 1, end) for count, end in counts]

    return hit_all


def window_taker(storage, windows=None):
    """Return the storage's take_back(windows) (SweptMemoryStorage.take_back): one step in memory and
    on Redis; elsewhere a read of each window, then its decrement."""
    windows = windows or redis_windows(storage)
    if windows is not None:
        return windows.take_back
    if isinstance(storage, SweptMemoryStorage):
        return storage.take_back

    def take_back(counted):
        now = time.time()
        for key, end, slack in counted:
            if storage.get(key) > 0 and now < storage.get_expiry(key) <= end + slack:
                # The window's own end as the expiry: should two take-backs race a count of 1 below 0,
                # limits' incr would otherwise start the window afresh with this expiry.
                if storage.incr(key, max(1, math.ceil(end - now)), amount=-1) < 0:
                    storage.incr(key, max(1, math.ceil(end - now)))

    return take_back
