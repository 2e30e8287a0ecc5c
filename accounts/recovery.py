"""Forgotten passwords: a reset link asked for by email address, and a new password set through it."""

import datetime

from peewee import fn

from accounts import emailtokens, securitylog, users
from accounts.models import Passkey, TwoFactor
from models import SecurityEvent, Session, User, db, utcnow
from store.writelock import write_transaction

# Reset mails one account gets in an hour at most; past them a request sends nothing (and is
# answered as any other: the mails are what a flood would want).
MAILS_PER_HOUR = 3
HOUR = datetime.timedelta(hours=1)
# Why a link cannot be used, besides emailtokens' own: it went to an address the account has since
# left, which may no longer be its owner's.
ADDRESS_CHANGED = "address_changed"
# Or it was voided by a change of the password after it was mailed.
PASSWORD_CHANGED = "password_changed"


class LinkUnusable(Exception):
    """A reset link that cannot set a password; .why is emailtokens.UNKNOWN, USED, VOIDED, EXPIRED,
    ADDRESS_CHANGED or PASSWORD_CHANGED."""

    def __init__(self, why):
        super().__init__(why)
        self.why = why


def checked_address(email):
    """The address as accounts keep it (trimmed, in lower case); ValueError with a sentence when it
    is no email address (a line break in it, say)."""
    address = email.strip().lower()
    users.refuse_control_characters(address, "An email address")
    if len(address) > 254 or not users.EMAIL_PATTERN.fullmatch(address):
        raise ValueError("That does not look like an email address.")
    return address


def request_reset(address, mail_link):
    """For the account with this address (as checked_address returns it), issue a reset token, have
    mail_link(user, token) write its mail and record the request, all in one transaction: the token
    never commits without its mail. Return whether a link was mailed: False when no account has the
    address or it had MAILS_PER_HOUR already (the caller answers all three alike)."""
    user = User.get_or_none(User.email == address)
    if user is None:
        return False
    with write_transaction(db.obj):
        try:
            # Requests racing for one account pass the cap one at a time.
            users.lock_user(user)
        except users.AccountGone:
            return False
        if emailtokens.issued_since(user.id, emailtokens.PASSWORD_RESET, utcnow() - HOUR) >= MAILS_PER_HOUR:
            return False
        token = emailtokens.issue(user.id, emailtokens.PASSWORD_RESET, user.email)
        mail_link(user, token)
        securitylog.record(user.id, "user.password_reset_requested")
    return True


def find_link(token):
    """The token row of a reset link that can set a password, its user loaded; LinkUnusable when it
    cannot."""
    row, why = emailtokens.find(token, emailtokens.PASSWORD_RESET)
    if why == emailtokens.VOIDED and SecurityEvent.select().where(
            (SecurityEvent.user == row.user_id) & (SecurityEvent.event == "user.password_changed")
            & (SecurityEvent.created_at >= row.created_at)).exists():
        raise LinkUnusable(PASSWORD_CHANGED)
    if why is not None:
        raise LinkUnusable(why)
    user = User.get_or_none(User.id == row.user_id)
    if user is None:
        raise LinkUnusable(emailtokens.UNKNOWN)
    if user.email != row.email:
        raise LinkUnusable(ADDRESS_CHANGED)
    row.user = user
    return row


def reset_password(token, new_password):
    """Set the password of the link's account (the sign-up rules), end every session of it, use up
    the link and record the reset, in one transaction; return the user. It logs nobody in: log-in,
    two-factor included, comes next. LinkUnusable when the link cannot be used (nothing changes),
    ValueError with a sentence when the password cannot."""
    user = find_link(token).user
    users.check_new_password(new_password)
    # Hashed before the transaction, off the event loop, as log-in does.
    password_hash = users.hash_password(new_password)
    with write_transaction(db.obj):
        try:
            users.lock_user(user)
        except users.AccountGone:
            raise LinkUnusable(emailtokens.UNKNOWN) from None
        # Read again under the lock: the address may have changed, or the link been used, meanwhile.
        row = find_link(token)
        if not emailtokens.use(row):
            raise LinkUnusable(emailtokens.find(token, emailtokens.PASSWORD_RESET)[1] or emailtokens.USED)
        # A link followed proves the mailbox: the address is confirmed, if it was not.
        User.update(password_hash=password_hash, email_verified_at=fn.COALESCE(User.email_verified_at, utcnow())
                    ).where(User.id == user.id).execute()
        Session.delete().where(Session.user == user.id).execute()
        emailtokens.void(user.id, emailtokens.PASSWORD_RESET)
        securitylog.record(user.id, "user.password_reset", signed_in_without_password(user.id))
    user.password_hash = password_hash
    return user


def signed_in_without_password(user_id):
    """What else signs in to the account, for the reset's log line and notice: someone who made the
    account with another's address before its owner (who can then only reset) may have added a
    passkey or an authenticator, which a reset must not remove (it never skips a second factor)."""
    passkeys = [name for name, in Passkey.select(Passkey.name).where(Passkey.user == user_id).tuples()]
    two_factor = TwoFactor.select().where((TwoFactor.user == user_id) & TwoFactor.enabled_at.is_null(False)).exists()
    parts = [f"passkeys: {', '.join(passkeys)}" if passkeys else "", "two-factor log-in on" if two_factor else ""]
    return "; ".join(part for part in parts if part)
