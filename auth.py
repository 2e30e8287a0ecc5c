"""API keys: the key format, issuing and revoking keys, and the guard on protected routes."""

import functools
import hashlib
import re
import secrets
import string

from flask import current_app, g, request
from werkzeug.exceptions import Unauthorized

import accounts
import ratelimit
from models import ApiKey, db, find_active_key, utcnow

KEY_PREFIXES = {"development": "sk_test_", "production": "sk_live_"}
KEY_ALPHABET = string.ascii_letters + string.digits
KEY_BODY_LENGTH = 40
KEY_PATTERN = re.compile(r"sk_(?:live|test)_[A-Za-z0-9]{32,128}")
DISPLAY_PREFIX_LENGTH = len("sk_live_") + 4

MAX_KEY_NAME_LENGTH = 100


class KeyCapReached(ValueError):
    """The user already holds MAX_KEYS_PER_USER active keys."""


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


def issue_key(user, name, key_type, tier="free"):
    """Create an API key for the user; return (ApiKey, secret). The secret exists only here."""
    name = name.strip()
    accounts.refuse_control_characters(name, "A key name")
    if not 0 < len(name) <= MAX_KEY_NAME_LENGTH:
        raise ValueError(f"A key name is 1 to {MAX_KEY_NAME_LENGTH} characters.")
    if key_type not in KEY_PREFIXES:
        raise ValueError("The key type is either development or production.")
    if tier not in ratelimit.tier_names():
        known = ", ".join(sorted(ratelimit.tier_names()))
        raise ValueError(f"Unknown rate limit tier {tier!r}; the configured tiers are: {known}.")
    secret = generate_secret(key_type)
    with db.atomic():
        accounts.lock_user(user)
        cap = current_app.config["MAX_KEYS_PER_USER"]
        if accounts.active_key_count(user) >= cap:
            raise KeyCapReached(f"An account may hold {cap} active keys; revoke one before creating another.")
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
