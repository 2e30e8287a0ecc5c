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
from store.connections import greenlets_share_thread

log = logging.getLogger(__name__)

# Any 16 to 256 printable ASCII characters without spaces: the secrets another system may have issued.
SECRET_FORM = re.compile(r"[!-~]{16,256}")
# Failed slow checks on one lookup prefix, across workers and instances: past them, its secrets
# are refused as unknown ones are, without a check, until the minute ends.
FAILED_CHECKS_PER_PREFIX = RateLimitItemPerMinute(10)
# Slow checks a worker runs at once (each takes up to ~250 ms of a core and, for argon2id, its memory).
SLOW_CHECKS_AT_ONCE = 2
BCRYPT_READS = 72


class DeclaredForms:
    """The starts that imported keys declared (their prefix, or lookup prefix), by length, and the
    lookup prefixes of keys still awaiting their first use; read again whenever `version()` (the key
    generation, or the second on a clock) no longer is the one they were read under."""

    def __init__(self, version):
        self.version = version
        self.read_under = object()
        self.any_start = False
        self.starts = {}
        self.awaiting = {}

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

    def refresh(self):
        version = self.version()
        if version == self.read_under:
            return
        any_start, starts, awaiting = False, {}, {}
        rows = (ImportedKey.select(ImportedKey.prefix, ImportedKey.lookup_prefix, ImportedKey.slow_hash.is_null(False))
                .join(ApiKey).where(ApiKey.revoked_at.is_null()).distinct().tuples())
        for prefix, lookup_prefix, slow in rows:
            start = prefix if lookup_prefix is None else lookup_prefix
            if start == "":
                any_start = True
                continue
            starts.setdefault(len(start), set()).add(start)
            if slow:
                awaiting.setdefault(len(start), set()).add(start)
        self.any_start, self.starts, self.awaiting = any_start, starts, awaiting
        self.read_under = version


class FirstUse:
    """The one slow check of a key imported with a bcrypt or argon2id hash: found by its lookup
    prefix, checked against its hash, and on success rehashed to the SHA-256 of its secret in one
    transaction (two workers racing rehash it once). Checks are counted per lookup prefix in the
    rate-limit storage before they are made, and run in the worker's thread pool."""

    def __init__(self, limiter):
        self.limiter = limiter
        self.running = threading.BoundedSemaphore(SLOW_CHECKS_AT_ONCE)

    def opens(self, secret, lookup_prefixes):
        """True when the key may now be found by the SHA-256 of the secret: this check rehashed it,
        or another worker did since this one looked the hash up; False otherwise."""
        for lookup_prefix in lookup_prefixes:
            identity = f"key-check:{lookup_prefix}"
            try:
                self.limiter.hit(FAILED_CHECKS_PER_PREFIX, identity, "key-check")
            except TooManyRequests:
                continue
            awaiting = ((ImportedKey.lookup_prefix == lookup_prefix) & ImportedKey.slow_hash.is_null(False)
                        & ApiKey.key_hash.startswith(AWAITING_FIRST_USE) & ApiKey.revoked_at.is_null())
            row = (ImportedKey.select(ImportedKey.key, ImportedKey.hash_scheme, ImportedKey.slow_hash, ApiKey.key_hash)
                   .join(ApiKey).where(awaiting).tuples().first())
            if row is None:
                # Rehashed (or revoked) meanwhile: the caller's second read by hash tells which.
                self.limiter.give_back(FAILED_CHECKS_PER_PREFIX, identity)
                return True
            key_id, scheme, slow_hash, placeholder = row
            if self.check(scheme, slow_hash, secret):
                self.limiter.give_back(FAILED_CHECKS_PER_PREFIX, identity)
                rehash(key_id, placeholder, hash_key(secret))
                return True
        return False

    def check(self, scheme, slow_hash, secret):
        with self.running:
            if greenlets_share_thread():
                import gevent

                return gevent.get_hub().threadpool.apply(matches, (scheme, slow_hash, secret))
            return matches(scheme, slow_hash, secret)


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
