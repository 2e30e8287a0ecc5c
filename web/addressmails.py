"""The mails about an account's address: the links that confirm it or change it, and the notices to
the old address (which never carry a link for the change). Each is written in the caller's
transaction (mail/outbox.py). A mail to an address that is not the account's confirmed one counts in
that address's hourly cap (mail/addresscap.py): past it a link is refused, a notice left out."""

from flask import flash, g, url_for

from accounts import emailaddress
from mail import addresscap, outbox


def mail_first_verify_link(user):
    """Sign-up's: users.create_user's on_created, in the account's own transaction. No link is made
    when MAIL_URL is off, or past the address's cap: then the account is made all the same, and
    say_why_no_link tells the new session."""
    if not outbox.enabled():
        return
    try:
        addresscap.refuse_past_cap(user.email)
    except addresscap.NoMoreMail as refused:
        g.unmailed_address = refused.address
        return
    mail_verify_link(user, emailaddress.new_verify_token(user))


def say_why_no_link():
    """After sign-up's log-in (which starts the session afresh): why no link came, if none did."""
    if address := g.pop("unmailed_address", None):
        flash(f"No more mail goes to {address} for now, so no link to confirm it was sent: use Send again on the "
              "Profile tab later.", "error")


def mail_verify_link(user, token):
    """addresscap.NoMoreMail past the address's cap."""
    addresscap.queue(user, user.email, "email_verify", username=user.username, email=user.email,
                     link=outbox.link(url_for("emailaddress.verify_email_page", token=token)))


def mail_change_links(user, new_email, token):
    """The link to the new address (addresscap.NoMoreMail past its cap), and the notice to the
    account's address; return whether the notice was written."""
    addresscap.hold_in_order(new_email, user.email)
    addresscap.queue(user, new_email, "email_change", username=user.username, email=new_email,
                     link=outbox.link(url_for("emailaddress.change_email_page", token=token)))
    return notice(user, user.email, "email_change_notice", username=user.username, new_email=new_email)


def mail_change_done(user, old_email, new_email):
    """The notice to the old address (user: the account as it was before the change); return
    whether it was written."""
    return notice(user, old_email, "email_changed", username=user.username, new_email=new_email)


def notice(user, recipient, name, **context):
    """Queue a notice, left out past the cap of an address the account never confirmed."""
    try:
        addresscap.queue(user, recipient, name, **context)
    except addresscap.NoMoreMail:
        return False
    return True
