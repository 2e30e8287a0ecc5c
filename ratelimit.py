"""Request allowances per API key and per client IP on the `limits` library (the rate-limit headers
they give a response: serving/envelope.py)."""

import collections
import functools
import logging
import math
import time

from limits import RateLimitItemPerDay, RateLimitItemPerHour, RateLimitItemPerMinute, RateLimitItemPerSecond
from limits.errors import StorageError
from werkzeug.exceptions import InternalServerError, TooManyRequests

import settings
from metering import credits, thresholds
from models import ApiKey, db
from ops import metrics, note as request_note, services
from ops.clientaddress import client_identity
from ops.outage import FailureLog, StorageOutage
from store.limitstorage import LimitStorageUnavailable, open_storage, window_admitter, window_counter, window_taker
from store.rediswindows import KeysChanged, redis_windows

log = logging.getLogger(__name__)

PERIODS = {
    "second": RateLimitItemPerSecond,
    "minute": RateLimitItemPerMinute,
    "hour": RateLimitItemPerHour,
    "day": RateLimitItemPerDay,
}
PUBLIC_POLICY = "public"
RateLimitState = collections.namedtuple("RateLimitState", "policy limit remaining reset window policies",
                                        defaults=(None,))
RateLimitState.__doc__ = """One request's place in its window; reset is in epoch seconds; policies: the
RateLimit-Policy header of a request counted in several windows, None for one."""
Window = collections.namedtuple("Window", "item key policy")
Window.__doc__ = "One window a key is counted in: its limits item, its storage key, its policy name."
LimitPlan = collections.namedtuple("LimitPlan", "limiter windows storage_windows simple policies marks")
LimitPlan.__doc__ = """How a Limiter counts one key: its windows (and their (storage key, seconds, allowance)
for the storage's hit_all: storage_windows); simple: one window and no credits, counted in one storage call
(hit_window); marks: for each window, the requests left at which it reaches a usage.threshold
(metering/thresholds.py), or None for the organisation's window."""
# "account": the organisation's window as the RateLimit headers name it.
ORGANISATION_POLICY = "account"
OVERRIDE_POLICY = "key"


class RateLimitExceeded(TooManyRequests):
    """The allowance of the window is used up (HTTP 429, with Retry-After)."""

    error_code = "rate_limit_exceeded"


class OrganisationRateLimitExceeded(RateLimitExceeded):
    """The allowance that all keys of the organisation share is used up (HTTP 429, with Retry-After)."""

    error_code = "account_rate_limit_exceeded"


def limit_item(rate):
    """Return the limits item for an (amount, period) that settings/ parsed."""
    amount, period = rate
    return PERIODS[period](amount)


def parse_tiers(spec):
    """Return {tier: (item, ...)} from 'free=10/second+1000/hour,pro=10000/hour', or raise
    settings.ConfigError."""
    return {name: tuple(map(limit_item, rates)) for name, rates in settings.tiers(spec).items()}


def parse_limits(text):
    """The canonical form of a key's own windows (`10/second+5000/hour`); ValueError with a sentence."""
    return "+".join(f"{amount}/{period}" for amount, period in settings.rates(text, "A key's limit"))


@functools.lru_cache(maxsize=1024)
def limit_items(text):
    """The limits items of a key's own windows, as parse_limits wrote them."""
    return tuple(limit_item(rate) for rate in settings.rates(text, "A key's limit"))


def unavailable(error):
    """The LimitStorageUnavailable (HTTP 503) for a StorageError, raised by each storage call's except
    clause (a decorator would add a frame to every counted request): unlogged by the limiter's own
    methods, logged (Limiter.logged) by those called from outside unless they admit the request."""
    return LimitStorageUnavailable(storage_error=error.storage_error)


