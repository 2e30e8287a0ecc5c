"""API keys: the key format, issuing and revoking keys, and the guard on protected routes."""

import datetime
import functools
import hashlib
import re
import secrets
import string
import zlib

from flask import current_app
from werkzeug.exceptions import Forbidden, Unauthorized

import ratelimit
from accounts import organisations, users
from keys import allowips, events, keycache, leaks
from keys.lookup import find_active_key
from metering import credits
from models import SCOPES, ApiKey, db, display_time, iso_seconds, utcnow
from ops import metrics, note as request_note
from store.rediswindows import KeysChanged

KEY_PREFIXES = {"development": "sk_test_", "production": "sk_live_"}
KEY_ALPHABET = string.ascii_letters + string.digits
# New secrets: 32 random characters and a 6-character base62 CRC32 of everything before it, so a
# typo or a scanner's false positive is refused without a database lookup (GitHub's scheme). Keys
# issued before (40 random characters) keep working.
RANDOM_LENGTH = 32
CHECKSUM_LENGTH = 6
CHECKSUM_ALPHABET = string.digits + string.ascii_uppercase + string.ascii_lowercase
CHECKSUMMED_LENGTH = len("sk_live_") + RANDOM_LENGTH + CHECKSUM_LENGTH
KEY_PATTERN = re.compile(r"sk_(?:live|test)_[A-Za-z0-9]{32,128}")
DISPLAY_PREFIX_LENGTH = len("sk_live_") + 4
DURATION_PATTERN = re.compile(r"([0-9]{1,6})([smhd])")
DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}

MAX_KEY_NAME_LENGTH = 100
# Revoked and expired keys an account keeps (for its key table and usage); older ones are deleted,
# with their usage rows, as new keys are made: creations are limited per hour, not in total.
MAX_INACTIVE_KEYS_KEPT = 100


class KeyCapReached(ValueError):
    """The user already holds MAX_KEYS_PER_USER active keys."""


class RollConflict(ValueError):
    """A roll of a key that changed since the caller read it (HTTP 409 in the web application)."""


class GraceRunning(RollConflict):
    """A roll that would end a previous secret's grace period without saying so."""


class InsufficientScope(Forbidden):
    """A valid key without the scope the endpoint needs (HTTP 403)."""

    error_code = "insufficient_scope"


class IpNotAllowed(Forbidden):
    """A valid key used from an address its allow-list does not name (HTTP 403)."""

    error_code = "ip_not_allowed"


REFUSALS = (InsufficientScope, IpNotAllowed)


class ApiKeyError(Unauthorized):
    """A missing, malformed, unknown or revoked API key (HTTP 401)."""

    def __init__(self, error_code, description):
        super().__init__(description)
        self.error_code = error_code

    def get_headers(self, environ=None, scope=None):
        return [*super().get_headers(environ, scope), ("WWW-Authenticate", 'ApiKey realm="api"')]


def hash_key(secret):
    """Return the hex SHA-256 of a key secret, the only form the database keeps."""
    return hashlib.sha256(secret.encode()).hexdigest()


def parse_duration(text, allow_never=True):
    """Seconds in a DURATION (`30d`, `24h`, `90m`, `45s`, `0`), or None for `never`; else
    ValueError with a sentence."""
    text = text.strip().lower()
    if allow_never and text == "never":
        return None
    if text == "0":
        return 0
    match = DURATION_PATTERN.fullmatch(text)
    if not match:
        never = " or never" if allow_never else ""
        raise ValueError(f"A duration is a number and a unit s, m, h or d (for example 30d){never}, "
                         f"not {text!r}.")
    return int(match[1]) * DURATION_UNITS[match[2]]


def parse_scopes(names):
    """The scopes named, checked and in the contract's order; every scope when none is named."""
    names = [name.strip() for name in names if name.strip()]
    if unknown := [name for name in names if name not in SCOPES]:
        raise ValueError(f"Unknown scope {unknown[0]!r}; the scopes are: {', '.join(SCOPES)}.")
    return [scope for scope in SCOPES if scope in names] if names else list(SCOPES)


