"""The fast lane: a plain GET of the API served without Flask's request machinery.

Flask's request context, routing, hooks and response objects cost more than everything the service
itself does for `GET /api/v1/protected/test` (one interleaved run: the keyed request at 0.79 x a
bare Flask route through Flask, 1.09 x through this lane; docs/bench/hot-path.md). A request takes the
lane only when Flask would do nothing for it beyond calling its view:

- its view is declared `without_flask` (it returns a dict, or an ops.encoded.Encoded, and reads
  nothing but its key, if any: no `request`, `g` or `current_app`) right above its guard,
  auth.require_api_key or, for a public view, ratelimit.ip_rate_limited, on a GET route without
  URL variables;
- it is exactly `GET` on exactly that path, with no body (no Content-Length but 0, no
  Transfer-Encoding), no Origin, no Upgrade, a Host that Werkzeug's routing accepts, and a scheme
  other than ws or wss (which a proxy may forward: Werkzeug routes those to WebSocket rules only);
- and, as the app stands at its first request, no hook, signal receiver or setting would act on
  it (see flask_would_only_call_the_view: with CORS_ORIGINS set, whose hook adds Vary: Origin to
  every API response, there is no lane). From that request on, Flask refuses new hooks.

Anything else goes through Flask, and so does every refusal: the error is rendered by the app's
own handlers, in a request context made for it, so a 401, 403, 429 or 503 is Flask's. The
envelope (serving/envelope.py) wraps both ways alike: request id, security and rate-limit headers, metrics
and usage."""

import functools

from flask import signals

import models
from ops import note as request_note
from ops.encoded import Encoded

# What CONTENT_LENGTH holds for a request without a body: absent (servers), or 0 (Werkzeug's test client).
NO_BODY = frozenset({None, "", "0"})
# The schemes for which Werkzeug's routing matches WebSocket rules only (MapAdapter.websocket): a
# plain view's path then gets Flask's 426, uncounted.
WEBSOCKET_SCHEMES = frozenset({"ws", "wss"})
# Hooks that do nothing for a bodiless GET of the API, as (module, qualified name): the body limit
# and the CSRF checks (only for form methods; flask-wtf's own is off, as web/hooks.py checks forms
# itself).
NO_OPS_FOR_A_PLAIN_GET = frozenset({
    ("serving.bodylimit", "refuse_large_bodies"),
    ("web.hooks", "protect_forms"),
    ("flask_wtf.csrf", "CSRFProtect.init_app.<locals>.csrf_protect"),
})
SIGNALS = (signals.request_started, signals.request_finished, signals.request_tearing_down,
           signals.got_request_exception, signals.appcontext_pushed, signals.appcontext_popped,
           signals.appcontext_tearing_down)
# The views declared without_flask, by identity.
declared = set()


def without_flask(view):
    """Declare a view guarded by auth.require_api_key or ratelimit.ip_rate_limited plain (see the
    module's docstring)."""
    if getattr(view, "guard", None) is not view:
        raise TypeError(f"{view.__name__}: without_flask goes right above require_api_key or ip_rate_limited")
    declared.add(view)
    return view


class Lane:
    """WSGI middleware just outside Flask's wsgi_app: serves the plain requests of the declared
    views itself and hands every other request to Flask."""

    def __init__(self, app, wsgi_app):
        self.app = app
        self.wsgi_app = wsgi_app
        self.views = None  # decided at the first request, once the app is set up

    def __call__(self, environ, start_response):
        if self.views is None:
            self.views = self.open()
        view = self.views.get(environ["PATH_INFO"])
        if (view is None or environ["REQUEST_METHOD"] != "GET" or environ.get("CONTENT_LENGTH") not in NO_BODY
                or "HTTP_TRANSFER_ENCODING" in environ or "HTTP_ORIGIN" in environ or "HTTP_UPGRADE" in environ
                or environ["wsgi.url_scheme"] in WEBSOCKET_SCHEMES or not routable_host(environ.get("HTTP_HOST"))):
            return self.wsgi_app(environ, start_response)
        note = request_note.of(environ)
        note.route = environ["PATH_INFO"]
        note.data_versions = {}
        try:
            answer = view()
            if type(answer) is not dict and type(answer) is not Encoded:
                raise TypeError(f"{environ['PATH_INFO']}: a view declared without_flask returned {type(answer)}")
        except Exception as error:
            return self.render(environ, start_response, error, raised_by_view=True)
        finally:
            note.data_versions = None
            models.release_connection()
        try:
            text = answer.json if type(answer) is Encoded else self.app.json.encoder.encode(answer)
            body = (text + "\n").encode()
        except Exception as error:
            return self.render(environ, start_response, error, raised_by_view=False)
        start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
        return [body]

    def open(self):
        """{path: view} of the lane, or {} when Flask would do more than call the views. Flask is
        told the app has served (its private flag, as its first dispatch sets it), so it refuses
        setup from now on rather than the lane skipping a hook added later; tests/unit/serving/test_fastlane.py
        fails if Flask moves the flag."""
        self.app._got_first_request = True
        return lane_views(self.app) if flask_would_only_call_the_view(self.app) else {}

    def render(self, environ, start_response, error, raised_by_view):
        """The response Flask gives for an error raised where this one was: by the view (its
        handlers) or after it (making the response: Flask's handling of an unhandled error)."""
        app = self.app
        with app.request_context(environ):
            if raised_by_view:
                try:
                    response = app.finalize_request(app.handle_user_exception(error))
                except Exception as unhandled:
                    response = app.handle_exception(unhandled)
            else:
                response = app.handle_exception(error)
            return response(environ, start_response)


@functools.lru_cache(maxsize=256)
def routable_host(host):
    """False where Werkzeug's routing would refuse the Host (a 400: an empty or too long label), or
    there is none; True may be a Host it reads otherwise, which only matters to host routing."""
    if host is None:
        return False
    try:
        host.partition(":")[0].encode("idna")
    except UnicodeError:
        return False
    return True


def lane_views(app):
    """{path: view} for the GET rules without URL variables whose view is declared without_flask."""
    views = {}
    for rule in app.url_map.iter_rules():
        view = app.view_functions[rule.endpoint]
        if view in declared and "GET" in rule.methods and not rule.arguments:
            views[rule.rule] = view
    return views


def flask_would_only_call_the_view(app):
    """True when Flask would do nothing for a plain GET of the API but route it and call its
    view: no hook or signal receiver that would act on it, no host checks (SERVER_NAME,
    TRUSTED_HOSTS) and no debug mode (whose JSON is indented)."""
    if app.debug or app.config.get("SERVER_NAME") or app.config.get("TRUSTED_HOSTS") or app.json.compact is False:
        return False
    if any(signal.receivers for signal in SIGNALS):
        return False
    if app.teardown_appcontext_funcs != [models.release_request_connection]:
        return False  # the lane releases the database connection itself, and does nothing else
    scopes = (None, "api")
    before = {(hook.__module__, hook.__qualname__)
              for scope in scopes for hook in app.before_request_funcs.get(scope, ())}
    others = [hook for hooks in (app.after_request_funcs, app.teardown_request_funcs, app.url_value_preprocessors)
              for scope in scopes for hook in hooks.get(scope, ())]
    return before <= NO_OPS_FOR_A_PLAIN_GET and not others
