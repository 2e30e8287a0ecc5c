"""What every response gets on its way out, added by one WSGI middleware around the whole app: its
request id, its count and duration in the metrics, the API's security headers, the rate-limit
headers of the window it was counted in, and, for a request made with an active key, its record in
that key's usage.

One middleware rather than two middlewares and four Flask hooks: each hook costs a call through
Flask and a context lookup per request, which was a sixth of a keyed request's own time. Views and
guards write what the envelope needs on the request's note (ops/note.py), which the envelope makes;
nothing else writes these headers."""

import functools
import math
import time

from ops import logs, metrics, note as request_note
from ratelimit import seconds_until

API_PREFIX = "/api/"
API_PATH = API_PREFIX.lstrip("/")
# X-API-Key is not Authorization, so HTTP caches may store keyed responses unless told not to.
API_HEADERS = (("Cache-Control", "no-store"), ("X-Content-Type-Options", "nosniff"))
# Over HTTPS, tell browsers to come back only over HTTPS.
HSTS = ("Strict-Transport-Security", "max-age=31536000")
SECURE_SCHEMES = frozenset({"https", "wss"})


class Envelope:
    def __init__(self, app):
        self.wsgi_app = app.wsgi_app
        self.app = app
        self.usage_counter = app.extensions["usage"]

    def __call__(self, environ, start_response):
        started = time.perf_counter()
        request_id = logs.request_id_for(environ.get("HTTP_X_REQUEST_ID"))
        note = environ[request_note.ENVIRON_KEY] = request_note.Note(self.app, request_id)

        def start_enveloped(status, headers, exc_info=None):
            code = int(status[:3])
            headers.append((logs.REQUEST_ID_HEADER, request_id))
            # As Werkzeug routes it: //api/v1/... reaches the API's views too.
            if environ["PATH_INFO"].lstrip("/").startswith(API_PATH):
                headers.extend(API_HEADERS)
            # ProxyFix, inside this middleware, has set the scheme the client used by now.
            if environ["wsgi.url_scheme"] in SECURE_SCHEMES:
                headers.append(HSTS)
            state = note.rate_limit
            if state is not None:
                headers.extend(header_lines(state))
                if note.credits_remaining is not None:
                    headers.append(("X-Credits-Remaining", str(note.credits_remaining)))
            key_id = note.usage_key_id
            # A 401 here means the key was revoked or deleted meanwhile: no longer an active key's.
            if key_id is not None and code != 401:
                # A request that passed the limit but failed (503: the database went away) was
                # not served: it stays in the history, not in total_requests.
                self.usage_counter.add(key_id, metrics.route(environ), code, code < 500 and note.counted,
                                       note.credit_spent)
            metrics.count(environ, code, time.perf_counter() - started)
            return start_response(status, headers, exc_info)

        serving = request_note.current_environ.set(environ)
        try:
            return self.wsgi_app(environ, start_enveloped)
        except StopIteration:
            # How flask-sock ends a WebSocket under gunicorn, once it has closed. Its lifetime is
            # no latency: counted, not timed.
            metrics.count(environ, 101, None)
            raise
        finally:
            request_note.current_environ.reset(serving)


def header_lines(state):
    """The X-RateLimit-* and IETF draft-11 RateLimit headers of a request's window."""
    limit, policy = policy_lines(state.policy, state.limit, state.window)
    if state.policies is not None:
        policy = ("RateLimit-Policy", state.policies)
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
