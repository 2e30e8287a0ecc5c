"""usage.threshold: the counts at which a key's window reaches 80 % and 100 % of its allowance,
worked out once per window (ratelimit.Limiter keeps them in the key's plan), so that the request
whose count is one of them (exactly one request of all processes sees each count) emits the event
at the cost of a dict lookup; and credits.low and credits.exhausted, from a spend's balance."""

import functools
import math

from keys.events import key_data
from metering import credits
from models import iso_seconds, utc_from_epoch

PERCENTS = (80, 100)


def marks(amount):
    """{requests left after the request: percent} for a window of amount; where 80 % and 100 % are
    the same request (an allowance of 1 to 4), 100 %."""
    return {amount - math.ceil(amount * percent / 100): percent for percent in PERCENTS}


@functools.lru_cache(maxsize=1024)
def marks_of(amounts):
    """marks() of each window's amount (None: no marks), one tuple shared by every key's plan of the same
    amounts: a kept key's plan lives in the key cache, and each object of its own adds to every full
    garbage collection."""
    return tuple(None if amount is None else marks(amount) for amount in amounts)


def ignore(org_id, event, data):
    """Where no one listens (a Limiter made without a watcher): the event goes nowhere."""


class Watcher:
    """Turns the counts that a key's requests reach into its events, handed to notify(org_id,
    event, data). It runs on the hot path, so notify must neither block nor touch the database
    (app.py hands in webhooks' deferred events, written by the next usage flush)."""

    def __init__(self, notify=ignore):
        self.notify = notify

    def credits_spent(self, key, remaining, granted):
        """credits.exhausted when a spend leaves a key no credit, credits.low when it leaves 10 % of
        what the last set, add or refill gave (granted): each count is left by one spend only, so
        each is sent once until the credits are set again."""
        if remaining == 0:
            interval = key.credits_refill_interval
            refill = interval and iso_seconds(credits.next_refill_at(interval))
            self.notify(key.org_id, "credits.exhausted", key_data(key, credits_remaining=0, next_refill_at=refill))
        elif granted >= 10 and remaining == granted // 10:
            self.notify(key.org_id, "credits.low", key_data(key, credits_remaining=remaining, credits_granted=granted))

    def reached(self, key, state, percent):
        """usage.threshold for the key's window (its RateLimitState after the request)."""
        self.notify(key.org_id, "usage.threshold", key_data(
            key, window=state.policy, limit=state.limit, window_seconds=state.window,
            used=state.limit - state.remaining, percent=percent, reset_at=iso_seconds(utc_from_epoch(state.reset))))
