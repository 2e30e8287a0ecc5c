"""Request allowances per API key and per client IP on the `limits` library, and the rate-limit
headers."""

import collections
import functools
import ipaddress
import logging
import math
import time

from flask import current_app, request
from limits import RateLimitItemPerDay, RateLimitItemPerHour, RateLimitItemPerMinute
from limits import RateLimitItemPerSecond
from limits.errors import StorageError
from werkzeug.exceptions import InternalServerError, ServiceUnavailable, TooManyRequests

from store.limitstorage import open_storage, redis_windows, window_counter
from models import ApiKey, db
from metering import usage
from ops import metrics
from serving import settings

log = logging.getLogger(__name__)

PERIODS = {
    "second": RateLimitItemPerSecond,
    "minute": RateLimitItemPerMinute,
    "hour": RateLimitItemPerHour,
    "day": RateLimitItemPerDay,
}
PUBLIC_POLICY = "public"
# Web application throttles. Failed password checks are limited per client IP and per (username,
# IP), so others' failures never refuse the owner; past LOGIN_SLOWDOWN_AFTER failures for a
# username from anywhere, each of its checks waits LOGIN_SLOWDOWN_SECONDS (SECURITY.md weighs this).
LOGIN_FAILURES_PER_IP = RateLimitItemPerMinute(20)
LOGIN_FAILURES_PER_USERNAME_AND_IP = RateLimitItemPerMinute(5)
LOGIN_SLOWDOWN_AFTER = RateLimitItemPerHour(20)
LOGIN_SLOWDOWN_SECONDS = 1.0
SIGNUPS_PER_IP = RateLimitItemPerHour(20)
KEY_CREATIONS_PER_ACCOUNT = RateLimitItemPerHour(30)
# Wrong TOTP codes for one account from anywhere: past this, TOTP codes are refused for a while;
# recovery codes (80 bits) and passkeys still let the owner in.
TOTP_FAILURES_PER_ACCOUNT = RateLimitItemPerMinute(10, 15)
# Each roll writes a security event and, on Redis, makes every worker read its keys again.
KEY_ROLLS_PER_ACCOUNT = RateLimitItemPerHour(30)

RateLimitState = collections.namedtuple("RateLimitState", "policy limit remaining reset window")
RateLimitState.__doc__ = "One request's place in its window; reset is in epoch seconds."
# Where a request's RateLimitState waits for its response (serving/envelope.py writes the headers).
RATE_LIMIT_STATE = "service.rate_limit"


class RateLimitExceeded(TooManyRequests):
    """The allowance of the window is used up (HTTP 429, with Retry-After)."""

    error_code = "rate_limit_exceeded"


class LimitStorageUnavailable(ServiceUnavailable):
    """The limit storage cannot be reached; limits fail closed (HTTP 503)."""

    description = "The rate-limit storage is unavailable; try again shortly."


def limit_item(rate):
    """Return the limits item for an (amount, period) that serving/settings.py parsed."""
    amount, period = rate
    return PERIODS[period](amount)


def parse_tiers(spec):
    """Return {tier: item} from 'free=1000/hour,pro=10000/hour', or raise settings.ConfigError."""
    return {name: limit_item(rate) for name, rate in settings.tiers(spec).items()}