def issue_key(user, name, key_type, tier="free", expires_in=None, scopes=None, allow_ips=None, credits_given=None,
              refill=None, org=None):
    """Create an API key made by the user in the organisation (an id; None: the user's personal one), expiring expires_in seconds from now (None: never), with the
    given scopes (None: all), usable from the addresses of allow_ips (allowips.parse's input; None or
    empty: any), with credits_given credits and a refill ((amount, interval); None: neither);
    return (ApiKey, secret). The secret exists only here."""
    name = name.strip()
    users.refuse_control_characters(name, "A key name")
    if not 0 < len(name) <= MAX_KEY_NAME_LENGTH:
        raise ValueError(f"A key name is 1 to {MAX_KEY_NAME_LENGTH} characters.")
    if key_type not in KEY_PREFIXES:
        raise ValueError("The key type is either development or production.")
    if tier not in ratelimit.tier_names():
        known = ", ".join(sorted(ratelimit.tier_names()))
        raise ValueError(f"Unknown rate limit tier {tier!r}; the configured tiers are: {known}.")
    scopes = parse_scopes(scopes or [])
    allow_ips = allowips.parse(allow_ips)
    if expires_in is not None and expires_in <= 0:
        raise ValueError("A key's expiry must be in the future.")
    expires_at = utcnow() + datetime.timedelta(seconds=expires_in) if expires_in else None
    secret = generate_secret(key_type)
    org_id = org if org is not None else users.personal_organisation_id(user)
    with db.atomic():
        users.lock_user(user)
        organisations.lock_organisation(org_id)
        cap = current_app.config["MAX_KEYS_PER_USER"]
        if ApiKey.active_in(org_id).count() >= cap:
            raise KeyCapReached(f"An organisation may hold {cap} active keys; revoke one before creating another.")
        key = ApiKey.create(
            org=org_id,
            user=user,
            name=name,
            key_type=key_type,
            rate_limit_tier=tier,
            display_prefix=secret[:DISPLAY_PREFIX_LENGTH],
            key_hash=hash_key(secret),
            expires_at=expires_at,
            scopes=None if len(scopes) == len(SCOPES) else ",".join(scopes),
            allow_ips=allow_ips,
            **credits.initial(credits_given, refill),
        )
        events.key_changed.send(
            "key.created", key=key,
            detail=f"{key.name} (id {key.id}, {key.display_prefix}...; from {allowips.summary(allow_ips)})",
            data=events.key_data(key, key_type=key_type, scopes=scopes,
                                 expires_at=expires_at and iso_seconds(expires_at)))
        inactive = ApiKey.revoked_at.is_null(False) | (ApiKey.expires_at <= utcnow())
        users.keep_newest(ApiKey, (ApiKey.org == org_id) & inactive, ApiKey.id, ApiKey.id, MAX_INACTIVE_KEYS_KEPT)
    return key, secret


def generate_secret(key_type):
    """Return a new secret: the type's prefix, RANDOM_LENGTH characters from a CSPRNG, the checksum."""
    head = KEY_PREFIXES[key_type] + "".join(secrets.choice(KEY_ALPHABET) for _ in range(RANDOM_LENGTH))
    return head + checksum(head)


def checksum(text):
    """The CRC32 of text in base62 (0-9A-Za-z), left-padded with 0 to CHECKSUM_LENGTH characters."""
    number, digits = zlib.crc32(text.encode()), []
    while number:
        number, digit = divmod(number, 62)
        digits.append(CHECKSUM_ALPHABET[digit])
    return "".join(reversed(digits)).rjust(CHECKSUM_LENGTH, "0")


def checksum_fails(secret):
    """True for a secret of the checksummed length whose checksum does not match."""
    return len(secret) == CHECKSUMMED_LENGTH and checksum(secret[:-CHECKSUM_LENGTH]) != secret[-CHECKSUM_LENGTH:]


def roll_key(key, grace, end_previous=False, current=None):
    """Give the key a new secret; the current one keeps working for grace seconds (0: not at all).
    The key keeps its id, and with it its allowance, usage, scopes and expiry; return the secret.
    Raise RollConflict when current (the display prefix the caller saw) is not the key's any more or
    the key changed since it was read; GraceRunning when a previous secret is still in its grace
    period and end_previous does not confirm ending it."""
    if current is not None and current != key.display_prefix:
        raise RollConflict(f"The page showed the secret {current}... of {key.name!r}, but its secret is now "
                           f"{key.display_prefix}...: it was rolled since. Reload and try again.")
    now = utcnow()
    if key.previous_key_hash and key.previous_expires_at and key.previous_expires_at > now and not end_previous:
        raise GraceRunning(f"{key.name!r} still has a previous secret, {key.previous_display_prefix}..., which "
                           f"works until {display_time(key.previous_expires_at)}; rolling again ends it now.")
    secret = generate_secret(key.key_type)
    keep_previous = grace > 0
    until = now + datetime.timedelta(seconds=grace) if keep_previous else None
    with db.atomic():
        rolled = ApiKey.update(
            key_hash=hash_key(secret),
            display_prefix=secret[:DISPLAY_PREFIX_LENGTH],
            previous_key_hash=key.key_hash if keep_previous else None,
            previous_display_prefix=key.display_prefix if keep_previous else None,
            previous_expires_at=until,
        ).where((ApiKey.id == key.id) & (ApiKey.key_hash == key.key_hash) & ApiKey.revoked_at.is_null()).execute()
        if not rolled:
            raise RollConflict("The key was rolled or revoked meanwhile; reload and try again.")
        events.key_changed.send(
            "key.rolled", key=key,
            detail=f"{key.name} (id {key.id}, now {secret[:DISPLAY_PREFIX_LENGTH]}...; grace {grace} s)",
            data=dict(events.key_data(key), key_prefix=secret[:DISPLAY_PREFIX_LENGTH],
                      previous_key_prefix=key.display_prefix, previous_valid_until=until and iso_seconds(until)))
    keycache.announce_change()
    return secret


