"""How many sockets each owner has open (a key's time sockets, an IP address's echo sockets): in
this process, or shared by every worker and instance through Redis."""

import collections
import logging
import time
import uuid

from werkzeug.exceptions import TooManyRequests

from store.limitstorage import LimitStorageUnavailable
from store.locks import short_lock

log = logging.getLogger(__name__)


class TooManyConnections(TooManyRequests):
    """The key already has its maximum of open time sockets (HTTP 429)."""

    error_code = "too_many_connections"


class SocketSlots:
    """Counts each owner's open sockets (a key's time sockets, an IP's echo sockets) in this process."""

    def __init__(self, per_owner, refusal=None):
        self.per_owner = per_owner
        self.refusal = refusal or f"This API key already has {per_owner} open time sockets; close one first."
        self.open = collections.Counter()

    def take(self, owner):
        """Reserve a slot for the owner and return its token, or raise TooManyConnections."""
        if self.open[owner] >= self.per_owner:
            raise TooManyConnections(self.refusal)
        self.open[owner] += 1
        return owner

    def give_back(self, owner, token):
        self.open[owner] -= 1
        if self.open[owner] <= 0:
            del self.open[owner]

    def refresh(self, slots):
        """Nothing to do: a process's own counts cannot outlive it."""


class SharedSocketSlots:
    """Counts each key's open time sockets in Redis, so the cap holds across workers and
    instances. A slot is a member of the key's sorted set, scored by its last heartbeat, so
    the slots of a worker that died expire instead of leaking."""

    STALE_SECONDS = 90
    HEARTBEAT_SECONDS = 30
    TAKE = """
        redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[2])
        if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then return 0 end
        redis.call('ZADD', KEYS[1], ARGV[1], ARGV[4])
        redis.call('EXPIRE', KEYS[1], ARGV[5])
        return 1
    """

    def __init__(self, client, per_key, redis_errors):
        # The limit storage's own failures (its base_exceptions): on a cluster, redis-py's cluster
        # errors too, which are no RedisError.
        self.redis_error = redis_errors
        self.client = client
        self.per_key = per_key
        self.take_script = client.register_script(self.TAKE)
        # Slots given back and not yet removed in Redis, and whether a caller is removing them.
        self.returning = []
        self.releasing = False
        self.returning_lock = short_lock()

    @staticmethod
    def name(key_id):
        return f"time-sockets:{key_id}"

    def take(self, key_id):
        """Reserve a slot for the key and return its token, or raise TooManyConnections."""
        token = uuid.uuid4().hex
        now = time.time()
        try:
            taken = self.take_script(keys=[self.name(key_id)],
                                     args=[now, now - self.STALE_SECONDS, self.per_key, token, self.STALE_SECONDS])
        except self.redis_error as error:
            log.error("Socket slots unavailable in Redis: %s", error)
            raise LimitStorageUnavailable() from None
        if not taken:
            raise TooManyConnections(f"This API key already has {self.per_key} open time sockets; close one first.")
        return token

    def give_back(self, key_id, token):
        """Free a slot in Redis. Sockets closed at once (a network cut, a client's restart) give back
        theirs together: one caller removes every slot waiting, a pipeline at a time, while the
        others only add theirs. One ZREM each would want a connection each, and past the client's
        pool of 100 all but a few were lost, their keys refused for up to STALE_SECONDS."""
        with self.returning_lock:
            self.returning.append((self.name(key_id), token))
            if self.releasing:
                return
            self.releasing = True
        try:
            while batch := self.take_returning():
                try:
                    with self.client.pipeline(transaction=False) as pipe:
                        for name, slot in batch:
                            pipe.zrem(name, slot)
                        pipe.execute()
                except self.redis_error as error:
                    log.warning("Could not free %d socket slots (they expire by themselves): %s", len(batch), error)
        except BaseException:
            # This caller was killed midway: the next one takes over what is left.
            with self.returning_lock:
                self.releasing = False
            raise

    def take_returning(self):
        """The slots waiting to be freed; when none, this caller stops releasing, in the same
        section, so a slot added meanwhile is never left for no one."""
        with self.returning_lock:
            batch, self.returning = self.returning, []
            if not batch:
                self.releasing = False
        return batch

    def refresh(self, slots):
        """Renew the heartbeat of this worker's open slots."""
        now = time.time()
        try:
            with self.client.pipeline(transaction=False) as pipe:
                for key_id, token in slots:
                    pipe.zadd(self.name(key_id), {token: now}, xx=True)
                    pipe.expire(self.name(key_id), self.STALE_SECONDS)
                pipe.execute()
        except self.redis_error as error:
            log.warning("Could not renew socket slots: %s", error)
