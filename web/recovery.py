"""The forgotten password's pages: ask for a reset link by email address, and set a new password
through the link."""

import time

from flask import flash, redirect, render_template, request, url_for

import ratelimit
from accounts import emailtokens, recovery, throttles
from mail import outbox
from models import release_connection
from web import fields
from web.hooks import page_blueprint
from web.signin import too_many_attempts

bp = page_blueprint("recovery", __name__)

# Every answer to a request for a link comes this long after the request, whether or not an account
# has the address. Both look the address up, and answer with the same page; only for an account is
# the row locked, its links counted, three rows written (the token, the mail, the log's event) and
# the commit flushed: ~6 ms on SQLite and ~10 ms on PostgreSQL more, which an attacker could time.
# Rows cannot be written for nobody, so both paths wait for the same mark instead, well past the work.
ANSWER_SECONDS = 0.25
# What a link's page says when it cannot be used; an unknown one is a 404, the others 410 (Gone).
UNUSABLE = {
    emailtokens.UNKNOWN: ("This link is not known", "It may be mistyped or cut short: copy the whole address "
                          "from the mail. Or ask for a new link."),
    emailtokens.USED: ("This link was used already", "A reset link sets a password once. If you did not use it, "
                       "ask for a new link."),
    emailtokens.VOIDED: ("This link was replaced", "A newer link was mailed since, and only the newest works: "
                         "use the latest mail, or ask for a new link."),
    emailtokens.EXPIRED: ("This link has expired", "A reset link works for an hour after it is mailed. "
                          "Ask for a new link."),
    recovery.PASSWORD_CHANGED: ("This link no longer works", "The account's password was changed after the "
                                "link was mailed, which ends every link mailed before. Ask for a new link."),
    recovery.ADDRESS_CHANGED: ("This link no longer works", "The account's email address changed after the "
                               "link was mailed. Ask for a new link at the account's address."),
}
MISMATCH = "The two passwords differ: type the same new password in both fields."
# The reset page's address holds its token: never sent on (to the page's own style sheet, say,
# where a log of referrers would keep it). Not no-referrer: over HTTPS, Flask-WTF's CSRF check
# wants the form's origin in the Referer.
LINK_REFERRER_POLICY = {"Referrer-Policy": "strict-origin"}


@bp.route("/password/forgot", methods=("GET", "POST"))
def forgot_password():
    if request.method == "GET":
        return render_template("password_forgot.html")
    answer_at = time.monotonic() + ANSWER_SECONDS
    try:
        throttles.count_login_ip_request()
        address = recovery.checked_address(request.form.get("email", ""))
        # What a mail's header can carry, refused whether or not an account has it.
        outbox.checked_address(address)
        recovery.request_reset(address, mail_reset_link)
    except ratelimit.RateLimitExceeded as error:
        return too_many_attempts("password_forgot.html", error)
    except ValueError as error:
        flash(str(error), "error")
        return render_template("password_forgot.html"), 400
    # No pooled connection is held while the answer waits.
    release_connection()
    time.sleep(max(0.0, answer_at - time.monotonic()))
    return render_template("password_forgot_sent.html", address=address)


def mail_reset_link(user, token):
    """Write the mail of a reset link to the outbox, in request_reset's transaction. It is in no
    address's cap (the account's own 3 an hour bound it): counted there, the reset of an account
    whose address is unconfirmed would both tell strangers that an account has the address (other
    forms say when it is capped) and let them block the owner's only way back in."""
    outbox.queue(user.email, "password_reset", username=user.username,
                 link=outbox.link(url_for("recovery.reset_password", token=token)))


@bp.route("/password/reset/<token>", methods=("GET", "POST"))
def reset_password(token):
    # A GET only shows the form: mail scanners fetch links, and must change nothing.
    if request.method == "GET":
        try:
            recovery.find_link(token)
        except recovery.LinkUnusable as error:
            return link_unusable(error.why)
        return render_template("password_reset.html"), LINK_REFERRER_POLICY
    new_password = request.form.get("new_password", "")
    try:
        throttles.count_login_ip_request()
        # The repetition is the form's: a program that posts new_password alone (the contract's
        # field) sets it as before.
        if request.form.get("repeat_new_password", new_password) != new_password:
            recovery.find_link(token)  # a link that cannot be used says so first
            fields.refuse(MISMATCH, "repeat_new_password", "new_password", focus="new_password")
            return render_template("password_reset.html"), 400, LINK_REFERRER_POLICY
        recovery.reset_password(token, new_password)
    except ratelimit.RateLimitExceeded as error:
        page, status, headers = too_many_attempts("password_reset.html", error)
        return page, status, {**headers, **LINK_REFERRER_POLICY}
    except recovery.LinkUnusable as error:
        return link_unusable(error.why)
    except ValueError as error:
        fields.refuse(str(error), "new_password" if getattr(error, "field", None) == "password" else None)
        return render_template("password_reset.html"), 400, LINK_REFERRER_POLICY
    flash("Your password is set, and every session of the account is signed out. Log in with the new password.")
    return redirect(url_for("signin.login"))


def link_unusable(why):
    heading, sentence = UNUSABLE[why]
    status = 404 if why == emailtokens.UNKNOWN else 410
    return (render_template("password_reset_gone.html", heading=heading, sentence=sentence), status,
            LINK_REFERRER_POLICY)
