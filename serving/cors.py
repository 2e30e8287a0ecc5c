"""Cross-origin access to /api/v1/ from browsers, opt-in through CORS_ORIGINS."""

from flask import current_app, request

from settings import ANY_ORIGIN

PREFIX = "/api/v1/"
# A browser script may read only the response headers named here (besides a few simple ones).
EXPOSED_HEADERS = ", ".join(["X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "RateLimit-Policy",
                             "RateLimit", "Retry-After", "X-Request-ID"])
PREFLIGHT_HEADERS = [("Access-Control-Allow-Methods", "GET, POST"),
                     ("Access-Control-Allow-Headers", "X-API-Key, X-Request-ID, Content-Type"),
                     ("Access-Control-Max-Age", "600")]


def init_app(app):
    """Register the CORS headers, only when CORS_ORIGINS allows some origin: otherwise requests pay
    nothing for it."""
    origins = app.config["CORS_ORIGINS"]
    if origins:
        app.extensions["cors"] = frozenset(origins)
        app.after_request(add_cors_headers)


def add_cors_headers(response):
    """Let an allowed origin's scripts read a /api/v1/ response, errors included, and answer its
    preflight; never with credentials (cookies), since the API authenticates by key alone."""
    if not request.path.startswith(PREFIX):
        return response
    # The answer depends on Origin, also when it is absent or refused: caches must key on it.
    headers = [("Vary", "Origin")]
    sent = request.headers.get("Origin")
    allowed = current_app.extensions["cors"]
    if sent is not None and (ANY_ORIGIN in allowed or sent in allowed):
        headers += [("Access-Control-Allow-Origin", ANY_ORIGIN if ANY_ORIGIN in allowed else sent),
                    ("Access-Control-Expose-Headers", EXPOSED_HEADERS)]
        if request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers:
            headers += PREFLIGHT_HEADERS
    # Added, not set: nothing else writes these on the API (it has no session, so no Vary: Cookie),
    # and set() scans every header for each.
    response.headers.extend(headers)
    return response
