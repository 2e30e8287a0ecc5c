"""The mails about an account's address: the links that confirm it or change it, and the notices to
the old address (which never carry a link for the change). Each is written in the caller's
transaction (mail/outbox.py)."""

from flask import url_for

from accounts import emailaddress
from mail import outbox


def mail_first_verify_link(user):
    """Sign-up's: users.create_user's on_created, in the account's own transaction (no link is
    made when MAIL_URL is off)."""
    if outbox.enabled():
        mail_verify_link(user, emailaddress.new_verify_token(user))


def mail_verify_link(user, token):
    outbox.queue(user.email, "email_verify", username=user.username, email=user.email,
                 link=outbox.link(url_for("web.verify_email_page", token=token)))


def mail_change_links(user, new_email, token):
    """The link to the new address, and the notice to the account's address."""
    outbox.queue(new_email, "email_change", username=user.username, email=new_email,
                 link=outbox.link(url_for("web.change_email_page", token=token)))
    outbox.queue(user.email, "email_change_notice", username=user.username, new_email=new_email)


def mail_change_done(user, old_email, new_email):
    outbox.queue(old_email, "email_changed", username=user.username, new_email=new_email)