class Limiter:
    """Fixed windows that start with their first request, kept in a limits storage."""

    def __init__(self, storage, tiers, public_rate, organisation_rate=None, watcher=None, fail_open=False):
        self.storage = storage
        # RATE_LIMIT_ON_STORAGE_FAILURE=open: a keyed request the storage cannot count is admitted.
        self.outage = StorageOutage() if fail_open else None
        self.failure_log = FailureLog()
        # Public requests pass without the storage: after its failure they skip it for a second.
        self.public_outage = StorageOutage()
        # What becomes of a key's usage and credit thresholds (metering/thresholds.py's Watcher).
        self.watcher = watcher or thresholds.Watcher()
        # On Redis, the counter also carries the key generation that keys/keycache.py relies on.
        self.windows = redis_windows(storage)
        self.count_hit = window_counter(storage, self.windows)
        self.admit_all = window_admitter(storage, self.windows)
        self.take_back = window_taker(storage, self.windows)
        self.tiers = tiers
        self.public_rate = public_rate
        self.organisation_rate = organisation_rate

    def count_request(self, key, note, generation=None):
        """Count a request (its note) against every window of the key and its organisation, and
        spend one of its credits; raise RateLimitExceeded (OrganisationRateLimitExceeded) when a window is
        used up, credits.CreditsExhausted when no credit is left, counting nothing then, or
        KeysChanged when the key generation it was read under is not the current one. With
        fail_open, a request the storage cannot count is admitted (admit_uncounted)."""
        if self.outage is not None and self.outage.recent():
            return self.admit_uncounted(key, note, generation)
        plan = key.limit_plan
        if plan is None or plan.limiter is not self:
            plan = self.plan_for(key)
        try:
            if plan.simple:
                window = plan.windows[0]
                state = self.hit_window(window.item, window.key, window.policy, note, generation)
                if state.remaining in plan.marks[0]:
                    self.watcher.reached(key, state, plan.marks[0][state.remaining])
            elif key.has_credits:
                state = self.count_with_credit(key, plan, note, generation)
            else:
                state, _ = self.hit_windows(plan, note, generation, key)
        except LimitStorageUnavailable as refusal:
            if self.outage is None:
                raise self.logged(refusal) from None
            self.outage.failed(refusal.storage_error)
            return self.admit_uncounted(key, note, generation)
        if self.outage is not None:
            self.outage.answered()
        note.counted = True
        return state

    def admit_uncounted(self, key, note, generation):
        """Admit a request its windows could not count, spending its credit all the same; a kept key
        (generation) is not trusted without the count: KeysChanged has it read again (uncounted)."""
        if generation is not None:
            raise KeysChanged()
        if key.has_credits:
            if credits.has_none(key):
                note.credits_remaining = 0
                raise credits.exhausted(key)
            self.watcher.credits_spent(key, *credits.spend(key, note))
        self.outage.admitted()
        note.counted = True

    def plan_for(self, key):
        """Make (once for each key it counts: limits' key_for costs ~9,000 instructions) and keep
        on the key the LimitPlan of its windows: its own, or its tier's, and its organisation's."""
        if key.rate_limits:
            items, name = limit_items(key.rate_limits), OVERRIDE_POLICY
        else:
            items, name = self.tiers.get(key.rate_limit_tier), key.rate_limit_tier
            if items is None:
                log.error("API key %s has tier %r, which RATE_LIMIT_TIERS does not define.", key.id, name)
                raise InternalServerError("This API key's rate limit tier is not configured on the server.")
        tag = self.hash_tag(key)
        windows = [Window(item, item.key_for(f"{tag}key:{key.id}"),
                          name if len(items) == 1 else f"{name}-{item.GRANULARITY.name}") for item in items]
        if self.organisation_rate is not None:
            item = self.organisation_rate
            windows.append(Window(item, item.key_for(f"{tag}org:{key.org_id}"), ORGANISATION_POLICY))
        # A plan lives as long as its kept key: plain values in a tuple, which full collections stop walking.
        storage_windows = tuple((window.key, window.item.get_expiry(), window.item.amount) for window in windows)
        policies = ", ".join(f'"{window.policy}";q={window.item.amount};w={window.item.get_expiry()}'
                             for window in windows)
        simple = len(windows) == 1 and not key.has_credits
        marks = thresholds.marks_of(tuple(None if window.policy == ORGANISATION_POLICY else window.item.amount
                                          for window in windows))
        key.limit_plan = LimitPlan(self, windows, storage_windows, simple, policies, marks)
        return key.limit_plan

    def hash_tag(self, key):
        """The hash tag of the key's windows and generation on Redis Cluster ('' elsewhere), for one
        script to count them all: its organisation's where that has a window, else its own."""
        if self.windows is None or not self.windows.cluster:
            return ""
        return self.hash_tags(key)[self.organisation_rate is not None]

    @staticmethod
    def hash_tags(key):  # both tags the key's windows may have: its own, its organisation's
        return f"{{key:{key.id}}}", f"{{org:{key.org_id}}}"

    def hit_windows(self, plan, note, generation=None, key=None, announce=True):
        """Count a request in every window of the plan, or in none when one is used up (the storage's
        hit_all); return the RateLimitState of the window with the fewest requests left, and every
        window's. Each of the key's windows that reaches a usage.threshold emits it, unless
        announce is False (the caller then calls announce_thresholds once the request holds its place)."""
        try:
            refused, counts = self.admit_all(plan.storage_windows, generation)
        except StorageError as error:
            raise unavailable(error) from None
        states = [RateLimitState(window.policy, window.item.amount, max(0, window.item.amount - count), reset,
                                 window.item.get_expiry(), plan.policies)
                  for window, (count, reset) in zip(plan.windows, counts)]
        if refused < 0:
            if announce:
                self.announce_thresholds(plan, states, key)
            state = note.rate_limit = min(states, key=lambda state: state.remaining)
            return state, states
        state = note.rate_limit = states[refused]
        metrics.rate_limited(state.policy)
        refusal = OrganisationRateLimitExceeded if state.policy == ORGANISATION_POLICY else RateLimitExceeded
        retry_after = max(1, seconds_until(state.reset))
        whose = "account's" if refusal is OrganisationRateLimitExceeded else f"{state.policy!r}"
        raise refusal(f"The {whose} allowance of {state.limit} requests is used up; retry in {retry_after} seconds.",
                      retry_after=retry_after)

    def announce_thresholds(self, plan, states, key):
        """Emit usage.threshold for each of the key's windows whose count (its RateLimitState) is one."""
        for state, marks in zip(states, plan.marks):
            if marks is not None and state.remaining in marks:
                self.watcher.reached(key, state, marks[state.remaining])

    def peek(self, plan):
        """The RateLimitState of the plan's window with the fewest requests left, counting nothing."""
        states = []
        try:
            for window in plan.windows:
                count = self.storage.get(window.key)
                reset = self.storage.get_expiry(window.key) if count else time.time() + window.item.get_expiry()
                states.append(RateLimitState(window.policy, window.item.amount, max(0, window.item.amount - count),
                                             reset, window.item.get_expiry(), plan.policies))
        except StorageError as error:
            raise unavailable(error) from None
        return min(states, key=lambda state: state.remaining)

    def count_with_credit(self, key, plan, note, generation):
        """Count the request in its windows, then spend one of the key's credits; a request the
        windows admit but no credit is left for is taken back out of them. A key known to have no
        credit left is refused before its windows are touched; a request the windows refuse spends
        nothing, and is told credits_exhausted only when the key has none. In this order a spend is
        never undone, so a key that still holds credits is never told it has none (docs/scaling.md)."""
        if credits.has_none(key):
            note.credits_remaining = 0
            note.rate_limit = self.peek(plan)
            raise credits.exhausted(key)
        try:
            # A place given back below is counted again by a later request: only a request that
            # keeps its place announces the count it reached.
            state, states = self.hit_windows(plan, note, generation, key, announce=False)
        except RateLimitExceeded:
            remaining = note.credits_remaining = credits.balance(key)
            if remaining == 0:
                credits.used_up(key)
                raise credits.exhausted(key) from None
            raise
        try:
            remaining, granted = credits.spend(key, note)
        except BaseException:
            self.give_back_places(plan, states)
            note.rate_limit = state._replace(remaining=min(state.limit, state.remaining + 1))
            raise
        self.announce_thresholds(plan, states, key)
        self.watcher.credits_spent(key, remaining, granted)
        return state

    def give_back_places(self, plan, states):
        """Take a request back out of the windows it was counted in (their RateLimitStates), each
        only while it is still the window that counted it: the one after it never held the request."""
        try:
            self.take_back([(window.key, state.reset, state.window / 2) for window, state in zip(plan.windows, states)])
        except StorageError as error:
            self.logged(unavailable(error))  # the request's own failure stands; the place stays counted

    def hit(self, item, identity, policy, note=None, generation=None):
        """Count one request for identity; return its RateLimitState or raise RateLimitExceeded.
        With the request's note, the state goes into its response headers (see current_window).
        With a key generation (Redis only), raise KeysChanged, counting nothing, once it is no
        longer current."""
        try:
            return self.hit_window(item, item.key_for(identity), policy, note, generation)
        except LimitStorageUnavailable as refusal:
            raise self.logged(refusal) from None

    def logged(self, refusal):
        """The refusal (a LimitStorageUnavailable), its storage's failure logged (FailureLog)."""
        self.failure_log.failed(refusal.storage_error)
        return refusal

    def hit_window(self, item, window_key, policy, note=None, generation=None):
        """hit, for the window's storage key (item.key_for(identity))."""
        expiry = item.get_expiry()
        try:
            if generation is None:
                count, reset = self.count_hit(window_key, expiry)
            else:
                count, reset = self.windows.hit(window_key, expiry, generation)
        except StorageError as error:
            raise unavailable(error) from None
        state = RateLimitState(policy, item.amount, max(0, item.amount - count), reset, expiry)
        if note is not None:
            note.rate_limit = state
        if count > item.amount:
            metrics.rate_limited(policy)
            retry_after = max(1, seconds_until(reset))
            raise RateLimitExceeded(
                f"The {policy!r} allowance of {item.amount} requests is used up; "
                f"retry in {retry_after} seconds.",
                retry_after=retry_after,
            )
        return state

    def close(self):
        """Stop the storage's background work, where it has any."""
        if hasattr(self.storage, "close"):
            self.storage.close()

    def give_back(self, item, identity):
        """Take back one counted request of identity's current window, if it still has one."""
        window_key = item.key_for(identity)
        try:
            if self.storage.get(window_key) > 0:
                self.storage.incr(window_key, item.get_expiry(), amount=-1)
        except StorageError as error:
            raise self.logged(unavailable(error)) from None

    def used_up(self, item, identity):
        """Return the seconds until identity's window for item ends when its allowance is used up,
        else 0; counts nothing."""
        window_key = item.key_for(identity)
        try:
            if self.storage.get(window_key) < item.amount:
                return 0
            return max(1, seconds_until(self.storage.get_expiry(window_key)))
        except StorageError as error:
            raise self.logged(unavailable(error)) from None


