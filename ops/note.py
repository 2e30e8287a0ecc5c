"""The note each request carries from its handling to the envelope that answers it (serving/envelope.py):
what the app, the guards and the limiter learned, in one object in the WSGI environ, and the
ContextVar that holds the environ of the request being served.

One object with __slots__ rather than Flask's `g` or string keys in the WSGI environ: the hot path
runs views without Flask's context (serving/fastlane.py), where `g` does not exist and each read of
a context proxy costs ~9,000 instructions against ~100 for a ContextVar."""

import contextvars

ENVIRON_KEY = "service.note"
# The environ, not the note: a note that held its environ would make every request a reference
# cycle, left for the garbage collector instead of freed when the request ends. Set for each request
# while the app runs; gevent gives every connection's greenlet its own context.
current_environ = contextvars.ContextVar("environ")


class Note:
    """What one request learned on its way through; None where it learned nothing of the kind."""

    __slots__ = ("app", "request_id", "route", "socket_route", "rate_limit", "usage_key_id", "counted",
                 "credits_remaining", "credit_spent", "data_versions")

    def __init__(self, app, request_id):
        self.app = app
        self.request_id = request_id
        # The rule of a request the fast lane served (Flask's own routing knows the others').
        self.route = None
        # The rule of a WebSocket, which ends outside Flask's request.
        self.socket_route = None
        # The RateLimitState of the window the request was counted in, for the rate-limit headers.
        self.rate_limit = None
        # The active key whose usage records the request's answer, and whether it passed the key's
        # allowance (total_requests counts only those).
        self.usage_key_id = None
        self.counted = False
        # The key's credits after the request's spend, for X-Credits-Remaining; whether it spent one
        # (the usage counts' ledger).
        self.credits_remaining = None
        self.credit_spent = False
        # {SQLite connection: its data_version} as a plain request (serving/fastlane.py) first read
        # it, so that the key cache and a kept answer (store/kept.py) read it once between them: its
        # answers are as of that look, as if it were served at once. None in any other request,
        # whose reads look each time (a WebSocket's outlive any look).
        self.data_versions = None


def of(environ):
    """The note of a request's WSGI environ, or None for one the app never saw (gunicorn refused it)."""
    return environ.get(ENVIRON_KEY)


def current():
    """The note of the request being served, in Flask or in the fast lane (serving/fastlane.py)."""
    return current_environ.get()[ENVIRON_KEY]


def data_versions():
    """The data_versions of the request being served, or None (in none, or in one that reads
    the data_version at each look)."""
    environ = current_environ.get(None)
    return None if environ is None else environ[ENVIRON_KEY].data_versions


def request_method(environ):
    """The method as Werkzeug gives it (request.method), by which Flask routes: "post" is a POST."""
    return environ.get("REQUEST_METHOD", "GET").upper()