def revoke_key(key, leaked=False, again=False, report=None):
    """Mark the key revoked, its current and previous secrets alike; they fail from the very next
    request on; return True when this call revoked it. leaked: revoked through POST
    /api/v1/keys/revoke by whoever held the secret, or reported by GitHub, which must still be the
    key's current one (a roll may have made it the previous one meanwhile); report: GitHub's
    report ({"source": "github", "url": ...}), kept with the key (keys/leaks.py) and added to the
    event's data. again: announce a key already revoked once more (the CLI: repeating a revocation
    whose announcement failed helps; the web application does not, or a button could move every
    worker's key generation at will)."""
    revoked = False
    if key.revoked_at is None:
        key.revoked_at = utcnow()
        # Only the first of two revocations at once records one.
        which = (ApiKey.id == key.id) & ApiKey.revoked_at.is_null()
        changes = {"revoked_at": key.revoked_at}
        if leaked:
            which &= ApiKey.key_hash == key.presented_hash
            changes.update(leaks.recorded(report))
        with db.atomic():
            revoked = bool(ApiKey.update(**changes).where(which).execute())
            if revoked:
                events.key_changed.send(
                    "key.revoked_as_leaked" if leaked else "key.revoked", key=key,
                    detail=f"{key.name} (id {key.id}, {key.display_prefix}...)" + (" reported by GitHub" if report else ""),
                    data=events.key_data(key, revoked_at=iso_seconds(key.revoked_at), **(report or {})))
    if revoked or again:
        keycache.announce_change()
    return revoked


def revoke_previous_secret(key):
    """End the grace period of the key's previous (rolled-out) secret now, the one presented; the key
    and its current secret keep working. Whoever holds that secret may end it, never the key.
    Return True when this call ended it."""
    with db.atomic():
        ended = bool(ApiKey.update(previous_key_hash=None, previous_display_prefix=None, previous_expires_at=None)
                     .where((ApiKey.id == key.id) & (ApiKey.previous_key_hash == key.presented_hash)).execute())
        if ended:
            events.key_changed.send("key.previous_secret_revoked", key=key,
                                    detail=f"{key.name} (id {key.id})")
    if ended:
        keycache.announce_change()
    return ended


def limit_key(key, limits):
    """Give the key its own windows (ratelimit.parse_limits' form), or with None its tier's again;
    the servers apply it from their next request on."""
    with db.atomic():
        ApiKey.update(rate_limits=limits).where(ApiKey.id == key.id).execute()
        events.key_changed.send("key.limit_changed", key=key,
                                detail=f"{key.name} (id {key.id}): {limits or 'its tier ' + key.rate_limit_tier}")
    keycache.announce_change()


def grant_credits(key, set_to=None, add=None, refill=None, no_refill=False):
    """Set or add to the key's credits and give or take away its refill (metering/credits.py's
    grant); return the ApiKey as it is now. The servers read it afresh from their next request on."""
    granted = credits.grant(key.id, set_to=set_to, add=add, refill=refill, no_refill=no_refill)
    keycache.announce_change()
    return granted


def authenticate(secret, source="the X-API-Key header"):
    """Return the active ApiKey for a secret, read from the database, or raise ApiKeyError."""
    return found_key(find_active_key(secret_hash(secret, source)))


def secret_hash(secret, source):
    """Return the hash of a well-formed secret, None for a malformed one; raise ApiKeyError for none."""
    secret = given_secret(secret, source)
    return hash_key(secret) if well_formed(secret) else None


def given_secret(secret, source):
    """Return the secret without surrounding whitespace; raise ApiKeyError when there is none."""
    secret = (secret or "").strip()
    if not secret:
        raise ApiKeyError("missing_api_key", f"This endpoint needs an API key in {source}.")
    return secret


