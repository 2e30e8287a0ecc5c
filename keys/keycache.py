"""The API keys a worker has looked up, kept in memory so that a keyed request costs no database
round trip, and the signal that tells the worker when a kept key may be stale: a revoked, rolled
or deleted key still fails from the very next request, on every process.

- SQLite: a generation in the database that triggers move with every change to a key, read
  again whenever the connection's `PRAGMA data_version` (another connection committed: the CLI,
  another worker) or its `total_changes` (this one wrote) has moved, checked before each lookup.
- PostgreSQL with Redis limits: the key generation in Redis, a token that every change to a key
  replaces after it commits. The script that counts the request reads it in the same round trip
  and counts nothing when the key was read under another generation (limitstorage.RedisWindows).
  On Redis Cluster each hash tag of the keys' windows has its own, in their slot: a change moves
  its keys' tags' generations, and a key is read after its tag's (TaggedKeyCache).
- PostgreSQL with limits in memory: nothing cheap tells one process of another's change, so
  every request reads its key from the database.

With Redis, a kept key is also read again after MAX_AGE seconds, which bounds what a change made
outside the service (an UPDATE by hand, a CLI run without RATELIMIT_STORAGE_URL) can leave stale.
SQLite's triggers see those changes too, so there a kept key has no age limit."""

import collections
import contextlib
import contextvars
import logging
import math
import time

from flask import current_app
from gevent.event import AsyncResult
from limits.errors import StorageError
from peewee import SqliteDatabase

from keys import imported
from keys.lookup import find_active_key
from models import db
from store.connections import greenlets_share_thread
from store.limitstorage import LimitStorageUnavailable

log = logging.getLogger(__name__)

SIZE = 10_000
MAX_AGE = 10.0
ANNOUNCE_ATTEMPTS = 3

# generation: what the worker's current generation must equal for the entry to be used;
# confirms: what the count must confirm (keep's).
Entry = collections.namedtuple("Entry", "key generation usable_until read_at confirms")
READ_FAILED = object()


class ChangeNotAnnounced(LimitStorageUnavailable):
    """A key change is committed, but Redis could not be told of it (HTTP 503)."""

    description = (f"The change is saved, but the rate-limit storage could not be told of it; other servers may "
                   f"accept the key as it was for up to {MAX_AGE:.0f} seconds.")
    # Saved already: nothing to try again.
    RETRY_AFTER = None


class SqliteGeneration:
    """The database's key generation (store/schema.py's keep_key_generation: triggers move it with
    every change to a key), read again only when the connection's `PRAGMA data_version` or its
    `total_changes` says something was committed since the last read, by another connection or
    by this one. Read before a lookup, so a key is never older than its tag; a usage flush moves
    the counters but not the generation, so it leaves every kept key usable."""

    confirmed_by_count = False

    def __init__(self, database):
        self.database = database
        # ((connection, data_version, total_changes), the generation read then), replaced whole.
        self.last_read = (None, None)

    def current(self, looks=None):
        """looks: the request's data_versions (ops/note.py), where it reads the counter once: this
        look is a keyed request's first, kept there for its kept answers (store/kept.py's
        sqlite_mark, written out: one call fewer on every keyed request)."""
        connection = self.database.connection()
        data_version = connection.execute("PRAGMA data_version").fetchone()[0]
        if looks is not None:
            looks[connection] = data_version
        # The connection itself, because data_version counts per connection (threads, outside gevent,
        # each have their own).
        seen = (connection, data_version, connection.total_changes)
        last_seen, generation = self.last_read
        if seen != last_seen:
            generation = connection.execute("SELECT generation FROM key_generation").fetchone()[0]
            self.last_read = (seen, generation)
        return generation

    def announce(self, keys):
        """Nothing to tell: every connection sees the commit through its own counters."""

    def latest(self):
        return self.current()


class RedisGeneration:
    """The key generation kept in Redis beside the rate-limit windows. The latest one seen is the
    tag of a key read now; the count confirms it (count_request's generation)."""

    confirmed_by_count = True

    def __init__(self, windows):
        self.windows = windows

    def current(self, looks=None):
        return self.windows.generation

    def announce(self, keys):
        generation_keys = self.generation_keys(keys)
        for _ in range(ANNOUNCE_ATTEMPTS):
            try:
                return self.windows.announce_key_change(generation_keys)
            except StorageError as error:
                failure = error
        log.error("A key change is committed, but Redis could not be told: %s", failure.storage_error)
        raise ChangeNotAnnounced()

    def latest(self):
        """The generation as Redis holds it now (a round trip, not a database read): another
        instance's import counts from the next request here, before this worker counted any."""
        try:
            return self.windows.read_generation()
        except StorageError:
            return self.windows.generation

    def generation_keys(self, keys):
        """The generations a change to these keys moves besides the one every change moves: none."""
        return ()


