"""Credits: a number of requests a key may make, spent one per counted request, optionally set
again to a fixed amount at 00:00 UTC every day or on the 1st of every month.

The database holds them, in every topology: credits are bought and sold, so they must outlive a
restart of Redis (which may keep nothing on disk) and be exact across any number of workers and
instances. A spend is one conditional UPDATE ... RETURNING: the row's lock orders concurrent
spends, so they never go below 0 nor admit more requests than there were credits. A request
spends its credit only once its windows have admitted it, and a spend is never undone: between
two grants the credits only go down, so a key that reads 0 has none left, whatever is in flight,
and each count is left by exactly one spend (credits.low and credits.exhausted are sent once).
A refill is applied by the first spend (or read) of a new period, in the same statement: two
processes at 00:00 cannot both apply it, and one asleep at 00:00 skips nothing. docs/scaling.md
gives the order's reasons and the figures behind the choice."""

import contextlib
import datetime
import math
import re

from peewee import SqliteDatabase
from werkzeug.exceptions import TooManyRequests

from keys import events
from models import ApiKey, db, iso_ms, iso_seconds, utcnow
from store.writelock import write_transaction

INTERVALS = ("day", "month")
REFILL_PATTERN = re.compile(r"\s*([1-9][0-9]{0,11})\s*/\s*(day|month)\s*")
CREDITS_PATTERN = re.compile(r"[0-9]{1,13}")
MAX_CREDITS = 10**12


class CreditsExhausted(TooManyRequests):
    """The key has no credits left (HTTP 429; Retry-After until its next refill, when it has one)."""

    error_code = "credits_exhausted"


def parse_credits(text, what="Credits"):
    """A whole number of credits from 0 to MAX_CREDITS; ValueError with a sentence otherwise."""
    text = str(text).strip()
    if not CREDITS_PATTERN.fullmatch(text) or int(text) > MAX_CREDITS:
        raise ValueError(f"{what} must be a whole number from 0 to {MAX_CREDITS}, not {text!r}.")
    return int(text)


def parse_refill(text):
    """(amount, interval) of a refill like 5000/month, or None for ''; ValueError otherwise."""
    text = (text or "").strip()
    if not text:
        return None
    match = REFILL_PATTERN.fullmatch(text.lower())
    if not match or int(match[1]) > MAX_CREDITS:
        raise ValueError(f"A refill is a whole number from 1, a slash and day or month (for example 5000/month), "
                         f"not {text!r}.")
    return int(match[1]), match[2]


def period_starts(now):
    """The starts of the current day and month (naive UTC), as the spend statement takes them."""
    day = now.replace(hour=0, minute=0, second=0, microsecond=0)
    return day, day.replace(day=1)


def next_refill_at(interval, now=None):
    """The naive UTC moment of the next refill of this interval after now."""
    day, month = period_starts(now or utcnow())
    if interval == "day":
        return day + datetime.timedelta(days=1)
    return (month + datetime.timedelta(days=32)).replace(day=1)


def spend(key, note, now=None):
    """Spend one of the key's credits, applying a refill that is due first; note the credits left on
    the request's note (for X-Credits-Remaining and usage/stats) and return (credits left, credits
    granted). Raise CreditsExhausted when none is left; then, and when the spend leaves none, the
    kept key remembers it has none."""
    day, month = period_starts(now or utcnow())
    params = [month, day] * 4 + [key.id, month, day]
    database = db.obj
    if isinstance(database, SqliteDatabase):
        with write_transaction(database):
            row = database.execute_sql(database.statements.spend_credit, params).fetchone()
    else:
        row = database.execute_sql(database.statements.spend_credit, params).fetchone()
    if row is None:
        note.credits_remaining = 0
        used_up(key, now)
        raise exhausted(key, now)
    note.credits_remaining = row[0]
    note.credit_spent = True
    if row[0] == 0:
        used_up(key, now)
    return row[0], row[1]


def used_up(key, now=None):
    """Remember on the key (kept by keys/keycache.py for the next requests) that its credits are
    spent, until its next refill: credits never come back but through a refill or a grant, and a
    grant is announced to every process as a revocation is, so the kept key is read afresh."""
    key.credits_remaining = 0
    if key.credits_refill_interval is not None:
        key.credits_refilled_for = period_start(key.credits_refill_interval, now)


def has_none(key, now=None):
    """True when the key, as read or as its last spend left it, has no credit now (a refill that
    is due counted in): with credits only ever going down between grants, it cannot have more."""
    return effective_remaining(key, now) == 0


def balance(key, now=None):
    """The credits the key has now, read from the database (a due refill counted in)."""
    row = db.obj.execute_sql(db.obj.statements.credits_of, (key.id,)).fetchone()
    if row is None:
        return None
    stored = ApiKey(__no_default__=True, id=key.id, credits_remaining=row[0], credits_refill_amount=row[1],
                    credits_refill_interval=row[2],
                    credits_refilled_for=ApiKey.credits_refilled_for.python_value(row[3]))
    return effective_remaining(stored, now)


