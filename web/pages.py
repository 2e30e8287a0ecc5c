"""The web application: accounts, Profile Settings with the Security tab's keys, and the playground."""

import datetime
import functools
import json
import time
from urllib.parse import urlsplit

from flask import Blueprint, current_app, flash, g, redirect, render_template, request, session, url_for
from flask.sessions import SecureCookieSessionInterface
from flask_wtf.csrf import CSRFProtect

import ratelimit
from accounts import emailaddress, organisations, securitylog, twofactor, users
from keys import allowips
from mail import outbox
from metering import analytics
from models import SCOPES, ApiKey, personal_organisation, utcnow
from ops import note as request_note
from orgs import members as org_members
from serving import envelope
from web import addressmails, fields, reference, throttles

bp = Blueprint("web", __name__)
csrf = CSRFProtect()

KEY_TYPES = {"development": "Development", "production": "Production"}
ENDPOINTS = [
    ("GET", "/api/v1/demo/year", "public"),
    ("GET", "/api/v1/status", "public"),
    ("GET", "/api/v1/protected/test", "API key"),
    ("GET", "/api/v1/user/me", "API key"),
    ("GET", "/api/v1/usage/stats", "API key"),
    ("GET", "/api/v1/usage/history", "API key"),
]
MAX_ID = 2**63 - 1  # the largest id SQLite and PostgreSQL can hold; beyond it a URL names nothing
EXPIRIES = {"7d": "7 days", "30d": "30 days", "90d": "90 days", "365d": "365 days", "never": "Never"}
# When a rolled key's current secret stops working.
GRACES = {"0": "now", "1h": "in 1 hour", "24h": "in 24 hours", "7d": "in 7 days"}
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; object-src 'none'; base-uri 'self'; form-action 'self'; frame-ancestors 'none'"
)


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
    """Protect every form against CSRF, set the session cookie's flags and register the pages."""
    app.config["SESSION_COOKIE_HTTPONLY"] = True
    app.config["SESSION_COOKIE_SAMESITE"] = "Lax"
    app.session_interface = SessionInterface()
    # flask-wtf's own check looks up every request's blueprint and view before its method (~4 us
    # on each API GET); protect_forms asks the method first.
    app.config["WTF_CSRF_CHECK_DEFAULT"] = False
    csrf.init_app(app)
    app.before_request(protect_forms)
    app.context_processor(fields.template_helpers)
    app.register_blueprint(bp)


FORM_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def protect_forms():
    """Check the CSRF token of every request that may change something, outside the API: it
    authenticates by key, never by the browser's cookie, so it has no token to ask for."""
    # A request no view matches runs none: it gets its 404 or 405, as with flask-wtf's own check.
    # The method from the environ: this runs on every request (see ops/note.py).
    method = request_note.request_method(request_note.current_environ.get())
    if (method in FORM_METHODS and request.endpoint is not None and current_app.config["WTF_CSRF_ENABLED"]
            and not request.path.startswith(envelope.API_PREFIX)):
        csrf.protect()


@bp.before_request
def load_logged_in_user():
    # The cookie names a session row; log-out, "Sign out everywhere", a password change and a
    # deleted account delete rows, and with them every copy of the cookie.
    g.session = users.find_session(session.get("sid"))
    g.user = g.session.user if g.session else None
    # The organisation the pages work in and the user's role there (orgs/roles.py decides what it allows).
    g.membership = organisations.current_membership(g.user, g.session.org_id) if g.user else None
    g.org = g.membership.org if g.membership else None