class TaggedGeneration(RedisGeneration):
    """Redis Cluster's generations: one for each hash tag of the keys' windows (the limiter's
    hash_tag), in their slot, so that the script that counts a request checks the key's in the
    same call. A change moves the generations of its keys' tags."""

    def __init__(self, windows, limiter):
        super().__init__(windows)
        self.limiter = limiter

    def current(self, looks=None):
        """None: no generation stands for every key, each kept key carries its tag's."""
        return None

    def key_of(self, key):
        """The Redis key of the generation of the key's tag."""
        return self.windows.tagged_generation_key(self.limiter.hash_tag(key))

    def of(self, key):
        """(the Redis key, the token) of the generation of the key's tag, as Redis holds it now;
        raise StorageError when Redis cannot tell."""
        generation_key = self.key_of(key)
        return generation_key, self.windows.read_tagged_generation(generation_key)

    def generation_keys(self, keys):
        # Both of a key's tags, whatever ACCOUNT_RATE_LIMIT is here: a CLI run or an instance set
        # otherwise than the servers still moves the one they check.
        return sorted({self.windows.tagged_generation_key(tag) for key in keys for tag in self.limiter.hash_tags(key)})


class KeyCache:
    """Active keys by the hash of their secret, at most `size` (the one kept longest leaves first), each
    trusted while the generation it was read under is current, for at most `max_age` seconds.

    Under gevent, requests that miss the same key under the same generation wait for the one read
    already under way: when a busy key's entry ages out, every request in flight misses it at
    once, and 50 reads queued on PostgreSQL's pool of 10 connections put 100-200 ms into the p99."""

    def __init__(self, generation, first_use, size=SIZE, max_age=MAX_AGE):
        self.generation = generation
        self.forms = imported.DeclaredForms(generation.latest)
        self.first_use = first_use
        self.size = size
        self.max_age = max_age
        self.entries = {}
        self.reading = {} if greenlets_share_thread() else None

    def find(self, key_hash, secret=None, looks=None):
        """Return (the active ApiKey for this hash or None, the generation the count must confirm,
        or None when nothing needs confirming). With the secret, a key not kept is read only when the
        secret has a known form, and a key awaiting its first use is checked and rehashed. looks:
        the request's data_versions, which the look at the generation joins (SqliteGeneration)."""
        generation = self.generation.current(looks)
        entry = self.entries.get(key_hash)
        now = time.time()
        if (entry is not None and entry.generation == generation and now < entry.usable_until
                and now - entry.read_at < self.max_age):
            return entry.key, entry.confirms
        if secret is None:
            return self.read(key_hash, generation, now)
        if not self.forms.admit(secret):
            return None, None
        mark = self.forms.settles
        found = self.read(key_hash, generation, now)
        if found[0] is None and self.first_use.opens(secret, self.forms, mark):
            # A read that began before the rehash would find nothing: share only reads begun since.
            return self.read(key_hash, self.generation.current(), time.time(), kind="after first use")
        return found

    def reload(self, key_hash):
        """Read the key again after the count found its generation stale; return the ApiKey or None."""
        return self.read(key_hash, self.generation.current(), time.time())[0]

    def read(self, key_hash, generation, now, kind=None):
        key = self.read_once((key_hash, generation, kind))
        return self.keep(key_hash, key, generation, now, generation if self.generation.confirmed_by_count else None)

    def keep(self, key_hash, key, generation, now, confirms):
        """Keep the key read under the generation; return (it, what the count must confirm)."""
        if key is None:
            self.entries.pop(key_hash, None)
            return None, None
        if key_hash not in self.entries and len(self.entries) >= self.size:
            try:
                self.entries.pop(next(iter(self.entries), None), None)
            except RuntimeError:
                pass  # another thread (outside gevent) changed the entries meanwhile
        self.entries[key_hash] = Entry(key, generation, key.usable_until, now, confirms)
        return key, confirms

    def read_once(self, flight):
        """find_active_key of the flight's hash, shared with the requests that ask for the same
        flight (hash, generation, kind) while it is under way."""
        key_hash = flight[0]
        if self.reading is None:
            return find_active_key(key_hash)
        if flight in self.reading:
            key = self.reading[flight].get()
            # A read that failed is tried again by each waiter, so each gets its own error.
            return find_active_key(key_hash) if key is READ_FAILED else key
        self.reading[flight] = result = AsyncResult()
        key = READ_FAILED
        try:
            key = find_active_key(key_hash)
            return key
        finally:
            del self.reading[flight]
            result.set(key)

    def announce_change(self, keys):
        """Tell every process that these keys changed; call after the change is committed."""
        self.entries.clear()
        self.generation.announce(keys)


