"""What every page shares: the session cookie and the CSRF check (init_app), and page_blueprint,
the blueprint each view module of web/ (and webhooks/pages.py) makes for itself, with the hooks
that load the logged-in user and set the pages' headers, and the pages that answer a refusal."""

import functools

from flask import Blueprint, current_app, flash, g, redirect, request, session, url_for
from flask.sessions import SecureCookieSessionInterface
from flask_wtf.csrf import CSRFProtect
from werkzeug.exceptions import default_exceptions

from accounts import sessions, users
from mail import addresscap
from ops import note as request_note
from orgs import invitations, members as org_members, organisations
from serving import envelope
from web import fields

MAX_ID = 2**63 - 1  # the largest id SQLite and PostgreSQL can hold; beyond it a URL names nothing
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; object-src 'none'; base-uri 'self'; form-action 'self'; frame-ancestors 'none'"
)
FORM_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# The status of a page that answers a refusal: orgs/ says what it refuses, the pages how. Found
# along the refusal's classes, so a PersonalOwner answers as a LastOwner, a NoMoreMail as itself.
REFUSAL_STATUS = {org_members.NotAllowed: 403, org_members.NotMember: 404, org_members.LastOwner: 409,
                  invitations.WrongAddress: 403, addresscap.NoMoreMail: 429, ValueError: 400}

csrf = CSRFProtect()


class SessionInterface(SecureCookieSessionInterface):
    """Signed cookie sessions whose cookie is Secure whenever the request came over HTTPS, and none
    at all for the API."""

    def open_session(self, app, request):
        # The API authenticates by key only: a browser's login cookie must grant it nothing, and
        # skipping the cookie saves every API request building a signing serializer (~18 us).
        if request.path.startswith(envelope.API_PREFIX):
            return None
        return super().open_session(app, request)

    def get_cookie_secure(self, app):
        return super().get_cookie_secure(app) or request.is_secure


def init_app(app):
    """Protect every form against CSRF and set the session cookie's flags; the view modules'
    blueprints are registered by create_app."""
    app.config["SESSION_COOKIE_HTTPONLY"] = True
    app.config["SESSION_COOKIE_SAMESITE"] = "Lax"
    app.session_interface = SessionInterface()
    # flask-wtf's own check looks up every request's blueprint and view before its method (~4 us
    # on each API GET); protect_forms asks the method first.
    app.config["WTF_CSRF_CHECK_DEFAULT"] = False
    csrf.init_app(app)
    app.before_request(protect_forms)
    app.context_processor(fields.template_helpers)


def protect_forms():
    """Check the CSRF token of every request that may change something, outside the API: it
    authenticates by key, never by the browser's cookie, so it has no token to ask for."""
    # A request no view matches runs none: it gets its 404 or 405, as with flask-wtf's own check.
    # The method from the environ: this runs on every request (see ops/note.py).
    method = request_note.request_method(request_note.current_environ.get())
    if (method in FORM_METHODS and request.endpoint is not None and current_app.config["WTF_CSRF_ENABLED"]
            and not request.path.startswith(envelope.API_PREFIX)):
        csrf.protect()


def page_blueprint(name, import_name):
    """A view module's blueprint: its pages know the logged-in user, send the pages' headers, and
    answer a deleted account, a deleted organisation and orgs/' refusals as pages."""
    bp = Blueprint(name, import_name)
    bp.before_request(load_logged_in_user)
    bp.after_request(add_page_headers)
    bp.register_error_handler(users.AccountGone, account_gone)
    bp.register_error_handler(organisations.OrganisationGone, organisation_gone)
    # orgs/ decides again with the organisation's row held (a role changed meanwhile decides): its
    # refusals are the pages' 403 and 404, rendered as any other (an error handler cannot abort()).
    bp.register_error_handler(org_members.NotAllowed, refused_page)
    bp.register_error_handler(org_members.NotMember, refused_page)
    return bp


def load_logged_in_user():
    # The cookie names a session row; log-out, "Sign out everywhere", a password change and a
    # deleted account delete rows, and with them every copy of the cookie.
    g.session = sessions.find_session(session.get("sid"))
    g.user = g.session.user if g.session else None
    # The organisation the pages work in and the user's role there (orgs/roles.py decides what it allows).
    g.membership = organisations.current_membership(g.user, g.session.org_id) if g.user else None
    g.org = g.membership.org if g.membership else None


def add_page_headers(response):
    # Pages can show a secret once, or a user's keys: no cache may keep them.
    response.headers["Cache-Control"] = "no-store"
    response.headers["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
    response.headers["X-Content-Type-Options"] = "nosniff"
    # A page whose address holds a secret (a reset link's) sets a stricter one.
    response.headers.setdefault("Referrer-Policy", "same-origin")
    return response


def login_required(view):
    """Send a visitor who is not logged in to the login page, and back here afterwards."""

    @functools.wraps(view)
    def wrapped(**kwargs):
        if g.user is None:
            flash("Log in first: that page belongs to your account.")
            return redirect(url_for("signin.login", next=request.path))
        return view(**kwargs)

    return wrapped


def status_of(refused):
    """The status of a page that answers the refusal (REFUSAL_STATUS)."""
    return next(REFUSAL_STATUS[kind] for kind in type(refused).__mro__ if kind in REFUSAL_STATUS)


def refused_page(refused):
    """The member's role, read under the organisation's row, does not allow the change; or the
    member acted on, or the one acting, is not (or no longer) in the current organisation."""
    return current_app.handle_http_exception(default_exceptions[status_of(refused)]())


def account_gone(error):
    """The account was deleted (in another tab, say) while this request changed it."""
    session.clear()
    flash("That account no longer exists.")
    return redirect(url_for("signin.login"))


def organisation_gone(error):
    """The organisation was deleted while this request changed it: the session falls back to the personal one."""
    flash("That organisation no longer exists.")
    return redirect(url_for("security.settings_security"))
