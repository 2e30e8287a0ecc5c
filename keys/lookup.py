"""The hot path's key lookups: a secret's hash to its active key, or to whether it still opens it;
one constant statement each (store/statements.py)."""

import math

from keys import allowips
from models import ApiKey, db, epoch_of, utcnow


def find_active_key(key_hash):
    """Return the ApiKey whose secret, or whose previous secret within its grace period, has this
    hash, unless it is revoked or expired (only the fields a request needs, presented_hash,
    usable_until: the epoch second from which this secret stops opening the key, or inf, and
    allowed_networks: its allow-list parsed, or None for any address); else None."""
    row = db.execute_sql(db.statements.find_active_key, (key_hash, key_hash)).fetchone()
    if row is None:
        return None
    (key_id, org_id, user_id, name, key_type, tier, display_prefix, expires_at, scopes, current_hash, previous_until,
     allow_ips, rate_limits, credits_remaining, refill_amount, refill_interval, refilled_for) = row
    now = utcnow()
    expires_at = ApiKey.expires_at.python_value(expires_at)
    if expires_at is not None and expires_at <= now:
        return None
    ends = [expires_at] if expires_at is not None else []
    if current_hash != key_hash:
        previous_until = ApiKey.previous_expires_at.python_value(previous_until)
        if not previous_until > now:
            return None
        ends.append(previous_until)
    # __no_default__ skips computing defaults for the fields the query did not fetch.
    key = ApiKey(__no_default__=True, id=key_id, org=org_id, user=user_id, name=name, key_type=key_type,
                 rate_limit_tier=tier, display_prefix=display_prefix, expires_at=expires_at, scopes=scopes,
                 key_hash=current_hash, allow_ips=allow_ips, rate_limits=rate_limits,
                 credits_remaining=credits_remaining, credits_refill_amount=refill_amount,
                 credits_refill_interval=refill_interval,
                 credits_refilled_for=ApiKey.credits_refilled_for.python_value(refilled_for))
    key.has_credits = credits_remaining is not None
    # Parsed here, so a cached key carries its networks and a request only tests membership.
    key.allowed_networks = allowips.networks(allow_ips) if allow_ips else None
    key.usable_until = epoch_of(min(ends)) if ends else math.inf
    key.presented_hash = key_hash
    return key


def secret_is_active(key_hash):
    """Return True while the secret with this hash still opens its key: the key is neither revoked
    nor expired, and the secret is its current one or a previous one within its grace period."""
    now = utcnow()
    return db.execute_sql(db.statements.secret_is_active, (key_hash, key_hash, now, now)).fetchone() is not None
