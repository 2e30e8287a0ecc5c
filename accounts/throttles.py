"""The web application's throttles: failed log-ins, sign-ups, key creations, rolls and changes, and TOTP
guesses, counted in the rate-limit storage per client IP, username or account.

They count through the app's limiter (ratelimit.py, in `app.extensions`), which refuses with its
RateLimitExceeded, a 429 (werkzeug's TooManyRequests): the policy lives here, beside the accounts it
protects, and the mechanism stays in the tier above."""

from flask import current_app, request
from limits import RateLimitItemPerHour, RateLimitItemPerMinute
from werkzeug.exceptions import TooManyRequests

from ops.clientaddress import client_identity

# Failed password checks are limited per client IP and per (username,
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
# Each change of a key does as much, and writes a webhook message for each of its organisation's endpoints.
KEY_CHANGES_PER_ACCOUNT = RateLimitItemPerHour(60)
# Each import reads and writes up to 10,000 keys (orgs/keyimports.py).
KEY_IMPORTS_PER_ACCOUNT = RateLimitItemPerHour(10)


def password_attempt(username):
    """Count a password check (a log-in, or a form that asks for the password) before it is made, so
    that checks running at once cannot all slip under a limit that only finished ones would reach.
    Raise RateLimitExceeded when this client IP, or this client IP for this username, is over its
    allowance; else return the seconds the attempt should wait (the per-username slowdown)."""
    storage_limiter = limiter()
    for item, identity in login_failure_windows(username):
        try:
            storage_limiter.hit(item, identity, "login")
        except TooManyRequests as error:
            raise reworded(error, "Too many failed log-ins.") from None
    slow = storage_limiter.used_up(LOGIN_SLOWDOWN_AFTER, slowdown_identity(username))
    return LOGIN_SLOWDOWN_SECONDS if slow else 0


def password_accepted(username):
    """Give back the attempt of a right password: only failures stay counted."""
    storage_limiter = limiter()
    for item, identity in login_failure_windows(username):
        storage_limiter.give_back(item, identity)


def password_refused(username):
    """Count a wrong password towards the per-username slowdown (the attempt itself is counted)."""
    try:
        limiter().hit(LOGIN_SLOWDOWN_AFTER, slowdown_identity(username), "login")
    except TooManyRequests:
        pass


def count_login_ip_request():
    """Count a request of a form that mails an account (a forgotten password, a new link) against
    this client IP's log-in allowance; raise RateLimitExceeded when it is spent. Such a request
    never gives its count back: sending mail is what a flood would want."""
    ip = client_identity(request.remote_addr)
    try:
        limiter().hit(LOGIN_FAILURES_PER_IP, f"login-ip:{ip}", "login")
    except TooManyRequests as error:
        raise reworded(error, "Too many requests from this address.") from None


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
    limiter().hit(SIGNUPS_PER_IP, identity, "signup")


def count_key_creation(user):
    """Count a key created in the web application; raise RateLimitExceeded when too many."""
    limiter().hit(KEY_CREATIONS_PER_ACCOUNT, f"key-creations:{user.id}", "key-creation")


def count_totp_guess(user):
    """Count a TOTP code before it is checked, from any address; RateLimitExceeded past the cap."""
    limiter().hit(TOTP_FAILURES_PER_ACCOUNT, f"totp-guesses:{user.id}", "login")


def totp_guess_accepted(user):
    """Give back the guess of a right TOTP code: only wrong ones stay counted."""
    limiter().give_back(TOTP_FAILURES_PER_ACCOUNT, f"totp-guesses:{user.id}")


def count_key_roll(user):
    """Count a roll in the web application, refused ones too; raise RateLimitExceeded when too many."""
    limiter().hit(KEY_ROLLS_PER_ACCOUNT, f"key-rolls:{user.id}", "key-roll")


def count_key_change(user):
    """Count a key's Edit form sent in the web application, refused ones too; raise
    RateLimitExceeded when too many."""
    limiter().hit(KEY_CHANGES_PER_ACCOUNT, f"key-changes:{user.id}", "key-change")


def count_key_import(user):
    """Count an Import keys form sent in the web application, refused ones too; raise
    RateLimitExceeded when too many."""
    limiter().hit(KEY_IMPORTS_PER_ACCOUNT, f"key-imports:{user.id}", "key-import")


def limiter():
    """The app's ratelimit.Limiter."""
    return current_app.extensions["ratelimit"]


def reworded(refusal, sentence):
    """The limiter's refusal, of its own kind and with its Retry-After, saying sentence."""
    return type(refusal)(sentence, retry_after=refusal.retry_after)
