"""An account's email address: confirming it, and changing it, each through a link mailed with a
token (accounts/emailtokens.py). Each function that changes something runs inside its caller's write
transaction, which also writes the mails (web/addressmails.py): a link exists only with its mail."""

import datetime

from peewee import IntegrityError

from accounts import emailtokens, securitylog, users
from accounts.emailtokens import EMAIL_CHANGE, EMAIL_VERIFY, EmailToken
from models import User, utcnow

# Links mailed per account and hour, for each purpose: a stolen session (or a curious owner)
# cannot turn the forms into a mail cannon.
MAILS_PER_HOUR = 3
# Why a link cannot act, beyond emailtokens' own: it belongs to another account than the one
# logged in, or its address now belongs to another account.
OTHER_ACCOUNT, TAKEN = "other_account", "taken"


class LinkRefused(Exception):
    """The link cannot act; .why is one of emailtokens' UNKNOWN, USED, VOIDED, EXPIRED, or
    OTHER_ACCOUNT or TAKEN."""

    def __init__(self, why):
        super().__init__(why)
        self.why = why


class TooManyMails(Exception):
    """MAILS_PER_HOUR links of this purpose were mailed to the account in the last hour."""


def new_verify_token(user):
    """A token for a link that confirms the account's address (sign-up's, with no cap)."""
    return emailtokens.issue(user.id, EMAIL_VERIFY, user.email)


def verify_token_again(user):
    """A fresh link's token for an address not yet confirmed, voiding the older ones; ValueError
    when it is confirmed, TooManyMails past the cap."""
    if locked(user.id).email_verified_at is not None:
        raise ValueError("Your address is already confirmed.")
    refuse_past_cap(user, EMAIL_VERIFY)
    return new_verify_token(user)


def usable(token, purpose, user=None):
    """The token's row when its link can act (for user, when given); else raise LinkRefused."""
    row, why = emailtokens.find(token, purpose)
    if why is None and purpose == EMAIL_VERIFY and User.get_by_id(row.user_id).email != row.email:
        # The address changed since: this link confirms an address the account no longer has.
        why = emailtokens.VOIDED
    if why is None and user is not None and row.user_id != user.id:
        why = OTHER_ACCOUNT
    if why is None and purpose == EMAIL_CHANGE and taken_by_another(row.email, row.user_id):
        why = TAKEN
    if why is not None:
        raise LinkRefused(why)
    return row


def verify(token):
    """Confirm the address a verify link was sent to; return the user. LinkRefused when it cannot."""
    row = usable(token, EMAIL_VERIFY)
    user = locked(row.user_id)
    if user.email != row.email:
        raise LinkRefused(emailtokens.VOIDED)
    take(row)
    if user.email_verified_at is None:
        user.email_verified_at = utcnow()
        User.update(email_verified_at=user.email_verified_at).where(User.id == user.id).execute()
        securitylog.record(user.id, "user.email_verified", user.email)
    return user


def request_change(user, email):
    """Ask to make email the account's address; return (the address as kept, the token of the link
    mailed to it).
    ValueError for an address that cannot be one or is already the account's, TooManyMails past
    the cap. Whether another account has it is not said here (only when the link is followed)."""
    email = users.checked_email(email)
    if email == locked(user.id).email:
        raise ValueError("That is already your address.")
    refuse_past_cap(user, EMAIL_CHANGE)
    token = emailtokens.issue(user.id, EMAIL_CHANGE, email)
    securitylog.record(user.id, "user.email_change_requested", f"to {email}")
    return email, token


def pending_change(user):
    """The newest change link that can still act (its row: .email, .expires_at), or None."""
    return (EmailToken.select()
            .where((EmailToken.user == user.id) & (EmailToken.purpose == EMAIL_CHANGE) & EmailToken.used_at.is_null()
                   & EmailToken.voided_at.is_null() & (EmailToken.expires_at > utcnow()))
            .order_by(EmailToken.created_at.desc()).first())


def change(token, user):
    """Make the address a change link was sent to the user's, confirmed; return (old, new).
    LinkRefused when the link cannot act, or (TAKEN) when another account has the address."""
    row = usable(token, EMAIL_CHANGE, user)
    current = locked(user.id)
    take(row)
    try:
        User.update(email=row.email, email_verified_at=utcnow()).where(User.id == user.id).execute()
    except IntegrityError:
        # Another account took the address since usable() looked (its row is not the one this
        # transaction holds): the caller's transaction rolls back, the link unused.
        raise LinkRefused(TAKEN) from None
    # Links mailed to the old address act on nothing now: neither a confirmation, nor a reset (which
    # would work again, within its hour, should the address come back).
    (EmailToken.update(voided_at=utcnow())
     .where((EmailToken.user == user.id) & EmailToken.purpose.in_([EMAIL_VERIFY, emailtokens.PASSWORD_RESET])
            & EmailToken.used_at.is_null() & EmailToken.voided_at.is_null()).execute())
    securitylog.record(user.id, "user.email_changed", f"from {current.email} to {row.email}")
    return current.email, row.email


def taken_by_another(email, user_id):
    return User.select().where((User.email == email) & (User.id != user_id)).exists()


def locked(user_id):
    """The account as it is now, its row held until the transaction ends (users.lock_user)."""
    users.lock_user(User(id=user_id))
    return User.get_by_id(user_id)


def take(row):
    """Use the token once; LinkRefused with the reason when another request used or voided it first,
    or it expired meanwhile."""
    if not emailtokens.use(row):
        now = EmailToken.get_by_id(row.token_hash)
        raise LinkRefused(emailtokens.USED if now.used_at else emailtokens.VOIDED if now.voided_at
                          else emailtokens.EXPIRED)


def refuse_past_cap(user, purpose):
    since = utcnow() - datetime.timedelta(hours=1)
    if emailtokens.issued_since(user.id, purpose, since) >= MAILS_PER_HOUR:
        raise TooManyMails()
