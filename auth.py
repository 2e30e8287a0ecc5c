"""API keys and passwords: the key format, issuing and revoking keys, and the guard on protected routes."""

import functools
import hashlib
import re
import secrets
import string

from flask import g, request
from peewee import IntegrityError
from werkzeug.exceptions import Unauthorized
from werkzeug.security import check_password_hash, generate_password_hash

import ratelimit
from models import ApiKey, User, db, find_active_key, utcnow

KEY_PREFIXES = {"development": "sk_test_", "production": "sk_live_"}
KEY_ALPHABET = string.ascii_letters + string.digits
KEY_BODY_LENGTH = 40
KEY_PATTERN = re.compile(r"sk_(?:live|test)_[A-Za-z0-9]{32,128}")
DISPLAY_PREFIX_LENGTH = len("sk_live_") + 4

USERNAME_PATTERN = re.compile(r"[A-Za-z0-9_.-]{3,32}")
EMAIL_PATTERN = re.compile(r"[^@\s]{1,64}@[^@\s]+\.[^@\s]+")
MIN_PASSWORD_LENGTH = 8
MAX_KEY_NAME_LENGTH = 100
PASSWORD_METHOD = "scrypt:32768:8:1"


class AccountTaken(ValueError):
    """The username or the email already belongs to an account."""


class ApiKeyError(Unauthorized):
    """A missing, malformed, unknown or revoked API key (HTTP 401)."""

    def __init__(self, error_code, description):
        super().__init__(description)
        self.error_code = error_code

    def get_headers(self, environ=None, scope=None):
        return [*super().get_headers(environ, scope), ("WWW-Authenticate", 'ApiKey realm="api"')]


def hash_key(secret):
    """Return the hex SHA-256 of a key secret, the only form the database keeps."""
    return hashlib.sha256(secret.encode()).hexdigest()


def hash_password(password):
    """Return a salted scrypt hash of a password."""
    return generate_password_hash(password, method=PASSWORD_METHOD)


def password_matches(user, password):
    """Return True when the password is the user's."""
    return check_password_hash(user.password_hash, password)


@functools.cache
def unknown_user_hash():
    return hash_password(secrets.token_hex())


def user_for_login(username, password):
    """Return the user with this username and password, or None; an unknown username takes as long
    as a wrong password, so timing does not tell which usernames exist."""
    user = User.get_or_none(User.username == username.strip())
    if user is None:
        check_password_hash(unknown_user_hash(), password)
        return None
    return user if password_matches(user, password) else None


def create_user(username, email, password):
    """Create and return a user, or raise ValueError with a sentence saying what is wrong."""
    username, email = username.strip(), email.strip().lower()
    if not USERNAME_PATTERN.fullmatch(username):
        raise ValueError("A username is 3 to 32 letters, digits, dots, dashes or underscores.")
    if len(email) > 254 or not EMAIL_PATTERN.fullmatch(email):
        raise ValueError("That does not look like an email address.")
    if len(password) < MIN_PASSWORD_LENGTH:
        raise ValueError(f"A password needs at least {MIN_PASSWORD_LENGTH} characters.")
    if User.select().where(User.username == username).exists():
        raise AccountTaken(f"The username {username!r} is already taken.")
    if User.select().where(User.email == email).exists():
        raise AccountTaken(f"The email {email!r} already belongs to an account.")
    password_hash = hash_password(password)
    try:
        with db.atomic():
            return User.create(username=username, email=email, password_hash=password_hash)
    except IntegrityError:
        raise AccountTaken("That username or email was taken a moment ago.") from None


def issue_key(user, name, key_type, tier="free"):
    """Create an API key for the user; return (ApiKey, secret). The secret exists only here."""
    name = name.strip()
    if not 0 < len(name) <= MAX_KEY_NAME_LENGTH:
        raise ValueError(f"A key name is 1 to {MAX_KEY_NAME_LENGTH} characters.")
    if key_type not in KEY_PREFIXES:
        raise ValueError("The key type is either development or production.")
    if tier not in ratelimit.tier_names():
        known = ", ".join(sorted(ratelimit.tier_names()))
        raise ValueError(f"Unknown rate limit tier {tier!r}; the configured tiers are: {known}.")
    secret = generate_secret(key_type)
    with db.atomic():
        key = ApiKey.create(
            user=user,
            name=name,
            key_type=key_type,
            rate_limit_tier=tier,
            display_prefix=secret[:DISPLAY_PREFIX_LENGTH],
            key_hash=hash_key(secret),
        )
    return key, secret


def generate_secret(key_type):
    """Return a new secret of the type's prefix and KEY_BODY_LENGTH characters from a CSPRNG."""
    return KEY_PREFIXES[key_type] + "".join(secrets.choice(KEY_ALPHABET) for _ in range(KEY_BODY_LENGTH))


def revoke_key(key):
    """Mark the key revoked; it fails from the very next request on."""
    if key.revoked_at is None:
        key.revoked_at = utcnow()
        ApiKey.update(revoked_at=key.revoked_at).where(ApiKey.id == key.id).execute()


def authenticate(secret, source="the X-API-Key header"):
    """Return the active ApiKey for a secret, or raise ApiKeyError."""
    secret = (secret or "").strip()
    if not secret:
        raise ApiKeyError("missing_api_key", f"This endpoint needs an API key in {source}.")
    key = find_active_key(hash_key(secret)) if KEY_PATTERN.fullmatch(secret) else None
    if key is None:
        raise ApiKeyError("invalid_api_key", "The API key is malformed, unknown or revoked.")
    return key


def admit(secret, source="the X-API-Key header"):
    """Authenticate a secret, then count it against its key's allowance; the key goes on g.api_key."""
    g.api_key = authenticate(secret, source)
    ratelimit.count_request(g.api_key)
    return g.api_key


def require_api_key(view):
    """Guard a view: X-API-Key must hold an active key with allowance left; the request is counted."""

    @functools.wraps(view)
    def guarded(*args, **kwargs):
        admit(request.headers.get("X-API-Key"))
        return view(*args, **kwargs)

    return guarded
