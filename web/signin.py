"""Signing up, logging in (its first step: the password; web/webprotection.py serves the second)
and out, and the helpers of every page that starts a session."""

import time
from urllib.parse import urlsplit

from flask import flash, g, redirect, render_template, request, session, url_for

import ratelimit
from accounts import sessions, throttles, twofactor, users
from web import addressmails, fields
from web.hooks import page_blueprint

bp = page_blueprint("signin", __name__)

PENDING_LOGIN = "pending_login"  # the session cookie's key for the pending log-in's token
LOGIN_NEXT = "login_next"


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
    return redirect(url_for("security.settings_security"))


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
    return redirect(local_path(request.args.get("next")) or url_for("profile.settings_profile"))


@bp.post("/logout")
def logout():
    if g.session is not None:
        sessions.end_session(g.session)
    session.clear()
    flash("You are logged out.")
    return redirect(url_for("home.landing"))


def log_in(user):
    """Start a fresh session for the user in this browser, ending the one it had: nothing from
    before (nor its CSRF token, nor a copy of its cookie) carries over. False when the account
    changed under the log-in (see sessions.start_session)."""
    if g.get("session") is not None:
        sessions.end_session(g.session)
    session.clear()
    token = sessions.start_session(user)
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


def ask_second_factor(user, next_path):
    """After the right password of an account with 2FA on: keep that in a pending log-in (a row
    that lives a few minutes, not a flag in the cookie) and ask for the second factor."""
    if g.get("session") is not None:
        sessions.end_session(g.session)
    session.clear()
    session[PENDING_LOGIN] = twofactor.start_pending_login(user)
    if local_path(next_path):
        session[LOGIN_NEXT] = next_path
    return redirect(url_for("protection.second_factor"))


def too_many_attempts(template, error):
    flash(f"Too many attempts. Try again in {error.retry_after} seconds.", "error")
    return render_template(template), 429, {"Retry-After": str(error.retry_after)}