class TaggedKeyCache(KeyCache):
    """KeyCache on Redis Cluster: a kept key carries the generation of its tag, which the count
    checks; a key not kept is read after that generation (as on one Redis after the latest one),
    so that a change committed before the read is never kept under the generation it moved. A key
    no entry names yet is read once to learn its tag, then again after its tag's generation."""

    def read(self, key_hash, generation, now, kind=None):
        outage = self.generation.limiter.outage
        if outage is not None and outage.recent():
            return self.unconfirmed(key_hash)
        entry = self.entries.get(key_hash)
        key = entry.key if entry is not None else self.read_once((key_hash, None, kind))
        tagged = None
        try:
            # A key that moved to another tag (its organisation) is read again after that tag's.
            while key is not None and (tagged is None or tagged[0] != self.generation.key_of(key)):
                tagged = self.generation.of(key)
                key = self.read_once((key_hash, tagged, kind))
        except StorageError as error:
            # The tag's generation lives with the key's windows, so the count cannot be made either.
            if outage is None:
                raise self.generation.limiter.logged(LimitStorageUnavailable(error.storage_error)) from None
            outage.failed(error.storage_error)
            return self.unconfirmed(key_hash)
        if outage is not None and tagged is not None:
            outage.answered()  # only a generation read is an answer: an unknown key asks nothing
        # Kept under no worker-wide generation (current() is None): the count confirms the tag's.
        return self.keep(key_hash, key, None, now, tagged)

    def unconfirmed(self, key_hash):
        """RATE_LIMIT_ON_STORAGE_FAILURE=open while the cluster cannot tell a generation: the key
        read now, alone (a read shared with one begun earlier could predate a change), kept for
        none, and admitted uncounted (ratelimit.py)."""
        self.entries.pop(key_hash, None)
        return find_active_key(key_hash), None


class Uncached:
    """Every lookup from the database: where no signal of another process's change is cheap."""

    def __init__(self, first_use):
        self.forms = imported.DeclaredForms(imported.clock_seconds)
        self.first_use = first_use

    def find(self, key_hash, secret=None, looks=None):
        """As KeyCache.find; looks is SQLite's, which this never serves."""
        if secret is not None and not self.forms.admit(secret):
            return None, None
        mark = self.forms.settles
        key = find_active_key(key_hash)
        if key is None and secret is not None and self.first_use.opens(secret, self.forms, mark):
            key = find_active_key(key_hash)
        return key, None

    def reload(self, key_hash):
        return find_active_key(key_hash)

    def announce_change(self, keys):
        """Nothing is kept, so nothing can be stale."""


def init_app(app):
    """Choose the cache for this database and limit storage (see the module's docstring)."""
    limiter = app.extensions["ratelimit"]
    windows, first_use = limiter.windows, imported.FirstUse(limiter)
    if isinstance(db.obj, SqliteDatabase):
        # Reading each key again every MAX_AGE would buy nothing here and cost a lot: with 10,000
        # keys asked for at random, one request in five read its key.
        cache = KeyCache(SqliteGeneration(db.obj), first_use, max_age=math.inf)
    elif windows is not None and windows.cluster:
        cache = TaggedKeyCache(TaggedGeneration(windows, limiter), first_use)
    elif windows is not None:
        cache = KeyCache(RedisGeneration(windows), first_use)
    else:
        cache = Uncached(first_use)
    app.extensions["keys"] = cache


# The announcements asked for inside announced_after_commit(): a list of their keys while one is
# open, else None.
held = contextvars.ContextVar("held_announcements", default=None)


def announce_change(*keys):
    """After a change to these keys (ApiKeys: their revocation, roll, deletion) is committed, or
    to none (an import): no process serves a key's old state, or misses a new key's form."""
    asked = held.get()
    if asked is not None:
        asked.append(keys)
        return
    current_app.extensions["keys"].announce_change(keys)


@contextlib.contextmanager
def announced_after_commit():
    """Enclose a transaction that changes keys through actions that announce each change: they are
    announced once, after the block (and the transaction) ended without an error. An announcement
    before the commit would let another process keep the key's old row under the new generation,
    and one that fails there would undo a change already made."""
    asked = []
    token = held.set(asked)
    try:
        yield
    finally:
        held.reset(token)
    if asked:
        announce_change(*(key for keys in asked for key in keys))
