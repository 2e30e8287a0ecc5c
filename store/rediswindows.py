"""Windows on Redis, counted by Lua scripts in one round trip, beside the key generation that
tells every process when a key it keeps may be stale. This module reaches into limits
(RedisStorage's client and key prefix); tests/unit/store/test_limitstorage.py fails loudly if a new version
moves what it relies on."""

import secrets
import time

import gevent
from gevent.event import AsyncResult
from limits.errors import StorageError
from limits.storage import RedisClusterStorage, RedisStorage

from store.connections import greenlets_share_thread


class KeysChanged(Exception):
    """An API key changed (revoked, rolled, deleted) since the caller read the key it counts for:
    nothing was counted, and the caller must read the key again."""


# Both scripts start here: the key generation, in KEYS[1] (made from the fresh token ARGV[1] when
# missing), or none when ARGV[1] is ''; `first` is the index of the first window. A generation made
# here lasts a day, so that a cluster's, one for each key or organisation counted, do not pile up;
# one gone is made afresh, and every worker then reads the keys it kept under it again.
GENERATION_SECONDS = 86400
GENERATION = f"""
local first, generation = 1, ''
if ARGV[1] ~= '' then
    first = 2
    generation = redis.call('get', KEYS[1])
    if not generation then
        generation = ARGV[1]
        redis.call('set', KEYS[1], generation, 'EX', {GENERATION_SECONDS})
    end
end
"""


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
    at no extra round trip (keys/keycache.py). On Redis Cluster, where a script's keys must share
    a slot, each hash tag of a key's windows (ratelimit.Limiter.hash_tag) has a generation of its
    own beside them: a generation there is (its Redis key, its token)."""

    # ARGV[1] is a fresh token, for a generation that does not exist yet (a new or emptied Redis),
    # or '' when no generation is read (Redis Cluster, for windows without a key's). Then
    # for each window: its length in ms and the generation its key was read under ('' for any).
    # PTTL < 0 is a new window (or, should one ever exist, a window without an expiry), whose
    # expiry is set here; an existing window keeps its end.
    SCRIPT = GENERATION + """local replies = {generation}
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
        self.take_back_script = storage.get_connection().register_script(self.TAKE_BACK_SCRIPT)
        self.read_script = storage.get_connection().register_script(GENERATION + "return generation")
        # Redis Cluster refuses a script whose keys live in different slots: a generation for each
        # hash tag there (tagged_generation_key), and only windows of one tag share a call; a
        # request's own windows share a slot (ratelimit.py's hash_tag) and go in one script.
        self.cluster = isinstance(storage, RedisClusterStorage)
        # The generation every change moves: the counts' own on one Redis, on a cluster the one
        # that tells of imports (latest in keys/keycache.py), in a slot of its own.
        self.latest_key = storage.prefixed_key(self.GENERATION_KEY)
        self.generation_key = None if self.cluster else self.latest_key
        # The generation of the latest reply: a key read now is at least as new as it. Until the
        # first reply, one that no reply matches, so keys read meanwhile are confirmed by a new read.
        self.generation = "none seen yet"
        # The Lanes with a call in flight, by the Redis key of the generation their calls check:
        # one Redis has one lane; a cluster one for each tag, so that each tag's requests share a
        # call while other tags' go on meanwhile.
        self.lanes = {}

    def hit(self, key, expiry, generation=None):
        """Count one request in key's window; return (count, epoch seconds when the window ends).
        With a generation: raise KeysChanged, counting nothing, unless it is still the current one."""
        generation_key, generation = self.split(generation)
        window = (self.storage.prefixed_key(key), int(expiry * 1000), generation)
        # On a cluster a window without a tag's generation shares no call.
        if not greenlets_share_thread() or (self.cluster and generation_key is None):
            return self.outcome(self.count([window], generation_key)[0])
        lane = self.lanes.get(generation_key)
        if lane is None:
            # Nothing in flight in this lane: this request makes the call itself, sparing the switch
            # to a sender (~70 us); requests arriving meanwhile wait for a sender started after it.
            self.lanes[generation_key] = lane = Lane()
            try:
                return self.outcome(self.count([window], generation_key)[0])
            except StorageError as error:
                fail_all(lane.waiting, error)
                raise
            finally:
                self.hand_on(generation_key, lane)
        result = AsyncResult()
        lane.waiting.append((window, result))
        return self.outcome(result.get())

    def hand_on(self, generation_key, lane):
        """After a call in the lane: a sender for the requests that came meanwhile, or the lane closed."""
        if lane.waiting:
            lane.sender = gevent.spawn(self.send_waiting, generation_key, lane)
        else:
            del self.lanes[generation_key]

    def split(self, generation):
        """(the Redis key of the generation to check, its token or ''), for a caller's generation."""
        if self.cluster:
            return generation or (None, "")
        return self.generation_key, generation or ""

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
    ADMIT_SCRIPT = GENERATION + """if ARGV[2] ~= '' and ARGV[2] ~= generation then
    return {generation, -1}
end
local refused, counts, ttls = 0, {}, {}
for i = first, #KEYS do
    local window = i - first + 1
    local ttl = redis.call('pttl', KEYS[i])
    local count = tonumber(redis.call('get', KEYS[i]) or '0')
    if ttl < 0 then
        ttl = tonumber(ARGV[2 * window + 1])
        if count > 0 then
            redis.call('pexpire', KEYS[i], ttl)
        end
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
        generation_key, generation = self.split(generation)
        args = [secrets.token_hex(8) if generation_key else "", generation]
        for _, expiry, amount in windows:
            args += (int(expiry * 1000), amount)
        # Each window's end from the time before the call: a reply read late then gives an end too
        # early, never one that take_back would confuse with the next window's.
        sent = time.time()
        try:
            replies = self.admit_script(keys=[generation_key, *keys] if generation_key else keys, args=args)
        except self.storage.base_exceptions as error:
            raise StorageError(error) from error
        self.seen(generation_key, replies[0])
        if replies[1] < 0:
            raise KeysChanged()
        return replies[1] - 1, [(replies[i], sent + replies[i + 1] / 1000) for i in range(2, len(replies), 2)]

    # Takes a request back out of each window it was counted in (take_back), where the window is
    # still that one: ARGV[i] is the most ms it may have left; a window gone (-2) or started since
    # (more time left) keeps its count, and none is ever taken below 0 or created.
    TAKE_BACK_SCRIPT = """
