"""Keys another system issued, as a request meets them: the starts their imports declared, which let
a secret outside this service's own form through to the lookup, and the first use of a key kept
with a slow hash (bcrypt, argon2id), which checks the secret once and rehashes the key to SHA-256.

Every worker keeps the declared starts in memory, read again when they may have changed (the key
generation moved, keys/keycache.py), so a secret of no known form still costs no database read."""

import logging
import re
import threading
import time

from limits import RateLimitItemPerMinute
from werkzeug.exceptions import TooManyRequests

from keys.keyformat import hash_key, well_formed
from keys.models import AWAITING_FIRST_USE, ImportedKey
from models import ApiKey, db, utcnow
from ops import note as request_note
from ops.clientaddress import client_identity
from store.connections import greenlets_share_thread

log = logging.getLogger(__name__)

# Any 16 to 256 printable ASCII characters without spaces: the secrets another system may have issued.
SECRET_FORM = re.compile(r"[!-~]{16,256}")
# Failed slow checks on one lookup prefix (in the rate-limit storage: across workers and instances
# with Redis): past them, its secrets are refused as unknown ones are, without a check, until the
# minute ends. The same on all of an organisation's lookup prefixes (which its owners choose, as
# many as they import) and from one client address.
FAILED_CHECKS_PER_PREFIX = RateLimitItemPerMinute(10)
FAILED_CHECKS_PER_ORGANISATION = RateLimitItemPerMinute(100)
FAILED_CHECKS_PER_CLIENT = RateLimitItemPerMinute(30)
# Slow checks a worker runs at once (each takes up to ~250 ms of a core and, for argon2id, up to
# 64 MiB), and how long a secret waits for a turn before it is refused as an unknown one.
SLOW_CHECKS_AT_ONCE = 2
SLOW_CHECK_WAIT = 5.0
# How long a request waits for another's read of the declared starts before it goes on without it.
READ_WAIT = 5.0
BCRYPT_READS = 72


class DeclaredForms:
    """The starts that imported keys declared (their prefix, or lookup prefix), by length, and the
    lookup prefixes of keys awaiting their first use. Keys imported since the last read are read
    (by id, past the highest read: an index range that is empty but after an import) whenever
    `version()` (the key generation, or the second on a clock) moved, by one request at a time
    while the others that need it wait for its read. A start stays while the worker runs, its key
    revoked or not: it only lets secrets through to a read by hash."""

    def __init__(self, version):
        self.version = version
        self.read_under = object()
        self.read_past = 0
        # The read under way (a threading.Event, gevent's in a served worker), or None.
        self.reading = None
        self.any_start = False
        self.starts = {}
        self.awaiting = {}
        # Lookup prefixes whose key stopped awaiting its first use while this worker ran, by length,
        # each with the number of its settling: a request that read by hash before a settling reads
        # again rather than finding nothing to check (one read, only for requests under way then).
        self.settled = {}
        self.settles = 0

    def admit(self, secret):
        """True for a secret worth a database read: this service's form and checksum, or an
        imported key's form with a declared start."""
        if well_formed(secret):
            return True
        if SECRET_FORM.fullmatch(secret) is None:
            return False
        self.refresh()
        return self.any_start or any(secret[:length] in starts for length, starts in self.starts.items())

    def awaiting_first_use(self, secret):
        """The lookup prefixes of keys awaiting their first use that the secret starts with."""
        return [secret[:length] for length, prefixes in self.awaiting.items() if secret[:length] in prefixes]

    def forget_awaiting(self, lookup_prefix):
        """A lookup prefix whose key no longer awaits its first use (rehashed, rolled, revoked)."""
        self.awaiting.get(len(lookup_prefix), set()).discard(lookup_prefix)
        self.settles += 1
        self.settled.setdefault(len(lookup_prefix), {})[lookup_prefix] = self.settles

    def settled_since(self, secret, mark):
        """True when the secret starts with a lookup prefix this worker saw settled after `mark`
        (the value of `settles` when the request read by hash)."""
        return any(self.settled[length].get(secret[:length], 0) > mark for length in self.settled)

    def refresh(self):
        if (reading := self.reading) is not None:
            reading.wait(READ_WAIT)
            return
        version = self.version()
        if version == self.read_under:
            return
        self.reading = reading = threading.Event()
        try:
            rows = (ImportedKey.select(ImportedKey.key, ImportedKey.prefix, ImportedKey.lookup_prefix,
                                       ImportedKey.slow_hash.is_null(False))
                    .where(ImportedKey.key > self.read_past).order_by(ImportedKey.key).tuples())
            for key_id, prefix, lookup_prefix, slow in rows:
                self.read_past = key_id
                start = prefix if lookup_prefix is None else lookup_prefix
                if start == "":
                    self.any_start = True
                    continue
                self.starts.setdefault(len(start), set()).add(start)
                if slow:
                    self.awaiting.setdefault(len(start), set()).add(start)
            self.read_under = version
        finally:
            self.reading = None
            reading.set()


