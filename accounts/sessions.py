"""Server-side sessions of the web application: the cookie (signed by Flask) carries a random token
and the database keeps its hash; a new key's secret waits with the session, sealed by the token,
until its page shows it once."""

import base64
import datetime
import hashlib
import hmac
import secrets

import models
from accounts import securitylog, users
from models import Session, User, db, utcnow

SESSION_IDLE_DAYS = 14
# An account's sessions beyond the newest this many end (the oldest first).
MAX_SESSIONS = 50
# last_seen_at is written at most this often per session, not on every page.
SESSION_TOUCH = datetime.timedelta(minutes=5)


def token_hash(token):
    return hashlib.sha256(token.encode()).hexdigest()


def start_session(user):
    """Create a session for the user; return the token for the cookie, or None when the account
    was deleted or its password changed since it was read (a log-in checked against the old
    password must not outlive the change). Idle sessions are pruned."""
    token = secrets.token_urlsafe(32)
    with db.atomic():
        try:
            users.lock_user(user)
        except users.AccountGone:
            return None
        current = User.select(User.password_hash).where(User.id == user.id).scalar()
        if current != user.password_hash:
            return None
        Session.delete().where(Session.last_seen_at < idle_cutoff()).execute()
        Session.create(token_hash=token_hash(token), user=user)
        securitylog.record(user.id, "user.login")
        # Log-ins are not limited when they succeed: keep the sessions they add bounded (the security
        # log bounds itself).
        models.keep_newest(Session, Session.user == user.id, Session.last_seen_at, Session.token_hash, MAX_SESSIONS)
    return token


def idle_cutoff():
    return utcnow() - datetime.timedelta(days=SESSION_IDLE_DAYS)


def find_session(token):
    """Return the live session of a cookie's token, with its user loaded, or None."""
    if not isinstance(token, str) or not token:
        return None
    session = (Session.select(Session, User).join(User)
               .where((Session.token_hash == token_hash(token)) & (Session.last_seen_at >= idle_cutoff()))
               .first())
    if session is not None and utcnow() - session.last_seen_at > SESSION_TOUCH:
        session.last_seen_at = utcnow()
        Session.update(last_seen_at=session.last_seen_at).where(Session.token_hash == session.token_hash).execute()
    return session


def end_session(session):
    with db.atomic():
        if Session.delete().where(Session.token_hash == session.token_hash).execute():
            securitylog.record(session.user_id, "user.logout")


def end_all_sessions(user):
    with db.atomic():
        users.lock_user(user)
        Session.delete().where(Session.user == user.id).execute()
        securitylog.record(user.id, "user.sessions_revoked")


def _fernet(token):
    # cryptography (~7 ms) is imported by the first secret kept, not by every start.
    from cryptography.fernet import Fernet

    # Derived from the cookie's token, which the database never holds: a copy of the database
    # cannot read a pending secret.
    key = hmac.new(token.encode(), b"pending secret", hashlib.sha256).digest()
    return Fernet(base64.urlsafe_b64encode(key))


def keep_pending_secret(session, token, text):
    """Keep text (a new key's secret) with the session, encrypted, until take_pending_secret."""
    sealed = _fernet(token).encrypt(text.encode()).decode()
    Session.update(pending_secret=sealed).where(Session.token_hash == session.token_hash).execute()


def take_pending_secret(session, token):
    """Return the pending text once and forget it; None when there is none."""
    if session.pending_secret is None:
        return None
    taken = (Session.update(pending_secret=None)
             .where((Session.token_hash == session.token_hash) & (Session.pending_secret == session.pending_secret))
             .execute())
    if not taken:
        return None  # another request showed it first
    from cryptography.fernet import InvalidToken

    try:
        return _fernet(token).decrypt(session.pending_secret.encode()).decode()
    except InvalidToken:
        return None
