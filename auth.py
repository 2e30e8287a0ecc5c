"""The guard on protected routes: a request's API key authenticated, its scope and allow-list
checked, its request counted."""

import functools

from flask import current_app
from werkzeug.exceptions import Forbidden, Unauthorized

from keys import allowips
from keys.keyformat import hash_key
from keys.lookup import find_active_key
from metering import credits
from models import SCOPES
from ops import metrics, note as request_note
from store.rediswindows import KeysChanged


class InsufficientScope(Forbidden):
    """A valid key without the scope the endpoint needs (HTTP 403)."""

    error_code = "insufficient_scope"


class IpNotAllowed(Forbidden):
    """A valid key used from an address its allow-list does not name (HTTP 403)."""

    error_code = "ip_not_allowed"


REFUSALS = (InsufficientScope, IpNotAllowed)


class ApiKeyError(Unauthorized):
    """A missing, malformed, unknown or revoked API key (HTTP 401)."""

    def __init__(self, error_code, description):
        super().__init__(description)
        self.error_code = error_code

    def get_headers(self, environ=None, scope=None):
        return [*super().get_headers(environ, scope), ("WWW-Authenticate", 'ApiKey realm="api"')]


def authenticate(secret, source="the X-API-Key header"):
    """Return the active ApiKey for a secret, read from the database, or raise ApiKeyError. A key
    awaiting its first use (an imported slow hash) is not checked here."""
    secret = given_secret(secret, source)
    admitted = key_cache().forms.admit(secret)
    return found_key(find_active_key(hash_key(secret)) if admitted else None)


def key_cache():
    """The app's key cache: through the request's note where there is one, since a view of the fast
    lane has no Flask context (ops/note.py); else the app of the context (a command, a test)."""
    environ = request_note.current_environ.get(None)
    note = request_note.of(environ) if environ is not None else None
    return (note.app if note is not None else current_app).extensions["keys"]


def given_secret(secret, source):
    """Return the secret without surrounding whitespace; raise ApiKeyError when there is none."""
    secret = (secret or "").strip()
    if not secret:
        raise ApiKeyError("missing_api_key", f"This endpoint needs an API key in {source}.")
    return secret


def found_key(key):
    if key is None:
        raise ApiKeyError("invalid_api_key", "The API key is malformed, unknown or revoked.")
    return key


def require_scope(key, scope):
    """Raise InsufficientScope unless the key has the scope."""
    if scope not in key.scope_list():
        # A scope guards more than the endpoint SCOPES names for it (usage:read: stats and history).
        needed_by = SCOPES[scope]
        environ = request_note.current_environ.get()
        route = metrics.route(environ)
        if not needed_by.endswith(" " + route):
            needed_by = f"{request_note.request_method(environ)} {route}"
        raise InsufficientScope(f"This API key lacks the scope {scope!r}, which {needed_by} needs.")


def require_allowed_address(key):
    """Raise IpNotAllowed unless the key may be used from the client's address (the one the per-IP
    limits use: REMOTE_ADDR, from X-Forwarded-For behind TRUSTED_PROXIES)."""
    if key.allowed_networks is None:
        return
    environ = request_note.current_environ.get()
    client_address = environ.get("REMOTE_ADDR")
    if not allowips.permits(key.allowed_networks, client_address):
        # Not the owner's traffic: neither counted nor recorded in the key's usage.
        request_note.of(environ).usage_key_id = None
        address = allowips.client_ip(client_address or "") or "this address"
        raise IpNotAllowed(f"This API key may not be used from {address}: its IP allow-list does not include it.")


def require_access(key, scope):
    """Raise InsufficientScope unless the key has the scope, IpNotAllowed unless it may be used from here."""
    require_scope(key, scope)
    require_allowed_address(key)


def admit(secret, scope, note, source="the X-API-Key header", hold=None):
    """Authenticate a secret, check its scope and allow-list, then count the request (whose note is
    this) against its key's allowance; return the key. A key refused by its scope or allow-list is
    not counted. hold(key), where given, runs once, after those checks and before the count: what
    it takes (a time socket's slot) is taken only for a key read from the database, never a kept
    one the count has not confirmed yet, and a refusal it raises counts nothing. Otherwise the key
    may come from the worker's cache (keys/keycache.py); where the count must confirm it, a stale
    one is read again, uncounted. The REST API and the time socket are admitted alike."""
    # The note's app, not current_app: a context proxy costs more than the rest of this (ops/note.py).
    service = note.app.extensions
    keys, limiter = service["keys"], service["ratelimit"]
    secret = given_secret(secret, source)
    key_hash = hash_key(secret)
    # Its form is checked only before the database is read: a kept hash is a real key's.
    key, generation = keys.find(key_hash, secret, note.data_versions)
    key = found_key(key)
    if hold is not None and generation is not None:
        # A kept key may be revoked by now, and hold's refusal (too many sockets) would answer for
        # it before the count could tell: read it (a handshake's cost, not a REST request's).
        key, generation = found_key(keys.reload(key_hash)), None
    # Its answer goes into the key's usage: refusals for scope and rate as well as successes.
    note.usage_key_id = key.id
    try:
        require_access(key, scope)
        if hold is not None:
            hold(key)
        limiter.count_request(key, note, generation)
    except (KeysChanged, *REFUSALS, credits.CreditsExhausted) as refusal:
        if not isinstance(refusal, KeysChanged) and generation is None:
            raise
        # A kept key not yet confirmed is read again before it is refused (a revoked key is a 401,
        # not a 403) or counted. This read comes after any change announced before the request
        # arrived, so the count needs no second confirmation. (A key with hold was read above.)
        key = found_key(keys.reload(key_hash))
        require_access(key, scope)
        limiter.count_request(key, note)
    return key


def require_api_key(scope):
    """Guard a view: X-API-Key must hold an active key with the scope and allowance left; the
    request is counted, and the view gets the key as its api_key argument."""

    def decorate(view):
        @functools.wraps(view)
        def guarded(*args, **kwargs):
            environ = request_note.current_environ.get()
            note = environ[request_note.ENVIRON_KEY]
            return view(*args, api_key=admit(environ.get("HTTP_X_API_KEY"), scope, note), **kwargs)

        # Itself, not a copy that functools.wraps would give a decorator around it: tells a view
        # guarded right here from one wrapped again since.
        guarded.guard = guarded
        return guarded

    return decorate