def exhausted(key, now=None):
    """The CreditsExhausted for a key, with Retry-After until its next refill when it has one."""
    retry_after = None
    if key.credits_refill_interval is not None:
        now = now or utcnow()
        retry_after = max(1, math.ceil((next_refill_at(key.credits_refill_interval, now) - now).total_seconds()))
    refill = " until its next refill" if retry_after else ""
    return CreditsExhausted(f"This API key has no credits left{refill}.", retry_after=retry_after)


def effective_remaining(key, now=None):
    """The credits the key has now, a refill that is due counted in (a read applies nothing)."""
    if key.credits_remaining is None:
        return None
    return key.credits_refill_amount if refill_due(key, now) else key.credits_remaining


def refill_due(key, now=None):
    """True when the key has a refill that the current period has not applied yet."""
    return key.credits_refill_amount is not None and (
        key.credits_refilled_for is None or key.credits_refilled_for < period_start(key.credits_refill_interval, now))


def period_start(interval, now=None):
    """The start of the current day or month (naive UTC)."""
    day, month = period_starts(now or utcnow())
    return month if interval == "month" else day


def summary(key, remaining, now=None):
    """The `credits` object of usage/stats: the credits left (after this request) and the refill."""
    refill = None
    if key.credits_refill_amount is not None:
        refill = {"amount": key.credits_refill_amount, "interval": key.credits_refill_interval,
                  "next_at": iso_ms(next_refill_at(key.credits_refill_interval, now))}
    return {"remaining": remaining, "refill": refill}


def initial(given=None, refill=None, now=None):
    """The credit columns of a new key given credits and a refill (amount, interval); the refill's
    amount when only a refill is given; none without either."""
    if given is None and refill is None:
        return {}
    remaining = refill[0] if given is None else given
    columns = {"credits_remaining": remaining, "credits_granted": remaining}
    if refill is not None:
        columns.update(credits_refill_amount=refill[0], credits_refill_interval=refill[1],
                       credits_refilled_for=period_start(refill[1], now))
    return columns


def grant(key_id, set_to=None, add=None, refill=None, no_refill=False, now=None):
    """Set (set_to) or add to (add) a key's credits, and give it a refill ((amount, interval)) or take
    its refill away (no_refill), key.credits_changed sent in the same transaction; return the ApiKey
    as it is now. A key that had no credits gets
    them (a refill alone starts it at the refill's amount); a refill that was due is applied first,
    and the current period counts as refilled, so what is set stands until the next one."""
    now = now or utcnow()
    with holding(key_id) as key:
        ApiKey.update(granted(key, set_to, add, refill, no_refill, now)).where(ApiKey.id == key_id).execute()
        key = ApiKey.get_by_id(key_id)
        events.key_changed.send("key.credits_changed", key=key,
                                detail=f"{key.name} (id {key.id}): {describe(key, now)}")
    return key


@contextlib.contextmanager
def holding(key_id):
    """A transaction that holds the key's row from its read to its commit, so that no spend comes
    between them; yields the row (ApiKey.DoesNotExist when there is no such key)."""
    database = db.obj
    if isinstance(database, SqliteDatabase):
        transaction, query = database.atomic("IMMEDIATE"), ApiKey.select()
    else:
        transaction, query = database.atomic(), ApiKey.select().for_update()
    with transaction:
        yield query.where(ApiKey.id == key_id).get()


def granted(key, set_to, add, refill, no_refill, now):
    """The credit columns of the held key after grant()'s change (its arguments)."""
    current = effective_remaining(key, now)
    if set_to is not None:
        remaining = set_to
    elif add is not None:
        remaining = min(MAX_CREDITS, (current or 0) + add)
    else:
        remaining = current if current is not None else (refill[0] if refill else 0)
    changes = {ApiKey.credits_remaining: remaining, ApiKey.credits_granted: remaining}
    if no_refill:
        refill = (None, None)
    elif refill is None and key.credits_refill_amount is not None:
        refill = (key.credits_refill_amount, key.credits_refill_interval)
    if refill is not None:
        changes.update({ApiKey.credits_refill_amount: refill[0], ApiKey.credits_refill_interval: refill[1],
                        ApiKey.credits_refilled_for: refill[1] and period_start(refill[1], now)})
    return changes


def describe(key, now=None, with_next=False):
    """One line on a key's credits for the CLI and the key page: `credits=120 refill=5000/month`,
    and with_next ` next_refill=2026-12-01T00:00:00Z` when it has a refill; `-` without credits."""
    remaining = effective_remaining(key, now)
    if remaining is None:
        return "-"
    if key.credits_refill_amount is None:
        return f"credits={remaining} refill=none"
    line = f"credits={remaining} refill={key.credits_refill_amount}/{key.credits_refill_interval}"
    if with_next:
        line += f" next_refill={iso_seconds(next_refill_at(key.credits_refill_interval, now))}"
    return line