for i = 1, #KEYS do
    local ttl = redis.call('pttl', KEYS[i])
    if ttl > 0 and ttl <= tonumber(ARGV[i]) and tonumber(redis.call('get', KEYS[i]) or '0') > 0 then
        redis.call('decr', KEYS[i])
    end
end
return #KEYS
"""

    def take_back(self, windows):
        """SweptMemoryStorage.take_back, in one step on Redis."""
        now = time.time()
        args = [max(0, int((end + slack - now) * 1000)) for _, end, slack in windows]
        try:
            self.take_back_script(keys=[self.storage.prefixed_key(key) for key, _, _ in windows], args=args)
        except self.storage.base_exceptions as error:
            raise StorageError(error) from error

    def send_waiting(self, generation_key, lane):
        """Count the lane's waiting requests, MAX_BATCH a call, in the order they came."""
        waiting = lane.waiting
        while waiting:
            batch = waiting[:self.MAX_BATCH]
            del waiting[:self.MAX_BATCH]
            try:
                outcomes = self.count([window for window, _ in batch], generation_key)
            except BaseException as error:
                # Every waiter hears of it, whatever it was: none may wait for ever.
                failed = error if isinstance(error, StorageError) else StorageError(error)
                if not isinstance(error, Exception):
                    for _, result in batch:
                        result.set_exception(failed)
                    self.hand_on(generation_key, lane)
                    raise
                fail_all(batch, failed)
                fail_all(waiting, failed)
                continue
            for (_, result), outcome in zip(batch, outcomes):
                result.set(outcome)
        self.hand_on(generation_key, lane)

    def count(self, windows, generation_key=None):
        generation_key = generation_key or self.generation_key
        keys = [key for key, _, _ in windows]
        args = [secrets.token_hex(8) if generation_key else ""]
        for _, ms, generation in windows:
            args += (ms, generation)
        try:
            replies = self.script(keys=[generation_key, *keys] if generation_key else keys, args=args)
        except self.storage.base_exceptions as error:
            raise StorageError(error) from error
        now = time.time()
        self.seen(generation_key, replies[0])
        return [(replies[i], now + replies[i + 1] / 1000) for i in range(1, len(replies), 2)]

    def seen(self, generation_key, generation):
        """Keep the generation a script replied with, when it is the one every change moves."""
        if generation_key == self.latest_key:
            self.generation = decoded(generation)

    def read_generation(self):
        """The key generation as Redis holds it now; raise StorageError when Redis cannot tell."""
        try:
            return decoded(self.storage.get_connection().get(self.latest_key))
        except self.storage.base_exceptions as error:
            raise StorageError(error) from error

    def tagged_generation_key(self, tag):
        """The Redis key of a hash tag's generation, in the slot of the windows with that tag."""
        return self.storage.prefixed_key(f"{tag}{self.GENERATION_KEY}")

    def read_tagged_generation(self, generation_key):
        """The token of a tag's generation, made now when there is none (as a count would make it);
        raise StorageError when Redis cannot tell."""
        try:
            return decoded(self.read_script(keys=[generation_key], args=[secrets.token_hex(8)]))
        except self.storage.base_exceptions as error:
            raise StorageError(error) from error

    def announce_key_change(self, generation_keys=()):
        """Give the key generation a new value, and each tag's named (their Redis keys, on a
        cluster), after a change to a key is committed: every process then reads again the keys it
        cached under them. Raise StorageError when Redis cannot be told."""
        token = secrets.token_hex(8)
        try:
            if generation_keys:
                # A cluster's pipeline sends each node the commands of its own keys.
                pipeline = self.storage.get_connection().pipeline(transaction=False)
                for generation_key in generation_keys:
                    pipeline.set(generation_key, secrets.token_hex(8), ex=GENERATION_SECONDS)
                pipeline.set(self.latest_key, token)
                pipeline.execute()
            else:
                self.storage.get_connection().set(self.latest_key, token)
        except self.storage.base_exceptions as error:
            raise StorageError(error) from error
        self.generation = token


def decoded(generation):
    return generation.decode() if isinstance(generation, bytes) else generation


def fail_all(waiting, error):
    """Fail every request waiting in the list with the call's error, and empty it: those that came
    meanwhile fail with it rather than wait for another timeout each behind the same broken link,
    so a hung Redis costs every request ~1 s at most."""
    for _, result in waiting:
        result.set_exception(error)
    del waiting[:]


class Lane:
    """The requests waiting for a lane's call in flight, and the greenlet that sends them once it
    ends (None while the lane's first request makes its own call)."""

    __slots__ = ("waiting", "sender")

    def __init__(self):
        self.waiting = []
        self.sender = None


def redis_windows(storage):
    """Return RedisWindows for a Redis storage, else None."""
    return RedisWindows(storage) if isinstance(storage, RedisStorage) else None
