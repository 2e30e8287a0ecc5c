"""usage.threshold: the counts at which a key's window reaches 80 % and 100 % of its allowance,
worked out once per window (ratelimit.Limiter keeps them in the key's plan), so that the request
whose count is one of them (exactly one request of all processes sees each count) emits the event
at the cost of a dict lookup."""

import math

from metering import credits
from models import iso_seconds, utc_from_epoch
from webhooks import outbox

PERCENTS = (80, 100)


def marks(amount):
    """{requests left after the request: percent} for a window of amount; where 80 % and 100 % are
    the same request (an allowance of 1 to 4), 100 %."""
    return {amount - math.ceil(amount * percent / 100): percent for percent in PERCENTS}


def credits_spent(key, remaining, granted):
    """Emit credits.exhausted when a spend leaves a key no credit, credits.low when it leaves 10 % of
    what the last set, add or refill gave (granted): each count is left by one spend only, so
    each is sent once until the credits are set again."""
    if remaining == 0:
        interval = key.credits_refill_interval
        refill = interval and iso_seconds(credits.next_refill_at(interval))
        outbox.emit_soon(key.user_id, "credits.exhausted", outbox.key_data(
            key, credits_remaining=0, next_refill_at=refill))
    elif granted >= 10 and remaining == granted // 10:
        outbox.emit_soon(key.user_id, "credits.low", outbox.key_data(
            key, credits_remaining=remaining, credits_granted=granted))


def reached(key, state, percent):
    """Emit usage.threshold for the key's window (its RateLimitState after the request) without
    touching the database here: the usage flush writes it."""
    outbox.emit_soon(key.user_id, "usage.threshold", outbox.key_data(
        key, window=state.policy, limit=state.limit, window_seconds=state.window,
        used=state.limit - state.remaining, percent=percent, reset_at=iso_seconds(utc_from_epoch(state.reset))))
