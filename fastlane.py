"""The fast lane: a plain keyed GET of the API served without Flask's request machinery.

Flask's request context, routing, hooks and response objects cost more than everything the service
itself does for `GET /api/v1/protected/test` (measured: a keyed request at 0.79 x a bare Flask
route through Flask, 1.09 x through this lane; docs/performance.md). A request takes the lane only
when Flask would do nothing for it beyond calling the view:

- its view is declared `without_flask` (it reads nothing but its key: no `request`, `g` or
  `current_app`) and guarded by auth.require_api_key, on a GET route without URL variables;
- it is exactly `GET` on exactly that path, with no body (no Content-Length but 0, no Transfer-Encoding)
  and no Origin;
- and the app has no hook that would act on it: every before_request hook of the app and of the
  API is one of NO_OPS_FOR_A_PLAIN_GET, and no after_request or teardown_request hook applies
  (so with CORS_ORIGINS set, whose hook adds Vary: Origin to every API response, there is no lane).

Anything else (HEAD, OPTIONS, a body, a path Werkzeug would redirect or normalise) goes through
Flask, as does every refusal: the error is rendered by the app's own handlers, in a request
context made for it, so a 401, 403, 429 or 503 is byte for byte Flask's. The envelope (envelope.py)
wraps both ways alike: request id, security and rate-limit headers, metrics and usage."""

from flask import signals

import metrics
import models

# Hooks known to do nothing for a bodiless GET of the API, by their qualified names (flask-wtf's
# check is a closure): the body limit, the CSRF checks (only for form methods, and flask-wtf's own
# is off: web.py checks forms itself) and the pruner's start, which the lane makes itself.
NO_OPS_FOR_A_PLAIN_GET = frozenset({
    "refuse_large_bodies", "protect_forms", "CSRFProtect.init_app.<locals>.csrf_protect", "Pruner.start"})

# What CONTENT_LENGTH holds for a request without a body: absent (servers), or 0 (Werkzeug's test client).
NO_BODY = frozenset({None, "", "0"})


def without_flask(view):
    """Declare a keyed view (under auth.require_api_key) plain: it returns a dict and reads nothing
    but its api_key, so the lane may serve it."""
    view.without_flask = True
    return view


class Lane:
    """WSGI middleware just outside Flask's wsgi_app: serves the plain requests of the declared
    views itself and hands every other request to Flask."""

    def __init__(self, app, wsgi_app):
        self.app = app
        self.wsgi_app = wsgi_app
        self.views = lane_views(app) if flask_would_only_call_the_view(app) else {}
        self.pruner = app.extensions["lifecycle"]
        self.encoder = app.json.encoder

    def __call__(self, environ, start_response):
        view = self.views.get(environ["PATH_INFO"])
        if (view is None or environ["REQUEST_METHOD"] != "GET" or environ.get("CONTENT_LENGTH") not in NO_BODY
                or "HTTP_TRANSFER_ENCODING" in environ or "HTTP_ORIGIN" in environ):
            return self.wsgi_app(environ, start_response)
        self.pruner.start()
        environ[metrics.ROUTE] = environ["PATH_INFO"]
        try:
            body = (self.encoder.encode(view()) + "\n").encode()
        except Exception as error:
            return self.render_error(environ, start_response, error)
        finally:
            models.release_connection()
        start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
        return [body]

    def render_error(self, environ, start_response, error):
        """The response Flask's full_dispatch_request gives for an error its view raised."""
        app = self.app
        with app.request_context(environ):
            try:
                response = app.finalize_request(app.handle_user_exception(error))
            except Exception as unhandled:
                response = app.handle_exception(unhandled)
            return response(environ, start_response)


def lane_views(app):
    """{path: view} for the GET rules without URL variables whose view is declared without_flask."""
    views = {}
    for rule in app.url_map.iter_rules():
        view = app.view_functions[rule.endpoint]
        if getattr(view, "without_flask", False) and "GET" in rule.methods and not rule.arguments:
            views[rule.rule] = view
    return views


def flask_would_only_call_the_view(app):
    """True when Flask would do nothing for a plain keyed GET of the API but route it and call its
    view: no hook or signal receiver that would act on it, no host checks (SERVER_NAME,
    TRUSTED_HOSTS) and no debug mode (whose JSON is indented)."""
    if app.debug or app.config.get("SERVER_NAME") or app.config.get("TRUSTED_HOSTS"):
        return False
    if any(signal.receivers for signal in (signals.request_started, signals.request_finished,
                                           signals.request_tearing_down, signals.appcontext_pushed,
                                           signals.appcontext_popped, signals.appcontext_tearing_down)):
        return False
    if app.teardown_appcontext_funcs != [models.release_request_connection]:
        return False  # the lane releases the database connection itself, and does nothing else
    scopes = (None, "api")
    before = [getattr(hook, "__qualname__", None) for scope in scopes for hook in app.before_request_funcs.get(scope, ())]
    others = [hook for hooks in (app.after_request_funcs, app.teardown_request_funcs, app.url_value_preprocessors)
              for scope in scopes for hook in hooks.get(scope, ())]
    return set(before) <= NO_OPS_FOR_A_PLAIN_GET and not others
