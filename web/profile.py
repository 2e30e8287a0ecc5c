"""Profile Settings' Profile tab: the account, its password and its deletion, and the password
check that every form changing the account asks for."""

import time

from flask import flash, g, redirect, render_template, request, session, url_for

import ratelimit
from accounts import emailaddress, throttles, users
from mail import outbox
from models import ApiKey, personal_organisation
from orgs import organisations
from web import fields
from web.hooks import login_required, page_blueprint
from web.signin import log_in

bp = page_blueprint("profile", __name__)


@bp.get("/settings")
@login_required
def settings():
    return redirect(url_for("profile.settings_profile"))


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
    return redirect(url_for("profile.settings_profile"))


@bp.post("/settings/profile/delete")
@login_required
def delete_account():
    failure = with_password_check(organisations.delete_account, {"current": "delete-password"},
                                  request.form.get("password", ""))
    if failure:
        return failure
    session.clear()
    flash("Your account is deleted: its API keys no longer work and its sessions are signed out.")
    return redirect(url_for("home.landing"))


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
