"""The `limits` library's storages, adapted where its own behaviour costs too much. This module
reaches into limits (MemoryStorage's private sweep, RedisStorage's client and key prefix);
tests/test_limitstorage.py fails loudly if a new version moves what it relies on."""

import math
import secrets
import threading
import time

import gevent
from gevent.event import AsyncResult
from limits.errors import ConfigurationError, StorageError
from limits.storage import MemoryStorage, RedisClusterStorage, RedisStorage, storage_from_string

from store.connections import greenlets_share_thread
from serving.settings import ConfigError
from store import locks


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
            for key, expiry, amount in windows:
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
        return storage_from_string(url, wrap_exceptions=True, **options)
    except (ConfigurationError, ValueError) as error:
        # limits and redis-py name what is wrong without quoting the URI (which may hold a password).
        raise ConfigError(f"RATELIMIT_STORAGE_URL cannot be used: {error}") from None


class KeysChanged(Exception):
    """An API key changed (revoked, rolled, deleted) since the caller read the key it counts for:
    nothing was counted, and the caller must read the key again."""


class RedisWindows:
    """Counts requests in their windows on Redis, and reads when each window ends, in one round
    trip for every request waiting at that moment: limits' RedisStorage takes two round trips per
    request (its incr script, then a TTL), and redis-py spends ~130 us of a worker's time on each
    call, so with 50 busy connections the requests waiting together share one script call. Each
    key is still counted atomically, in the order the requests came. The keys are limits' own
    (prefixed_key), so its get, incr and clear see the same windows.

    The same call reads the key generation: a random token that every change to an API key
    replaces (announce_key_change). A window counted for a key read under another generation is
    not counted, so a process that caches keys learns that one may be stale before it serves it,
    at no extra round trip (keys/keycache.py)."""

    # ARGV[1] is a fresh token, for a generation that does not exist yet (a new or emptied Redis),
    # or '' when no generation is kept (Redis Cluster: its key would live in another slot). Then
    # for each window: its length in ms and the generation its key was read under ('' for any).
    # PTTL < 0 is a new window (or, should one ever exist, a window without an expiry), whose
    # expiry is set here; an existing window keeps its end.
    SCRIPT = """
local first, generation = 1, ''
if ARGV[1] ~= '' then
    first = 2
    generation = redis.call('get', KEYS[1])
    if not generation then
        generation = ARGV[1]
        redis.call('set', KEYS[1], generation)
    end
end
local replies = {generation}
for i = first, #KEYS do
    local window = i - first + 1
    local expected = ARGV[2 * window + 1]
    local count, ttl = -1, 0
    if expected == '' or expected == generation then
        count = redis.call('incrby', KEYS[i], 1)
        ttl = redis.call('pttl', KEYS[i])
        if ttl < 0 then
            redis.call('pexpire', KEYS[i], ARGV[2 * window])
            ttl = tonumber(ARGV[2 * window])
        end
    end
    replies[2 * window] = count
    replies[2 * window + 1] = ttl
end
return replies
"""
    # Redis runs one script at a time: a bounded batch keeps each call to a fraction of a ms.
    MAX_BATCH = 256
    GENERATION_KEY = "api-keys-generation"

    def __init__(self, storage):
        self.storage = storage
        self.script = storage.get_connection().register_script(self.SCRIPT)
        self.admit_script = storage.get_connection().register_script(self.ADMIT_SCRIPT)
        # Redis Cluster refuses a script whose keys live in different slots: one window a call there,
        # and no generation.
        self.cluster = isinstance(storage, RedisClusterStorage)
        self.generation_key = None if self.cluster else storage.prefixed_key(self.GENERATION_KEY)
        # The generation of the latest reply: a key read now is at least as new as it. Until the
        # first reply, one that no reply matches, so keys read meanwhile are confirmed by a new read.
        self.generation = "none seen yet"
        self.waiting = []
        self.sender = None

    def hit(self, key, expiry, generation=None):
        """Count one request in key's window; return (count, epoch seconds when the window ends).
        With a generation: raise KeysChanged, counting nothing, unless it is still the current one."""
        window = (self.storage.prefixed_key(key), int(expiry * 1000), generation or "")
        if self.cluster or not greenlets_share_thread():
            return self.outcome(self.count([window])[0])
        if self.sender is None:
            # Nothing in flight: this request makes the call itself, sparing the switch to a sender
            # (~70 us); requests arriving meanwhile wait for a sender started after it.
            self.sender = gevent.getcurrent()
            try:
                return self.outcome(self.count([window])[0])
            finally:
                self.sender = gevent.spawn(self.send_waiting) if self.waiting else None
        result = AsyncResult()
        self.waiting.append((window, result))
        return self.outcome(result.get())

    @staticmethod
    def outcome(counted):
        if counted[0] < 0:
            raise KeysChanged()
        return counted

    # For a request with several windows: each is counted only when none is used up (hit_all). Not
    # batched: only keys with several windows, or with an account allowance, come this way.
    # ARGV[1] and KEYS[1] as in SCRIPT; ARGV[2] the generation the key was read under ('' for any);
    # then for each window its length in ms and its allowance. The reply: the generation, the
    # 1-based index of the first used-up window (0: admitted; -1: another generation), then each
    # window's count and ms left.
    ADMIT_SCRIPT = """
local first, generation = 1, ''
if ARGV[1] ~= '' then
    first = 2
    generation = redis.call('get', KEYS[1])
    if not generation then
        generation = ARGV[1]
        redis.call('set', KEYS[1], generation)
    end
end
if ARGV[2] ~= '' and ARGV[2] ~= generation then
    return {generation, -1}
end
local refused, counts, ttls = 0, {}, {}
for i = first, #KEYS do
    local window = i - first + 1
    local ttl = redis.call('pttl', KEYS[i])
    local count = tonumber(redis.call('get', KEYS[i]) or '0')
    if ttl < 0 then
        ttl = tonumber(ARGV[2 * window + 1])
    end
    if refused == 0 and count >= tonumber(ARGV[2 * window + 2]) then
        refused = window
    end
    counts[window], ttls[window] = count, ttl
end
if refused == 0 then
    for i = first, #KEYS do
        local window = i - first + 1
        counts[window] = redis.call('incrby', KEYS[i], 1)
        if redis.call('pttl', KEYS[i]) < 0 then
            redis.call('pexpire', KEYS[i], ARGV[2 * window + 1])
        end
    end
end
local replies = {generation, refused}
for window = 1, #counts do
    replies[2 * window + 1] = counts[window]
    replies[2 * window + 2] = ttls[window]
end
return replies
"""

    def hit_all(self, windows, generation=None):
        """SweptMemoryStorage.hit_all, atomic on Redis; raise KeysChanged, counting nothing, unless
        the generation (when given) is still the current one."""
        keys = [self.storage.prefixed_key(key) for key, _, _ in windows]
        args = [secrets.token_hex(8) if self.generation_key else "", generation or ""]
        for _, expiry, amount in windows:
            args += (int(expiry * 1000), amount)
        try:
            replies = self.admit_script(keys=[self.generation_key, *keys] if self.generation_key else keys, args=args)
        except self.storage.base_exceptions as error:
            raise StorageError(error) from error
        generation = replies[0]
        self.generation = generation.decode() if isinstance(generation, bytes) else generation
        if replies[1] < 0:
            raise KeysChanged()
        now = time.time()
        return replies[1] - 1, [(replies[i], now + replies[i + 1] / 1000) for i in range(2, len(replies), 2)]

    def send_waiting(self):
        while self.waiting:
            batch, self.waiting = self.waiting[:self.MAX_BATCH], self.waiting[self.MAX_BATCH:]
            try:
                outcomes = self.count([window for window, _ in batch])
            except BaseException as error:
                # Every waiter hears of it, whatever it was: none may wait for ever.
                failed = error if isinstance(error, StorageError) else StorageError(error)
                if not isinstance(error, Exception):
                    for _, result in batch:
                        result.set_exception(failed)
                    self.sender = gevent.spawn(self.send_waiting) if self.waiting else None
                    raise
                # Those that came meanwhile fail with it rather than wait for another timeout
                # each, behind the same broken link: a hung Redis costs every request ~1 s at most.
                batch, self.waiting = batch + self.waiting, []
                for _, result in batch:
                    result.set_exception(failed)
                continue
            for (_, result), outcome in zip(batch, outcomes):
                result.set(outcome)
        self.sender = None

    def count(self, windows):
        keys = [key for key, _, _ in windows]
        args = [secrets.token_hex(8) if self.generation_key else ""]
        for _, ms, generation in windows:
            args += (ms, generation)
        try:
            replies = self.script(keys=[self.generation_key, *keys] if self.generation_key else keys, args=args)
        except self.storage.base_exceptions as error:
            raise StorageError(error) from error
        now = time.time()
        generation = replies[0]
        self.generation = generation.decode() if isinstance(generation, bytes) else generation
        return [(replies[i], now + replies[i + 1] / 1000) for i in range(1, len(replies), 2)]

    def announce_key_change(self):
        """Give the key generation a new value, after a change to a key is committed: every process
        then reads again the keys it cached. Raise StorageError when Redis cannot be told."""
        token = secrets.token_hex(8)
        try:
            self.storage.get_connection().set(self.generation_key, token)
        except self.storage.base_exceptions as error:
            raise StorageError(error) from error
        self.generation = token


def redis_windows(storage):
    """Return RedisWindows for a Redis storage, else None."""
    return RedisWindows(storage) if isinstance(storage, RedisStorage) else None


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
    in memory and on Redis; elsewhere (Redis Cluster, whose windows of one request live in several
    slots, and the other storages of limits) each window is counted, and taken back again when one
    is over, so a refused request can briefly hold a place that a concurrent one is refused for."""
    windows = windows or redis_windows(storage)
    if windows is not None and not windows.cluster:
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
