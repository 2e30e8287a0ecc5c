"""The REST API under /api/v1."""

import math
import re

from flask import Blueprint, current_app, request
from werkzeug.exceptions import HTTPException, ServiceUnavailable

import auth
import models
import openapi
import ratelimit
from accounts import keycreators
from auth import require_api_key
from metering import analytics, credits, usage
from models import iso_ms, iso_second
from openapi import VERSION
from ops import note as request_note
from orgs import keyactions
from ratelimit import ip_rate_limited
from serving.fastlane import without_flask
from store.limitstorage import LimitStorageUnavailable

REVOKE_ATTEMPTS = 3

api = Blueprint("api", __name__, url_prefix="/api/v1")


@api.get("/demo/year")
@without_flask
@ip_rate_limited
def demo_year():
    now = models.utcnow()
    return {"year": now.year, "message": f"The current year is {now.year}.", "timestamp": iso_ms(now)}


@api.get("/status")
@without_flask
@ip_rate_limited
def status():
    try:
        authenticated = bool(auth.authenticate(request_note.current_environ.get().get("HTTP_X_API_KEY")))
    except auth.ApiKeyError:
        authenticated = False
    return {"status": "operational", "version": VERSION, "authenticated": authenticated}


@api.get("/protected/test")
@without_flask
@require_api_key("test:read")
def protected_test(api_key):
    return {
        "success": True,
        "message": "Your API key is valid.",
        "api_key_name": api_key.name,
        "api_key_type": api_key.key_type,
        "rate_limit_tier": api_key.rate_limit_tier,
        "timestamp": models.now_strings()[0],
    }


@api.get("/user/me")
@without_flask
@require_api_key("user:read")
def user_me(api_key):
    # The key itself may have been deleted with its organisation since it was admitted.
    return auth.found_key(keycreators.described(api_key))


@api.get("/usage/stats")
@without_flask
@require_api_key("usage:read")
def usage_stats(api_key):
    key, window = api_key, ratelimit.current_window()
    if window is None:
        # Admitted uncounted (RATE_LIMIT_ON_STORAGE_FAILURE=open): the allowance left is unknown.
        raise LimitStorageUnavailable()
    total = usage.total_requests(key)
    if total is None:
        auth.found_key(None)  # deleted with its account since it was admitted
    stats = {
        "api_key_name": key.name,
        "total_requests": total,
        "rate_limit_tier": key.rate_limit_tier,
        "requests_remaining": window.remaining,
        "reset_time": iso_second(math.ceil(window.reset)),
    }
    if key.has_credits:
        stats["credits"] = credits.summary(key, request_note.current().credits_remaining)
        stats["credits_spent_today"] = usage.credits_spent_today(key)
    return stats


@api.get("/usage/history")
@without_flask
@require_api_key("usage:read")
def usage_history(api_key):
    return analytics.history(api_key)


@api.post("/keys/revoke")
@ip_rate_limited
def revoke_leaked_key():
    """Revoke the key in X-API-Key: whoever holds a secret, its owner or whoever found it in public,
    may kill it. A rolled-out secret still in its grace period ends only itself: its holder was to
    lose access at the end of the grace, not to end the owner's new secret."""
    secret = request.headers.get("X-API-Key")
    # A roll or revocation between the lookup and the change makes the secret something else: look again.
    for _ in range(REVOKE_ATTEMPTS):
        key = auth.authenticate(secret)
        if key.opened_by_previous_secret():
            if keyactions.revoke_previous_secret(key):
                return {"revoked": True, "api_key_name": key.name, "secret": "previous"}
        elif keyactions.revoke_key(key, leaked=True):
            return {"revoked": True, "api_key_name": key.name, "secret": "current"}
    # Each lost race was a real change (the 30 rolls an hour bound them): rare enough to ask again.
    raise ServiceUnavailable("The key changed while it was being revoked; try again.")


@api.get("/openapi.json")
@ip_rate_limited
def openapi_document():
    # What this configuration serves (GitHub's reports only while they are on), once the app is built.
    served = current_app.extensions.get("openapi")
    if served is None:
        served = current_app.extensions["openapi"] = openapi.described(routed_by(current_app.url_map))
    return served


def routed_by(url_map):
    """serves(path, method): whether the URL map routes an OpenAPI path (its {parameters} any
    value) and method."""
    adapter = url_map.bind("localhost")

    def serves(path, method):
        try:
            adapter.match(re.sub(r"\{[^}/]+\}", "1", path), method=method.upper())
        except HTTPException:  # not found, another method's, or a redirect to another path
            return False
        return True

    return serves
