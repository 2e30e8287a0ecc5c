"""The pages of an account's address: the links mailed to confirm it or change it, and the Profile
tab's "Send again" and change forms. A link's GET only shows a page: its form's POST acts (mail
scanners fetch links)."""

from flask import flash, g, redirect, render_template, request, url_for

import ratelimit
from accounts import emailaddress, emailtokens, throttles
from accounts.emailaddress import LinkRefused, TooManyMails
from mail import addresscap, outbox
from models import db
from store.writelock import write_transaction
from web import addressmails, fields
from web.hooks import login_required, page_blueprint
from web.profile import refuse_wrong_password, render_profile_tab

bp = page_blueprint("emailaddress", __name__)

REFUSED_STATUS = {emailtokens.UNKNOWN: 404, emailtokens.USED: 410, emailtokens.VOIDED: 410,
                  emailtokens.EXPIRED: 410, emailaddress.OTHER_ACCOUNT: 403, emailaddress.TAKEN: 409}
NO_MAIL = "This service sends no mail, so no link can be sent."
# The forms that mail an address say its cap up front: the Profile tab's, the Members tab's, sign-up.
bp.add_app_template_global(addresscap.MAILS_PER_HOUR, "mails_per_address")
bp.add_app_template_global(outbox.enabled, "sends_mail")


@bp.get("/email/verify/<token>")
def verify_email_page(token):
    try:
        row = emailaddress.usable(token, emailtokens.EMAIL_VERIFY)
    except LinkRefused as refused:
        return refused_page("verify", refused)
    return render_template("email_link.html", purpose="verify", email=row.email)


@bp.post("/email/verify/<token>")
def verify_email(token):
    # The token is the proof: no log-in is needed, and none is given (the link opens no account).
    try:
        with write_transaction(db.obj):
            user = emailaddress.verify(token)
    except LinkRefused as refused:
        return refused_page("verify", refused)
    flash(f"The address {user.email} is confirmed.")
    return redirect(url_for("profile.settings_profile" if g.user else "signin.login"))


@bp.get("/email/change/<token>")
def change_email_page(token):
    try:
        row = emailaddress.usable(token, emailtokens.EMAIL_CHANGE, g.user)
    except LinkRefused as refused:
        return refused_page("change", refused)
    return render_template("email_link.html", purpose="change", email=row.email)


@bp.post("/email/change/<token>")
@login_required
def change_email(token):
    # The account's own session as well as the token: whoever reads a mistyped new address must not
    # get the account's address (and with it the password reset).
    try:
        with write_transaction(db.obj):
            old, new = emailaddress.change(token, g.user)
            noticed = addressmails.mail_change_done(g.user, old, new)
    except LinkRefused as refused:
        return refused_page("change", refused)
    flash(f"Your address is now {new}." + (f" A notice went to {old}." if noticed else ""))
    return redirect(url_for("profile.settings_profile"))


def refused_page(purpose, refused):
    return (render_template("email_link.html", purpose=purpose, why=refused.why),
            REFUSED_STATUS[refused.why])


@bp.post("/settings/profile/email/verify")
@login_required
def send_verify_link_again():
    if not outbox.enabled():
        return profile_error(NO_MAIL, 400)
    try:
        throttles.count_login_ip_request()
        with write_transaction(db.obj):
            addressmails.mail_verify_link(g.user, emailaddress.verify_token_again(g.user))
    except ratelimit.RateLimitExceeded as error:
        return too_many(error)
    except TooManyMails:
        return profile_error(f"{emailaddress.MAILS_PER_HOUR} links were mailed in the last hour; "
                             "use the newest, or try again later.", 429)
    except addresscap.NoMoreMail as refused:
        return profile_error(str(refused), 429)
    except ValueError as error:
        return profile_error(str(error), 400)
    flash(f"A new link was mailed to {g.user.email}. It works for 7 days; the earlier ones no longer do.")
    return redirect(url_for("profile.settings_profile"))


@bp.post("/settings/profile/email")
@login_required
def request_email_change():
    if not outbox.enabled():
        return profile_error(NO_MAIL, 400)
    failure = refuse_wrong_password(request.form.get("password", ""))
    if failure:
        sentence, status = failure
        return profile_error(sentence, status, "email-password" if status == 400 else None)
    try:
        throttles.count_login_ip_request()
        with write_transaction(db.obj):
            new, token = emailaddress.request_change(g.user, request.form.get("email", ""))
            noticed = addressmails.mail_change_links(g.user, new, token)
    except ratelimit.RateLimitExceeded as error:
        return too_many(error)
    except TooManyMails:
        return profile_error(f"{emailaddress.MAILS_PER_HOUR} changes were asked for in the last hour; "
                             "use the newest link, or try again later.", 429)
    except addresscap.NoMoreMail as refused:
        return profile_error(str(refused), 429)
    except ValueError as error:
        return profile_error(str(error), 400, "new-email")
    # The same answer whether or not another account has the address: that shows only to whoever
    # follows the link, which proves the address theirs.
    flash(f"A link was mailed to {new}: your address changes when it is followed, within 24 hours, "
          f"logged in as {g.user.username}." + (f" A notice went to {g.user.email}." if noticed else ""))
    return redirect(url_for("profile.settings_profile"))


def profile_error(sentence, status, field_id=None):
    """The Profile tab with the sentence, under the field with that id when it is about one."""
    fields.refuse(sentence, field_id)
    return render_profile_tab(status=status)


def too_many(error):
    flash(f"Too many requests from this address. Try again in {error.retry_after} seconds.", "error")
    page, status = render_profile_tab(status=429)
    return page, status, {"Retry-After": str(error.retry_after)}
