"""Changing a key in place: its name, scopes, IP allow-list, expiry, tier, own windows and credits,
by whoever may roll it. What widens a key (a scope or an address it did not have, a later expiry, a
tier that is not tighter in each window, its own windows, more credits or a larger or more frequent
refill) needs a role that may widen keys (orgs/roles.py: owners and admins); anyone else may only
narrow it."""

import datetime
import ipaddress

from flask import current_app

from keys import allowips, events, keycache
from metering import credits
from models import SCOPES, ApiKey, utcnow
from orgs import keyactions, members, roles

# The fields a change names, in this order, in its events and its page.
FIELDS = ("name", "scopes", "allow_ips", "expires_at", "tier", "rates", "credits", "refill")
# How a page names each, after "Changed".
LABELS = {"name": "name", "scopes": "scopes", "allow_ips": "IP allow-list", "expires_at": "expiry", "tier": "tier",
          "rates": "windows", "credits": "credits", "refill": "refill"}
# Left as the key has it: the default of every field of update_key.
KEEP = object()


class KeyNotChangeable(ValueError):
    """The key is revoked or expired: it can no longer be changed (HTTP 404 on the web, as a roll)."""


class WideningRefused(PermissionError):
    """A change that widens the key, asked by a role that may only narrow it (HTTP 403)."""


def update_key(key_id, may_widen, *, actor=None, name=KEEP, scopes=KEEP, allow_ips=KEEP, expires_in=KEEP,
               tier=KEEP, rates=KEEP, credits_set=None, credits_add=None, refill=KEEP, now=None):
    """Change the key's fields given (name; scopes, a list; allow_ips, allowips.parse's input;
    expires_in, seconds from now or None for never; tier; rates, ratelimit.parse_limits' form or None
    for its tier's; credits_set and credits_add, numbers; refill, (amount, interval) or None), in one
    transaction holding the key's row with one key.updated event naming what changed. Return the
    names of the fields that changed (none: nothing was written). Raise ValueError for a value the
    key cannot take, KeyNotChangeable for a revoked or expired key, WideningRefused when the change
    widens the key and may_widen is false. With actor (a User), the actor's role is read again with
    the key's row held and decides both (orgs/members.py's NotAllowed, NotMember): a role changed
    meanwhile, not the one the page was drawn with. A revoked key stays revoked: the change never
    writes that column, and a key revoked while the change waits for its row is refused."""
    now = now or utcnow()
    asked = checked(name, scopes, allow_ips, expires_in, tier, now)
    with credits.holding(key_id) as key:
        if key.revoked_at is not None or key.is_expired(now):
            raise KeyNotChangeable(f"{key.name!r} is {'revoked' if key.revoked_at else 'expired'}; it cannot be "
                                   "changed.")
        if actor is not None:
            members.require(key.org_id, actor, roles.KEY_CHANGE, own_key=key.user_id == actor.id)
            may_widen = members.role_allows(key.org_id, actor, roles.KEY_WIDEN)
        columns = {column: value for column, value in asked.items() if getattr(key, column) != value}
        if rates is not KEEP and rates != key.rate_limits:
            columns["rate_limits"] = rates
        if refill == current_refill(key):
            refill = KEEP
        if credits_set is not None or credits_add is not None or refill is not KEEP:
            columns.update({field.name: value for field, value in credits.granted(
                key, credits_set, credits_add, None if refill is KEEP else refill, refill is None, now).items()})
        changed = changed_fields(key, columns, now)
        if not changed:
            return []
        if not {"credits", "refill"} & set(changed):
            columns = {column: value for column, value in columns.items() if not column.startswith("credits_")}
        if not may_widen and (widened := widening(key, columns, now)):
            raise WideningRefused(f"Only owners and admins may widen a key: this change would {widened}.")
        ApiKey.update(**columns).where((ApiKey.id == key_id) & ApiKey.revoked_at.is_null()).execute()
        for column, value in columns.items():
            setattr(key, column, value)
        events.key_changed.send("key.updated", key=key,
                                detail=f"{key.name} (id {key.id}): changed {', '.join(changed)}",
                                data=events.key_data(key, changed=changed))
    keycache.announce_change(key)
    return changed


