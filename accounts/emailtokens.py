"""The tokens of the links mails carry (a password reset, an address to verify, a new address):
random, stored as their SHA-256 only, each for one account, one purpose and one address, usable
once before it expires; a newer token of the same purpose voids the older ones."""

import datetime
import hashlib
import re
import secrets

from peewee import CharField, DateTimeField, ForeignKeyField

from models import BaseModel, User, utcnow

PASSWORD_RESET, EMAIL_VERIFY, EMAIL_CHANGE = "password_reset", "email_verify", "email_change"
LIFETIMES = {
    PASSWORD_RESET: datetime.timedelta(hours=1),
    EMAIL_VERIFY: datetime.timedelta(days=7),
    EMAIL_CHANGE: datetime.timedelta(days=1),
}
# Rows are kept this long past their expiry (issued_since counts them), then deleted.
KEPT_AFTER_EXPIRY = datetime.timedelta(days=1)
# What new_token makes: anything else is no token of ours, and is never looked up.
TOKEN_PATTERN = re.compile(r"[A-Za-z0-9_-]{43}")
# Why a link cannot be used, as its page says.
UNKNOWN, USED, VOIDED, EXPIRED = "unknown", "used", "voided", "expired"


class EmailToken(BaseModel):
    token_hash = CharField(primary_key=True, max_length=64)
    user = ForeignKeyField(User, on_delete="CASCADE", index=True)
    purpose = CharField(max_length=16)
    # The address the link was sent to: the account's (reset, verify) or the new one (change).
    email = CharField(max_length=254)
    created_at = DateTimeField(default=utcnow)
    expires_at = DateTimeField(index=True)
    used_at = DateTimeField(null=True)
    voided_at = DateTimeField(null=True)

    class Meta:
        table_name = "email_tokens"
        indexes = ((("user", "purpose", "created_at"), False),)


MODELS = [EmailToken]


def hashed(token):
    return hashlib.sha256(token.encode()).hexdigest()


def new_token():
    """A link's secret: 43 URL-safe characters, 252 random bits, in two halves joined by a dash. Half
    of secrets.token_urlsafe(32)'s hold a run of 32 letters and digits, which the log takes for an API
    key's body and cuts (ops/logs.py): a mail written to the log (MAIL_URL=console) would show a
    broken link."""
    return f"{secrets.token_urlsafe(16)[:21]}-{secrets.token_urlsafe(16)[:21]}"


def issue(user_id, purpose, email, now=None):
    """Make a token for the user, void the user's earlier ones of this purpose, and forget long
    expired ones; call inside the caller's transaction. Return the token (the link's secret)."""
    now = now or utcnow()
    token = new_token()
    void(user_id, purpose, now)
    EmailToken.delete().where(EmailToken.expires_at < now - KEPT_AFTER_EXPIRY).execute()
    EmailToken.create(token_hash=hashed(token), user=user_id, purpose=purpose, email=email, created_at=now,
                      expires_at=now + LIFETIMES[purpose])
    return token


def void(user_id, purpose, now=None):
    """Void the user's tokens of this purpose that could still be used; call inside the caller's
    transaction."""
    (EmailToken.update(voided_at=now or utcnow())
     .where((EmailToken.user == user_id) & (EmailToken.purpose == purpose) & EmailToken.used_at.is_null()
            & EmailToken.voided_at.is_null()).execute())


def find(token, purpose, now=None):
    """(EmailToken, None) for a token that can be used, else (None or the row, why not: UNKNOWN,
    USED, VOIDED or EXPIRED)."""
    if not isinstance(token, str) or not TOKEN_PATTERN.fullmatch(token):
        return None, UNKNOWN
    row = EmailToken.get_or_none((EmailToken.token_hash == hashed(token)) & (EmailToken.purpose == purpose))
    if row is None:
        return None, UNKNOWN
    if row.used_at is not None:
        return row, USED
    if row.voided_at is not None:
        return row, VOIDED
    if row.expires_at <= (now or utcnow()):
        return row, EXPIRED
    return row, None


def use(row, now=None):
    """Mark the token used, inside the caller's transaction; False when another request used or
    voided it first (a token acts once, however many requests race for it)."""
    now = now or utcnow()
    return bool(EmailToken.update(used_at=now)
                .where((EmailToken.token_hash == row.token_hash) & EmailToken.used_at.is_null()
                       & EmailToken.voided_at.is_null() & (EmailToken.expires_at > now)).execute())


def issued_since(user_id, purpose, since):
    """How many tokens of this purpose the user was given since then (mails sent, for a cap)."""
    return (EmailToken.select().where((EmailToken.user == user_id) & (EmailToken.purpose == purpose)
                                      & (EmailToken.created_at >= since)).count())