class Limiter:
    """Fixed windows that start with their first request, kept in a limits storage."""

    def __init__(self, storage, tiers, public_rate):
        self.storage = storage
        # On Redis, the counter also carries the key generation that keys/keycache.py relies on.
        self.windows = redis_windows(storage)
        self.count_hit = window_counter(storage, self.windows)
        self.tiers = tiers
        self.public_rate = public_rate

    def count_request(self, key, environ, generation=None):
        """Count a request (its WSGI environ) against the key's allowance and its usage; raise
        RateLimitExceeded when over, or KeysChanged when the key generation it was read under is
        not the current one."""
        tier = key.rate_limit_tier
        item = self.tiers.get(tier)
        if item is None:
            log.error("API key %s has tier %r, which RATE_LIMIT_TIERS does not define.", key.id, tier)
            raise InternalServerError("This API key's rate limit tier is not configured on the server.")
        # limits' key_for costs ~9,000 instructions: made once for a key the worker keeps.
        window = key.counted_window
        if window is None or window[0] is not item:
            window = key.counted_window = (item, item.key_for(f"key:{key.id}"))
        state = self.hit_window(item, window[1], tier, environ, generation)
        usage.counted(environ)
        return state

    def hit(self, item, identity, policy, environ=None, generation=None):
        """Count one request for identity; return its RateLimitState or raise RateLimitExceeded.
        With the request's WSGI environ, the state goes into its response headers (see
        current_window). With a key generation (Redis only), raise KeysChanged, counting nothing,
        once it is no longer current."""
        return self.hit_window(item, item.key_for(identity), policy, environ, generation)

    def hit_window(self, item, window_key, policy, environ=None, generation=None):
        """hit, for the window's storage key (item.key_for(identity))."""
        expiry = item.get_expiry()
        try:
            if generation is None:
                count, reset = self.count_hit(window_key, expiry)
            else:
                count, reset = self.windows.hit(window_key, expiry, generation)
        except StorageError as error:
            log.error("Rate-limit storage unavailable: %s", error.storage_error)
            raise LimitStorageUnavailable() from None
        state = RateLimitState(policy, item.amount, max(0, item.amount - count), reset, expiry)
        if environ is not None:
            environ[RATE_LIMIT_STATE] = state
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
            log.error("Rate-limit storage unavailable: %s", error.storage_error)
            raise LimitStorageUnavailable() from None

    def used_up(self, item, identity):
        """Return the seconds until identity's window for item ends when its allowance is used up,
        else 0; counts nothing."""
        window_key = item.key_for(identity)
        try:
            if self.storage.get(window_key) < item.amount:
                return 0
            return max(1, seconds_until(self.storage.get_expiry(window_key)))
        except StorageError as error:
            log.error("Rate-limit storage unavailable: %s", error.storage_error)
            raise LimitStorageUnavailable() from None


def init_app(app):
    """Parse the tiers and the public rate, open the limit storage and register the header hook."""
    tiers = parse_tiers(app.config["RATE_LIMIT_TIERS"])
    public = settings.public_rate(app.config["PUBLIC_RATE_LIMIT"])
    public_rate = None if public is None else limit_item(public)
    storage = open_storage(app.config["RATELIMIT_STORAGE_URL"])
    app.extensions["ratelimit"] = Limiter(storage, tiers, public_rate)
    warn_about_unknown_tiers(tiers)


def warn_about_unknown_tiers(tiers):
    with db.connection_context():
        used = {key.rate_limit_tier for key in ApiKey.select(ApiKey.rate_limit_tier).distinct()}
    for tier in sorted(used - tiers.keys()):
        log.warning("API keys with tier %r will be refused: RATE_LIMIT_TIERS does not define it.", tier)


def tier_names():
    """Return the names of the configured tiers."""
    return current_app.extensions["ratelimit"].tiers.keys()


def limit_client_ip():
    """Count a public request against its client IP's PUBLIC_RATE_LIMIT, unless that is off."""
    limiter = current_app.extensions["ratelimit"]
    if limiter.public_rate is None:
        return
    try:
        limiter.hit(limiter.public_rate, f"ip:{client_identity(request.remote_addr)}", PUBLIC_POLICY, request.environ)
    except LimitStorageUnavailable:
        # Public endpoints stay up without the limit storage; only keyed traffic fails closed.
        pass


@functools.lru_cache(maxsize=4096)
def client_identity(address):
    """The name per-IP limits give a client address: an IPv4 client's address; an IPv6 client's
    /64 (a subscriber's usual share, whose 2^64 addresses would otherwise each get an allowance),
    or the IPv4 address inside an IPv4-mapped, 6to4 or Teredo one; anything else shares one name."""
    ip = parse_address(address)
    if ip is None:
        return UNPARSABLE_ADDRESS
    if ip.version == 4:
        return str(ip)
    inner = ip.ipv4_mapped or ip.sixtofour or (ip.teredo[1] if ip.teredo else None)
    return str(inner) if inner else str(ipaddress.IPv6Network((ip, 64), strict=False))


UNPARSABLE_ADDRESS = "unparsable"


@functools.lru_cache(maxsize=4096)
def parse_address(text):
    """The IP address in a client address as proxies write it (`[v6]:port`, `v4:port`, a zone id),
    or None."""
    text = (text or "").strip()
    if text.startswith("["):
        text = text[1:].partition("]")[0]
    elif text.count(":") == 1:
        text = text.partition(":")[0]
    try:
        return ipaddress.ip_address(text.partition("%")[0])
    except ValueError:
        return None


