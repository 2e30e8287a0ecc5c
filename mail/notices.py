"""Notices: a mail to an account's address when something happens to the account or its keys,
written in the transaction of the change by the signals the change already sends (keys/events.py's
key_changed, the security log's recorded), so that a notice goes exactly when its change commits."""

import contextlib
import datetime
import logging

from flask import g, has_app_context

from accounts import securitylog
from keys import events as key_events
from mail import outbox
from mail.models import MailMessage
from models import OWNER, Membership, User, utcnow

log = logging.getLogger(__name__)

# Mails (of any kind) to one address in an hour past which a notice is not written: an account's
# owner must not be able to bury its own mailbox, or hold up the outbox, by repeating a change.
NOTICES_PER_HOUR = 10
KEY_NOTICES = {"key.revoked_as_leaked": "key_leaked", "key.expiring": "key_expiring", "key.expired": "key_expired"}
ACCOUNT_NOTICES = {
    "user.password_changed": "password_changed",
    "user.password_reset": "password_reset_done",
    "user.2fa_disabled": "two_factor_off",
    "user.passkey_added": "passkey_added",
}
# Where remembered() keeps, for its duration, each key's recipients and the accounts found at the cap.
REMEMBERED = "notices_remembered"


def init_app(app):
    key_events.key_changed.connect(mail_key_notice)
    securitylog.recorded.connect(mail_account_notice)


def mail_key_notice(event, key, data=None, **_):
    """keys/events.py's key_changed: who made a key hears of it revoked as leaked, expiring or
    expired; the organisation's owners do once its maker is no longer a member, and of a leak
    also while its maker's address is not confirmed."""
    if event in KEY_NOTICES:
        for user_id in remembered_recipients(key, confirmed_only=event == "key.revoked_as_leaked"):
            mail_owner(user_id, KEY_NOTICES[event], key=data or {}, link=outbox.link("/settings/security"))


@contextlib.contextmanager
def remembered():
    """Within it, the recipients of a creator's keys in an organisation are looked up once, and an
    account found at NOTICES_PER_HOUR is neither counted again nor warned of again: a report of
    leaked keys may revoke a thousand keys of one creator in one request."""
    if g.get(REMEMBERED) is not None:
        yield  # an outer one remembers
        return
    g.setdefault(REMEMBERED, {"recipients": {}, "capped": set()})
    try:
        yield
    finally:
        g.pop(REMEMBERED, None)


def remembering():
    """What the remembered() under way keeps, else None."""
    return g.get(REMEMBERED) if has_app_context() else None


def remembered_recipients(key, confirmed_only):
    """key_recipients, looked up once within remembered()."""
    if (memo := remembering()) is None:
        return key_recipients(key, confirmed_only)
    asked = (key.org_id, key.user_id, confirmed_only)
    if asked not in memo["recipients"]:
        memo["recipients"][asked] = key_recipients(key, confirmed_only)
    return memo["recipients"][asked]


def key_recipients(key, confirmed_only=False):
    """The key's creator while a member of its organisation, else its owners. confirmed_only: only
    members whose address is confirmed count (a leak must reach someone who can act on it)."""
    members = Membership.select(Membership.user).where(Membership.org == key.org_id)
    if confirmed_only:
        members = members.join(User, on=(Membership.user == User.id)).where(User.email_verified_at.is_null(False))
    if key.user_id is not None and members.where(Membership.user == key.user_id).exists():
        return [key.user_id]
    return [member.user_id for member in members.where(Membership.role == OWNER)]


def mail_account_notice(event, user_id, detail="", **_):
    """The security log's recorded: the owner hears of a password changed or reset, two-factor
    log-in turned off, a passkey added."""
    if event in ACCOUNT_NOTICES:
        mail_owner(user_id, ACCOUNT_NOTICES[event], detail=detail, link=outbox.link("/login"))


def mail_owner(user_id, name, **context):
    """Queue the notice for the account's address once it is confirmed: an address nobody has
    confirmed may be a stranger's, given at sign-up, and the account's owner could make the
    service mail it at will. At most NOTICES_PER_HOUR reach one address."""
    memo = remembering()
    if memo is not None and user_id in memo["capped"]:
        return
    user = User.select(User.username, User.email, User.email_verified_at).where(User.id == user_id).first()
    if user is None or user.email_verified_at is None:
        return
    since = utcnow() - datetime.timedelta(hours=1)
    if MailMessage.select().where((MailMessage.recipient == user.email) & (MailMessage.created_at >= since)
                                  ).count() >= NOTICES_PER_HOUR:
        log.warning("No %s notice for user %d: %d mails went to their address in the last hour.", name, user_id,
                    NOTICES_PER_HOUR)
        if memo is not None:
            memo["capped"].add(user_id)
        return
    try:
        outbox.queue(user.email, name, username=user.username, **context)
    except ValueError:
        # An address from before sign-up checked addresses as strictly: the change still commits.
        log.warning("No %s notice for user %d: their address cannot be mailed.", name, user_id)