@bp.after_request
def add_page_headers(response):
    # Pages can show a secret once, or a user's keys: no cache may keep them.
    response.headers["Cache-Control"] = "no-store"
    response.headers["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
    response.headers["X-Content-Type-Options"] = "nosniff"
    # A page whose address holds a secret (a reset link's) sets a stricter one.
    response.headers.setdefault("Referrer-Policy", "same-origin")
    return response


@bp.errorhandler(users.AccountGone)
def account_gone(error):
    """The account was deleted (in another tab, say) while this request changed it."""
    session.clear()
    flash("That account no longer exists.")
    return redirect(url_for("web.login"))


def login_required(view):
    """Send a visitor who is not logged in to the login page, and back here afterwards."""

    @functools.wraps(view)
    def wrapped(**kwargs):
        if g.user is None:
            flash("Log in first: that page belongs to your account.")
            return redirect(url_for("web.login", next=request.path))
        return view(**kwargs)

    return wrapped


def log_in(user):
    """Start a fresh session for the user in this browser, ending the one it had: nothing from
    before (nor its CSRF token, nor a copy of its cookie) carries over. False when the account
    changed under the log-in (see users.start_session)."""
    if g.get("session") is not None:
        users.end_session(g.session)
    session.clear()
    token = users.start_session(user)
    if token is None:
        return False
    session["sid"] = token
    return True


def local_path(target):
    """Return target when a browser would read it as a path on this site, else None (no open
    redirects). Browsers drop tabs and line breaks anywhere in a URL and read a backslash as a
    slash, so `/\t/evil.example` and `/\\evil.example` lead off the site: anything with a control
    character or a backslash is refused, as is anything that names a scheme or a host."""
    if not target or users.CONTROL_CHARACTERS.search(target) or "\\" in target:
        return None
    if not target.startswith("/") or target.startswith("//"):
        return None
    parts = urlsplit(target)
    return target if not parts.scheme and not parts.netloc else None


@bp.get("/")
def landing():
    return render_template("landing.html", endpoints=ENDPOINTS)


@bp.get("/docs")
def docs():
    return render_template("docs.html", page=reference.PAGE)


@bp.route("/signup", methods=("GET", "POST"))
def signup():
    if request.method == "GET":
        return render_template("signup.html")
    form = request.form
    try:
        throttles.count_signup()
        user = users.create_user(form.get("username", ""), form.get("email", ""), form.get("password", ""),
                                 on_created=addressmails.mail_first_verify_link)
    except ratelimit.RateLimitExceeded as error:
        return too_many_attempts("signup.html", error)
    except users.AccountTaken:
        # One sentence for both, so sign-up does not confirm which email addresses have accounts.
        fields.refuse("That username or email cannot be used. Choose another, or log in.", "username", "email")
        return render_template("signup.html"), 400
    except ValueError as error:
        fields.refuse(str(error), getattr(error, "field", None))
        return render_template("signup.html"), 400
    log_in(user)
    addressmails.say_why_no_link()
    # Back where the visitor came from (an invitation's page), else to the first key.
    if back := local_path(request.args.get("next")):
        flash(f"Welcome, {user.username}.")
        return redirect(back)
    flash(f"Welcome, {user.username}. Create your first API key below.")
    return redirect(url_for("web.settings_security"))


@bp.route("/login", methods=("GET", "POST"))
def login():
    if request.method == "GET":
        return render_template("login.html")
    username, password = request.form.get("username", ""), request.form.get("password", "")
    try:
        users.refuse_control_characters(username + password, "A username or password")
    except ValueError as error:
        fields.refuse(str(error), "password", "username")
        return render_template("login.html"), 400
    try:
        time.sleep(throttles.password_attempt(username))
    except ratelimit.RateLimitExceeded as error:
        return too_many_attempts("login.html", error)
    user = users.user_for_login(username, password)
    if user is not None and twofactor.is_enabled(user):
        throttles.password_accepted(username)
        return ask_second_factor(user, request.args.get("next"))
    if user is None or not log_in(user):
        throttles.password_refused(username)
        # Either may be wrong; the password is the one typed again (a page never shows it back).
        fields.refuse("The username or password is incorrect.", "password", "username")
        return render_template("login.html"), 400
    throttles.password_accepted(username)
    return redirect(local_path(request.args.get("next")) or url_for("web.settings_profile"))


# Two-factor log-in: web/webprotection.py serves the second step.
PENDING_LOGIN = "pending_login"  # the session cookie's key for the pending log-in's token
LOGIN_NEXT = "login_next"


def ask_second_factor(user, next_path):
    """After the right password of an account with 2FA on: keep that in a pending log-in (a row
    that lives a few minutes, not a flag in the cookie) and ask for the second factor."""
    if g.get("session") is not None:
        users.end_session(g.session)
    session.clear()
    session[PENDING_LOGIN] = twofactor.start_pending_login(user)
    if local_path(next_path):
        session[LOGIN_NEXT] = next_path
    return redirect(url_for("protection.second_factor"))


def too_many_attempts(template, error):
    flash(f"Too many attempts. Try again in {error.retry_after} seconds.", "error")
    return render_template(template), 429, {"Retry-After": str(error.retry_after)}


@bp.post("/logout")
def logout():
    if g.session is not None:
        users.end_session(g.session)
    session.clear()
    flash("You are logged out.")
    return redirect(url_for("web.landing"))


@bp.get("/settings")
@login_required
def settings():
    return redirect(url_for("web.settings_profile"))


@bp.get("/settings/profile")
@login_required
def settings_profile():
    return render_profile_tab()


def render_profile_tab(status=200):
    personal = personal_organisation(g.user.id)
    return render_template("settings_profile.html", active_keys=ApiKey.active_in(personal).count() if personal else 0,
                           mail_enabled=outbox.enabled(), pending_change=emailaddress.pending_change(g.user)), status


@bp.post("/settings/profile/password")
@login_required
def change_password():
    failure = with_password_check(users.change_password, {"current": "current-password", "password": "new-password"},
                                  request.form.get("current_password", ""), request.form.get("new_password", ""))
    if failure:
        return failure
    # Every session ended with the change, this one too: a copy of this browser's cookie with it.
    log_in(g.user)
    flash("Your password is changed, and every other session of this account is signed out.")
    return redirect(url_for("web.settings_profile"))


@bp.post("/settings/profile/delete")
@login_required
def delete_account():
    failure = with_password_check(users.delete_account, {"current": "delete-password"}, request.form.get("password", ""))
    if failure:
        return failure
    session.clear()
    flash("Your account is deleted: its API keys no longer work and its sessions are signed out.")
    return redirect(url_for("web.landing"))


def refuse_wrong_password(password):
    """Check the account's password under the log-in throttle; None when it is right, else a
    (sentence, status)."""
    username = g.user.username
    try:
        time.sleep(throttles.password_attempt(username))
    except ratelimit.RateLimitExceeded as error:
        return f"Too many wrong passwords. Try again in {error.retry_after} seconds.", 429
    if not users.password_matches(g.user, password):
        throttles.password_refused(username)
        return "The password is not correct.", 400
    throttles.password_accepted(username)
    return None


def with_password_check(change, field_ids, password, *args):
    """Make a change that the account's password confirms, throttled like a log-in (so a stolen
    cookie cannot guess the password); return the error page, or None when it was made. field_ids
    names the form's fields by their id: "current" (the confirming password), and a field a Refused names."""
    username = g.user.username
    try:
        time.sleep(throttles.password_attempt(username))
    except ratelimit.RateLimitExceeded as error:
        flash(f"Too many wrong passwords. Try again in {error.retry_after} seconds.", "error")
        return render_profile_tab(status=429)
    try:
        change(g.user, password, *args)
    except users.WrongPassword as error:
        throttles.password_refused(username)
        fields.refuse(str(error), field_ids["current"])
        return render_profile_tab(status=400)
    except ValueError as error:
        throttles.password_accepted(username)
        fields.refuse(str(error), field_ids.get(getattr(error, "field", None)))
        return render_profile_tab(status=400)
    throttles.password_accepted(username)
    return None


@bp.post("/settings/security/sessions/revoke")
@login_required
def sign_out_everywhere():
    users.end_all_sessions(g.user)
    session.clear()
    flash("You are signed out everywhere, this browser included.")
    return redirect(url_for("web.login"))


@bp.get("/settings/security")
@login_required
def settings_security():
    pending = users.take_pending_secret(g.session, session["sid"])
    return render_security_tab(new_key=json.loads(pending) if pending else None)


def render_security_tab(status=200, new_key=None):
    keys = list(ApiKey.select().where(ApiKey.org == g.org).order_by(ApiKey.id.desc()))
    now = utcnow()
    inactive = [key for key in keys if key.revoked_at or key.is_expired(now)]
    active = [key for key in keys if key not in inactive]
    return render_template("settings_security.html", keys=keys, active_keys=active, inactive_keys=inactive,
                           totals=account_totals(keys, now), now=now, creators=key_creators(g.org.id),
                           new_key=new_key, key_types=KEY_TYPES, scopes=SCOPES, expiries=EXPIRIES,
                           graces=GRACES, events=org_log()), status


def key_creators(org_id):
    """{user id: username} of the organisation's members: a key made by anyone else was made by a
    former member (or an account since deleted)."""
    return {membership.user_id: membership.user.username for membership in org_members.members(org_id)}


def org_log():
    """The current organisation's log; in the user's personal organisation, with the account's own events."""
    if g.org.personal_for_id == g.user.id:
        return securitylog.recent(g.user.id)
    return securitylog.recent_in(g.org.id)


# A key's IP allow-list in a few words on the Security tab.
bp.add_app_template_filter(allowips.summary, "allow_ips_summary")


def account_totals(keys, now):
    """The requests of all the account's keys: in the last 24 hours and 30 days, refused in those
    30 days, and counted over the keys' lives."""
    key_ids = [key.id for key in keys]
    days = analytics.daily(key_ids, now=now)
    refused = sum(day.requests - day.by_outcome()["success"] for day in days)
    return {"day": sum(hour.requests for hour in analytics.hourly(key_ids, now=now)),
            "month": sum(day.requests for day in days), "refused": refused,
            "lifetime": sum(key.total_requests for key in keys)}


@bp.app_template_filter("days_until")
def days_until(moment):
    """Whole days from now until moment, rounded up: 'expires in N days'."""
    return max(0, -(-(moment - utcnow()) // datetime.timedelta(days=1)))


@bp.get("/playground")
@login_required
def playground():
    return render_template("playground.html", keys=ApiKey.active_in(g.org), endpoints=ENDPOINTS)