def ip_rate_limited(view):
    """Limit a public view per client IP to PUBLIC_RATE_LIMIT."""

    @functools.wraps(view)
    def limited(*args, **kwargs):
        limit_client_ip()
        return view(*args, **kwargs)

    return limited


def password_attempt(username):
    """Count a password check (a log-in, or a form that asks for the password) before it is made, so
    that checks running at once cannot all slip under a limit that only finished ones would reach.
    Raise RateLimitExceeded when this client IP, or this client IP for this username, is over its
    allowance; else return the seconds the attempt should wait (the per-username slowdown)."""
    limiter = current_app.extensions["ratelimit"]
    for item, identity in login_failure_windows(username):
        try:
            limiter.hit(item, identity, "login")
        except RateLimitExceeded as error:
            raise RateLimitExceeded("Too many failed log-ins.", retry_after=error.retry_after) from None
    slow = limiter.used_up(LOGIN_SLOWDOWN_AFTER, slowdown_identity(username))
    return LOGIN_SLOWDOWN_SECONDS if slow else 0


def password_accepted(username):
    """Give back the attempt of a right password: only failures stay counted."""
    limiter = current_app.extensions["ratelimit"]
    for item, identity in login_failure_windows(username):
        limiter.give_back(item, identity)


def password_refused(username):
    """Count a wrong password towards the per-username slowdown (the attempt itself is counted)."""
    try:
        current_app.extensions["ratelimit"].hit(LOGIN_SLOWDOWN_AFTER, slowdown_identity(username), "login")
    except RateLimitExceeded:
        pass


def slowdown_identity(username):
    return f"login-user:{username_identity(username)}"


def login_failure_windows(username):
    ip = client_identity(request.remote_addr)
    return [(LOGIN_FAILURES_PER_IP, f"login-ip:{ip}"),
            (LOGIN_FAILURES_PER_USERNAME_AND_IP, f"login-user-ip:{username_identity(username)}:{ip}")]


def username_identity(username):
    # Bounded, so that a megabyte of username is not a megabyte of limit key.
    return username.strip().lower()[:64]


def count_signup():
    """Count a sign-up attempt per client IP; raise RateLimitExceeded when too many."""
    identity = f"signup-ip:{client_identity(request.remote_addr)}"
    current_app.extensions["ratelimit"].hit(SIGNUPS_PER_IP, identity, "signup")


def count_key_creation(user):
    """Count a key created in the web application; raise RateLimitExceeded when too many."""
    current_app.extensions["ratelimit"].hit(KEY_CREATIONS_PER_ACCOUNT, f"key-creations:{user.id}",
                                            "key-creation")


def count_totp_guess(user):
    """Count a TOTP code before it is checked, from any address; RateLimitExceeded past the cap."""
    current_app.extensions["ratelimit"].hit(TOTP_FAILURES_PER_ACCOUNT, f"totp-guesses:{user.id}", "login")


def totp_guess_accepted(user):
    """Give back the guess of a right TOTP code: only wrong ones stay counted."""
    current_app.extensions["ratelimit"].give_back(TOTP_FAILURES_PER_ACCOUNT, f"totp-guesses:{user.id}")


def count_key_roll(user):
    """Count a roll in the web application, refused ones too; raise RateLimitExceeded when too many."""
    current_app.extensions["ratelimit"].hit(KEY_ROLLS_PER_ACCOUNT, f"key-rolls:{user.id}", "key-roll")


def seconds_until(epoch):
    """Return the whole seconds from now until an epoch time, rounded up, never negative."""
    return max(0, math.ceil(epoch - time.time()))


def current_window():
    """The RateLimitState this request was counted in."""
    return request.environ[RATE_LIMIT_STATE]


def header_lines(state):
    """The X-RateLimit-* and IETF draft-11 RateLimit headers of a request's window."""
    limit, policy = policy_lines(state.policy, state.limit, state.window)
    return (
        limit,
        ("X-RateLimit-Remaining", str(state.remaining)),
        ("X-RateLimit-Reset", str(math.ceil(state.reset))),
        policy,
        ("RateLimit", f'"{state.policy}";r={state.remaining};t={seconds_until(state.reset)}'),
    )


@functools.lru_cache(maxsize=256)
def policy_lines(policy, limit, window):
    """The headers that are the same for every request of a policy: built once, not per request."""
    return ("X-RateLimit-Limit", str(limit)), ("RateLimit-Policy", f'"{policy}";q={limit};w={window}')