class FirstUse:
    """The one slow check of a key imported with a bcrypt or argon2id hash: found by its lookup
    prefix, checked against its hash, and on success rehashed to the SHA-256 of its secret in one
    transaction (two workers racing rehash it once). Checks are counted before they are made, in
    the rate-limit storage (shared by workers and instances with Redis), per lookup prefix, per
    organisation and per client address, given back on success; they run in the worker's thread
    pool, SLOW_CHECKS_AT_ONCE at a time, and a secret that waits SLOW_CHECK_WAIT for a turn is refused."""

    def __init__(self, limiter):
        self.limiter = limiter
        self.running = threading.BoundedSemaphore(SLOW_CHECKS_AT_ONCE)
        # Under gevent, the checks under way by the secret's hash: requests with the same secret at
        # once (a client's first burst) wait for one check rather than each count and make one.
        self.under_way = {} if greenlets_share_thread() else None

    def opens(self, secret, forms, mark):
        """True when the key may now be found by the SHA-256 of the secret: this check rehashed it,
        or it was rehashed since this request looked the hash up (`mark`: the forms' `settles`
        then); False otherwise."""
        if self.under_way is None:
            return self.check_first_use(secret, forms, mark)
        secret_hash = hash_key(secret)
        if secret_hash in self.under_way:
            return self.under_way[secret_hash].get()
        from gevent.event import AsyncResult

        self.under_way[secret_hash] = result = AsyncResult()
        opened = False
        try:
            opened = self.check_first_use(secret, forms, mark)
            return opened
        finally:
            del self.under_way[secret_hash]
            result.set(opened)

    def check_first_use(self, secret, forms, mark):
        for lookup_prefix in forms.awaiting_first_use(secret):
            if not self.counted(FAILED_CHECKS_PER_PREFIX, f"key-check:{lookup_prefix}"):
                continue
            awaiting = ((ImportedKey.lookup_prefix == lookup_prefix) & ImportedKey.slow_hash.is_null(False)
                        & ApiKey.key_hash.startswith(AWAITING_FIRST_USE) & ApiKey.revoked_at.is_null())
            row = (ImportedKey.select(ImportedKey.key, ImportedKey.hash_scheme, ImportedKey.slow_hash, ApiKey.key_hash,
                                      ApiKey.org).join(ApiKey).where(awaiting).tuples().first())
            if row is None:
                # Rehashed (the caller's second read by hash finds it), rolled or revoked meanwhile:
                # this worker stops checking the prefix; the attempt stays counted.
                forms.forget_awaiting(lookup_prefix)
                return True
            key_id, scheme, slow_hash, placeholder, org_id = row
            windows = [(FAILED_CHECKS_PER_PREFIX, f"key-check:{lookup_prefix}")]
            for item, identity in [(FAILED_CHECKS_PER_ORGANISATION, f"key-check-org:{org_id}"),
                                   (FAILED_CHECKS_PER_CLIENT, f"key-check-ip:{client()}")]:
                if not self.counted(item, identity):
                    break
                windows.append((item, identity))
            else:
                if self.check(scheme, slow_hash, secret):
                    for item, identity in windows:
                        self.limiter.give_back(item, identity)
                    rehash(key_id, placeholder, hash_key(secret))
                    forms.forget_awaiting(lookup_prefix)
                    return True
        # Another request of this worker found the key rehashed after this one read by hash.
        return forms.settled_since(secret, mark)

    def counted(self, item, identity):
        """Count an attempt in the window; False when the window's allowance is spent."""
        try:
            self.limiter.hit(item, identity, "key-check")
        except TooManyRequests:
            return False
        return True

    def check(self, scheme, slow_hash, secret):
        if not self.running.acquire(timeout=SLOW_CHECK_WAIT):
            return False
        try:
            if greenlets_share_thread():
                import gevent

                return gevent.get_hub().threadpool.apply(matches, (scheme, slow_hash, secret))
            return matches(scheme, slow_hash, secret)
        finally:
            self.running.release()


def client():
    """The client address of the request under way, as the per-IP limits name it."""
    environ = request_note.current_environ.get(None) or {}
    return client_identity(environ.get("REMOTE_ADDR") or "")


def matches(scheme, slow_hash, secret):
    """True when the secret is the one the bcrypt or argon2id hash was made of."""
    if scheme == "bcrypt":
        import bcrypt

        # bcrypt reads 72 bytes of a secret: the other system's library cut longer ones there too.
        try:
            return bcrypt.checkpw(secret.encode()[:BCRYPT_READS], slow_hash.encode())
        except ValueError:
            return False  # a hash bcrypt cannot read opens nothing
    from argon2 import PasswordHasher
    from argon2.exceptions import InvalidHashError, VerificationError

    try:
        return PasswordHasher().verify(slow_hash, secret)
    except (VerificationError, InvalidHashError):
        return False


def rehash(key_id, placeholder, secret_hash):
    """Store the key as this service stores its own, and forget its slow hash, in one transaction;
    a key another worker rehashed first is left as it is."""
    with db.atomic():
        rehashed = ApiKey.update(key_hash=secret_hash).where(
            (ApiKey.id == key_id) & (ApiKey.key_hash == placeholder)).execute()
        if rehashed:
            ImportedKey.update(slow_hash=None, rehashed_at=utcnow()).where(ImportedKey.key == key_id).execute()
    if rehashed:
        log.info("Imported key %d rehashed to SHA-256 on its first use.", key_id)


def clock_seconds():
    """The version of the declared starts where no key generation is kept: read again each second."""
    return int(time.monotonic())