def checked(name, scopes, allow_ips, expires_in, tier, now):
    """The columns of the fields given, each checked as a new key's is; ValueError otherwise."""
    columns = {}
    if name is not KEEP:
        columns["name"] = keyactions.checked_name(name)
    if scopes is not KEEP:
        if not any(scope.strip() for scope in scopes):
            raise ValueError("Choose at least one scope.")
        listed = keyactions.parse_scopes(scopes)
        columns["scopes"] = None if len(listed) == len(SCOPES) else ",".join(listed)
    if allow_ips is not KEEP:
        columns["allow_ips"] = allowips.parse(allow_ips)
    if expires_in is not KEEP:
        if expires_in is not None and expires_in <= 0:
            raise ValueError("A key's expiry must be in the future.")
        columns["expires_at"] = None if expires_in is None else now + datetime.timedelta(seconds=expires_in)
    if tier is not KEEP:
        columns["rate_limit_tier"] = keyactions.checked_tier(tier)
    return columns


def changed_fields(key, columns, now):
    """The FIELDS the new columns change, in FIELDS' order. Credits changed when what the key has
    left does: setting them to what it has is no change."""
    names = {"name": "name", "scopes": "scopes", "allow_ips": "allow_ips", "expires_at": "expires_at",
             "rate_limit_tier": "tier", "rate_limits": "rates"}
    changed = {names[column] for column in columns if column in names}
    if "credits_remaining" in columns and columns["credits_remaining"] != credits.effective_remaining(key, now):
        changed.add("credits")
    if "credits_refill_amount" in columns and (
            (columns["credits_refill_amount"], columns["credits_refill_interval"])
            != (key.credits_refill_amount, key.credits_refill_interval)):
        changed.add("refill")
    return [field for field in FIELDS if field in changed]


def widening(key, columns, now):
    """What of the change widens the key, as the end of a sentence; None when it only narrows."""
    if "scopes" in columns:
        added = set(scope_list(columns["scopes"])) - set(key.scope_list())
        if added:
            return f"grant the scope {sorted(added)[0]}"
    if "allow_ips" in columns and not within(columns["allow_ips"], key.allow_ips):
        return "let the key be used from addresses it may not be used from now"
    if "expires_at" in columns and key.expires_at is not None and (
            columns["expires_at"] is None or columns["expires_at"] > key.expires_at):
        return "make the key expire later"
    if "rate_limit_tier" in columns and not no_looser(tier_windows(columns["rate_limit_tier"]),
                                                      tier_windows(key.rate_limit_tier)):
        return f"change its tier to {columns['rate_limit_tier']}, which is not tighter in each of its windows"
    # A window whose amount changes is counted afresh (the limit storage names a window by its
    # amount), so that even a tighter one would give a new allowance at once, again and again.
    if "rate_limits" in columns:
        return "change its own windows"
    left = credits.effective_remaining(key, now)
    # A key without credits may make any number of requests: giving it credits only narrows it.
    if left is not None:
        if columns.get("credits_remaining", left) > left:
            return "give it credits"
        refill = columns.get("credits_refill_amount"), columns.get("credits_refill_interval")
        if refill[0] is not None and (key.credits_refill_amount is None or refill[0] > key.credits_refill_amount
                                      or refill[1] != key.credits_refill_interval):
            return "give it a larger or more frequent refill"
    return None


def no_looser(new, old):
    """True when windows new let through no more than old: each old window has one of the same length
    in new, of no larger amount (new may add windows)."""
    lengths = {seconds: amount for amount, seconds in new}
    return all(seconds in lengths and lengths[seconds] <= amount for amount, seconds in old)


def current_refill(key):
    """The key's refill as update_key takes one: (amount, interval), or None."""
    if key.credits_refill_amount is None:
        return None
    return key.credits_refill_amount, key.credits_refill_interval


def scope_list(stored):
    return stored.split(",") if stored else list(SCOPES)


def within(new, old):
    """True when every network of the new allow-list lies inside one of the old's (None: any address)."""
    if old is None:
        return True
    if new is None:
        return False
    old_networks = [ipaddress.ip_network(entry) for entry in old.split(",")]
    return all(any(network.version == outer.version and network.subnet_of(outer) for outer in old_networks)
               for network in map(ipaddress.ip_network, new.split(",")))


def configured_tiers():
    return current_app.extensions["ratelimit"].tiers.keys()


def describe_tier(tier):
    """A tier's windows as a person reads them: "100000 per 1 hour, 2000 per 1 minute"."""
    return ", ".join(str(item) for item in current_app.extensions["ratelimit"].tiers.get(tier, ()))


def tier_windows(tier):
    """[(amount, seconds), ...] of a configured tier (an unknown one allows nothing)."""
    items = current_app.extensions["ratelimit"].tiers.get(tier, ())
    return [(item.amount, item.get_expiry()) for item in items]