def init_app(app, watcher):
    """Parse the tiers and the public rate and open the limit storage; watcher (metering/thresholds.py's
    Watcher) is told of the thresholds keys reach."""
    tiers = parse_tiers(app.config["RATE_LIMIT_TIERS"])
    public = settings.public_rate(app.config["PUBLIC_RATE_LIMIT"])
    public_rate = None if public is None else limit_item(public)
    organisation = settings.account_rate(app.config["ACCOUNT_RATE_LIMIT"])
    storage = open_storage(app.config["RATELIMIT_STORAGE_URL"])
    limiter = app.extensions["ratelimit"] = Limiter(
        storage, tiers, public_rate, None if organisation is None else limit_item(organisation), watcher,
        fail_open=app.config["RATE_LIMIT_ON_STORAGE_FAILURE"] == "open")
    # No start: the memory storage schedules its own sweeps (store/limitstorage.py); only its close is ours.
    services.register(app, "ratelimit", limiter)
    warn_about_unknown_tiers(tiers)


def warn_about_unknown_tiers(tiers):
    with db.connection_context():
        used = {key.rate_limit_tier for key in ApiKey.select(ApiKey.rate_limit_tier).distinct()}
    for tier in sorted(used - tiers.keys()):
        log.warning("API keys with tier %r will be refused: RATE_LIMIT_TIERS does not define it.", tier)


