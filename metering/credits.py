"""Credits: a number of requests a key may make, spent one per counted request, optionally set
again to a fixed amount at 00:00 UTC every day or on the 1st of every month.

The database holds them, in every topology: credits are bought and sold, so they must outlive a
restart of Redis (which may keep nothing on disk) and be exact across any number of workers and
instances. A spend is one conditional UPDATE ... RETURNING: the row's lock orders concurrent
spends, so they never go below 0 nor admit more requests than there were credits. A request
spends its credit before its windows count it, so only requests holding a credit ever take a
place in a window; one the windows then refuse gets its credit back. A refill is
applied by the first spend (or read) of a new period, in the same statement: two processes at
00:00 cannot both apply it, and one asleep at 00:00 skips nothing. docs/scaling.md gives the
figures behind the choice."""

import datetime
import math
import re

from peewee import SqliteDatabase
from werkzeug.exceptions import TooManyRequests

from models import ApiKey, db, iso_ms, utcnow
from store.writelock import write_transaction

INTERVALS = ("day", "month")
REFILL_PATTERN = re.compile(r"\s*([1-9][0-9]{0,11})\s*/\s*(day|month)\s*")
CREDITS_PATTERN = re.compile(r"[0-9]{1,13}")
MAX_CREDITS = 10**12
# Where a request notes its key's credits after its spend, for the X-Credits-Remaining header
# (serving/envelope.py) and usage/stats.
CREDITS_REMAINING = "service.credits_remaining"


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


def spend(key, environ, now=None):
    """Spend one of the key's credits, applying a refill that is due first; note the credits left in
    the request's WSGI environ and return (credits left, credits granted, the period refilled for,
    which refund takes). Raise CreditsExhausted when none is left."""
    day, month = period_starts(now or utcnow())
    row = write(db.obj.statements.spend_credit, [month, day] * 4 + [key.id, month, day])
    if row is None:
        environ[CREDITS_REMAINING] = 0
        raise exhausted(key, now)
    environ[CREDITS_REMAINING] = row[0]
    return row


def refund(key, environ, spent):
    """Give back the credit of a spend (what spend returned) that the windows then refused, unless a
    refill came meanwhile: that one set the credits afresh."""
    refilled_for = spent[2]
    statements = db.obj.statements
    if refilled_for is None:
        write(statements.refund_credit_unrefilled, [key.id])
    else:
        write(statements.refund_credit, [key.id, refilled_for])
    environ[CREDITS_REMAINING] = spent[0] + 1


def write(statement, params):
    """Run one statement that writes a key's credits; return the row it returns."""
    database = db.obj
    if isinstance(database, SqliteDatabase):
        with write_transaction(database):
            return database.execute_sql(statement, params).fetchone()
    return database.execute_sql(statement, params).fetchone()


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
    its refill away (no_refill); return the ApiKey as it is now. A key that had no credits gets
    them (a refill alone starts it at the refill's amount); a refill that was due is applied first,
    and the current period counts as refilled, so what is set stands until the next one."""
    now = now or utcnow()
    database = db.obj
    # The key's row held from the read to the write, so no spend comes between them.
    if isinstance(database, SqliteDatabase):
        transaction, query = database.atomic("IMMEDIATE"), ApiKey.select()
    else:
        transaction, query = database.atomic(), ApiKey.select().for_update()
    with transaction:
        key = query.where(ApiKey.id == key_id).get()
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
        ApiKey.update(changes).where(ApiKey.id == key_id).execute()
    return ApiKey.get_by_id(key_id)


def describe(key, now=None):
    """One line on a key's credits for the CLI and the key page: `credits=120 refill=5000/month`."""
    remaining = effective_remaining(key, now)
    if remaining is None:
        return "-"
    refill = f"{key.credits_refill_amount}/{key.credits_refill_interval}" if key.credits_refill_amount is not None else "none"
    return f"credits={remaining} refill={refill}"