def well_formed(secret):
    """True for a secret in the form of a key, with the right checksum where it has one."""
    return KEY_PATTERN.fullmatch(secret) is not None and not checksum_fails(secret)


def found_key(key):
    if key is None:
        raise ApiKeyError("invalid_api_key", "The API key is malformed, unknown or revoked.")
    return key


def require_scope(key, scope):
    """Raise InsufficientScope unless the key has the scope."""
    if scope not in key.scope_list():
        # A scope guards more than the endpoint SCOPES names for it (usage:read: stats and history).
        needed_by = SCOPES[scope]
        environ = request_note.current_environ.get()
        route = metrics.route(environ)
        if not needed_by.endswith(" " + route):
            needed_by = f"{request_note.request_method(environ)} {route}"
        raise InsufficientScope(f"This API key lacks the scope {scope!r}, which {needed_by} needs.")


def require_allowed_address(key):
    """Raise IpNotAllowed unless the key may be used from the client's address (the one the per-IP
    limits use: REMOTE_ADDR, from X-Forwarded-For behind TRUSTED_PROXIES)."""
    if key.allowed_networks is None:
        return
    environ = request_note.current_environ.get()
    client_address = environ.get("REMOTE_ADDR")
    if not allowips.permits(key.allowed_networks, client_address):
        # Not the owner's traffic: neither counted nor recorded in the key's usage.
        request_note.of(environ).usage_key_id = None
        address = allowips.client_ip(client_address or "") or "this address"
        raise IpNotAllowed(f"This API key may not be used from {address}: its IP allow-list does not include it.")


def require_access(key, scope):
    """Raise InsufficientScope unless the key has the scope, IpNotAllowed unless it may be used from here."""
    require_scope(key, scope)
    require_allowed_address(key)


def admit(secret, scope, note, source="the X-API-Key header", hold=None):
    """Authenticate a secret, check its scope and allow-list, then count the request (whose note is
    this) against its key's allowance; return the key. A key refused by its scope or allow-list is
    not counted. hold(key), where given, runs once, after those checks and before the count: what
    it takes (a time socket's slot) is taken only for a key read from the database, never a kept
    one the count has not confirmed yet, and a refusal it raises counts nothing. Otherwise the key
    may come from the worker's cache (keys/keycache.py); where the count must confirm it, a stale
    one is read again, uncounted. The REST API and the time socket are admitted alike."""
    # The note's app, not current_app: a context proxy costs more than the rest of this (ops/note.py).
    service = note.app.extensions
    keys, limiter = service["keys"], service["ratelimit"]
    secret = given_secret(secret, source)
    key_hash = hash_key(secret)
    # Its form is checked only before the database is read: a kept hash is a real key's.
    key, generation = keys.find(key_hash, lambda: well_formed(secret))
    key = found_key(key)
    if hold is not None and generation is not None:
        # A kept key may be revoked by now, and hold's refusal (too many sockets) would answer for
        # it before the count could tell: read it (a handshake's cost, not a REST request's).
        key, generation = found_key(keys.reload(key_hash)), None
    # Its answer goes into the key's usage: refusals for scope and rate as well as successes.
    note.usage_key_id = key.id
    try:
        require_access(key, scope)
        if hold is not None:
            hold(key)
        limiter.count_request(key, note, generation)
    except (KeysChanged, *REFUSALS, credits.CreditsExhausted) as refusal:
        if not isinstance(refusal, KeysChanged) and generation is None:
            raise
        # A kept key not yet confirmed is read again before it is refused (a revoked key is a 401,
        # not a 403) or counted. This read comes after any change announced before the request
        # arrived, so the count needs no second confirmation. (A key with hold was read above.)
        key = found_key(keys.reload(key_hash))
        require_access(key, scope)
        limiter.count_request(key, note)
    return key


def require_api_key(scope):
    """Guard a view: X-API-Key must hold an active key with the scope and allowance left; the
    request is counted, and the view gets the key as its api_key argument."""

    def decorate(view):
        @functools.wraps(view)
        def guarded(*args, **kwargs):
            environ = request_note.current_environ.get()
            note = environ[request_note.ENVIRON_KEY]
            return view(*args, api_key=admit(environ.get("HTTP_X_API_KEY"), scope, note), **kwargs)

        # Itself, not a copy that functools.wraps would give a decorator around it: tells a view
        # guarded right here from one wrapped again since.
        guarded.guard = guarded
        return guarded

    return decorate