def limit_client_ip():
    """Count the request being served against its client IP's PUBLIC_RATE_LIMIT, unless that is
    off. Read from the environ and its note, not Flask's request: the fast lane has none."""
    environ = request_note.current_environ.get()
    note = environ[request_note.ENVIRON_KEY]
    limiter = note.app.extensions["ratelimit"]
    outage = limiter.public_outage
    # The attribute first: no method call on a public request while the storage answers.
    if limiter.public_rate is None or (outage.failed_at is not None and outage.recent()):
        return
    try:
        limiter.hit(limiter.public_rate, f"ip:{client_identity(environ.get('REMOTE_ADDR'))}", PUBLIC_POLICY, note)
    except LimitStorageUnavailable as refusal:
        outage.failed(refusal.storage_error)  # public endpoints stay up; keyed traffic fails closed
        return
    if outage.failed_at is not None:
        outage.answered()


def ip_rate_limited(view):
    """Limit a public view per client IP to PUBLIC_RATE_LIMIT."""

    @functools.wraps(view)
    def limited(*args, **kwargs):
        limit_client_ip()
        return view(*args, **kwargs)

    # As auth.require_api_key marks its guard: serving/fastlane.py's without_flask looks for it.
    limited.guard = limited
    return limited


def seconds_until(epoch):
    """Return the whole seconds from now until an epoch time, rounded up, never negative."""
    return max(0, math.ceil(epoch - time.time()))


def current_window():
    """The RateLimitState this request was counted in."""
    return request_note.current().rate_limit
