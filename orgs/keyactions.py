"""An organisation's API keys: issue, roll, revoke and limit them, grant their credits. They live
beside the organisation whose cap they count, not in keys/: they lock the user and the
organisation (accounts/) and set credits (metering/), rooms that themselves import keys/ (its
cache and its signal)."""

import datetime
import re

from flask import current_app

import models
from accounts import users
from keys import allowips, events, keycache, leaks
from keys.keyformat import DISPLAY_PREFIX_LENGTH, KEY_PREFIXES, generate_secret, hash_key
from keys.models import AWAITING_FIRST_USE, ImportedKey
from metering import credits
from models import SCOPES, ApiKey, db, display_time, iso_seconds, utcnow
from orgs import organisations

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


def checked_name(name):
    """A key's name as it is kept (stripped); ValueError with a sentence when it cannot be one."""
    name = name.strip()
    users.refuse_control_characters(name, "A key name")
    if not 0 < len(name) <= MAX_KEY_NAME_LENGTH:
        raise ValueError(f"A key name is 1 to {MAX_KEY_NAME_LENGTH} characters.")
    return name


def checked_tier(tier):
    """The tier, when the app's limiter has it configured; ValueError with a sentence otherwise."""
    tiers = current_app.extensions["ratelimit"].tiers
    if tier not in tiers:
        known = ", ".join(sorted(tiers))
        raise ValueError(f"Unknown rate limit tier {tier!r}; the configured tiers are: {known}.")
    return tier


def issue_key(user, name, key_type, tier="free", expires_in=None, scopes=None, allow_ips=None, credits_given=None,
              refill=None, org=None):
    """Create an API key made by the user in the organisation (an id; None: the user's personal
    one), expiring expires_in seconds from now (None: never), with the given scopes (None: all),
    usable from the addresses of allow_ips (allowips.parse's input; None or empty: any), with
    credits_given credits and a refill ((amount, interval); None: neither); return (ApiKey, secret).
    The secret exists only here."""
    name = checked_name(name)
    if key_type not in KEY_PREFIXES:
        raise ValueError("The key type is either development or production.")
    checked_tier(tier)
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
        # Imported keys have their own bound (orgs/keyimports.py): a migration must not stop new keys.
        issued_here = ApiKey.active_in(org_id).where(ApiKey.id.not_in(ImportedKey.select(ImportedKey.key)))
        if issued_here.count() >= cap:
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
                                 expires_at=expires_at and iso_seconds(expires_at), imported=False))
        inactive = ApiKey.revoked_at.is_null(False) | (ApiKey.expires_at <= utcnow())
        models.keep_newest(ApiKey, (ApiKey.org == org_id) & inactive, ApiKey.id, ApiKey.id, MAX_INACTIVE_KEYS_KEPT)
    return key, secret


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
    # A key imported with a slow hash and never used has no SHA-256 to keep: its old secret ends now.
    awaiting_first_use = key.key_hash.startswith(AWAITING_FIRST_USE)
    keep_previous = grace > 0 and not awaiting_first_use
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
        if awaiting_first_use:
            ImportedKey.update(slow_hash=None).where(ImportedKey.key == key.id).execute()
        events.key_changed.send(
            "key.rolled", key=key,
            detail=f"{key.name} (id {key.id}, now {secret[:DISPLAY_PREFIX_LENGTH]}...; grace {grace} s)",
            data=dict(events.key_data(key), key_prefix=secret[:DISPLAY_PREFIX_LENGTH],
                      previous_key_prefix=key.display_prefix, previous_valid_until=until and iso_seconds(until)))
    keycache.announce_change(key)
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
                    detail=(f"{key.name} (id {key.id}, {key.display_prefix}...)"
                            + (" reported by GitHub" if report else "")),
                    data=events.key_data(key, revoked_at=iso_seconds(key.revoked_at), **(report or {})))
    if revoked or again:
        keycache.announce_change(key)
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
        keycache.announce_change(key)
    return ended


def limit_key(key, limits):
    """Give the key its own windows (ratelimit.parse_limits' form), or with None its tier's again;
    the servers apply it from their next request on."""
    with db.atomic():
        ApiKey.update(rate_limits=limits).where(ApiKey.id == key.id).execute()
        events.key_changed.send("key.limit_changed", key=key,
                                detail=f"{key.name} (id {key.id}): {limits or 'its tier ' + key.rate_limit_tier}")
    keycache.announce_change(key)


def grant_credits(key, set_to=None, add=None, refill=None, no_refill=False):
    """Set or add to the key's credits and give or take away its refill (metering/credits.py's
    grant); return the ApiKey as it is now. The servers read it afresh from their next request on."""
    granted = credits.grant(key.id, set_to=set_to, add=add, refill=refill, no_refill=no_refill)
    keycache.announce_change(key)
    return granted
