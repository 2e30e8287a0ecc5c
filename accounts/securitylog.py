"""Each account's security log: who did what to the account and its keys, from which address.
An event is written in the transaction of the change it records; never a secret or a password."""

import datetime

from blinker import Namespace
from flask import has_request_context, request

from keys import events as key_events
from models import SecurityEvent, utcnow

EVENTS = {
    "user.signup", "user.login", "user.login_failed", "user.logout", "user.password_changed",
    "user.sessions_revoked", "key.created", "key.rolled", "key.revoked", "key.revoked_as_leaked",
    "key.previous_secret_revoked", "key.limit_changed", "key.credits_changed",
    "user.2fa_enabled", "user.2fa_disabled", "user.2fa_failed", "user.recovery_code_used",
    "user.passkey_added", "user.passkey_removed", "user.passkey_login",
    "webhook.added", "webhook.removed", "webhook.disabled",
    "user.password_reset_requested", "user.password_reset", "user.email_verified", "user.email_change_requested",
    "user.email_changed",
}
signals = Namespace()
# Sent by record() once an event is written, inside its transaction (sender: the event's name, with
# user_id and detail): mail/notices.py mails the owner about some of them in that transaction.
recorded = signals.signal("security-event-recorded")
SHOWN = 50
# Events kept per account; older ones are deleted as each new one is written.
KEPT = 1000
# Failed log-ins (and failed second factors) recorded per account and hour at most: others' guesses must not bury the log.
FAILURES_RECORDED_PER_HOUR = 20


def record(user_id, event, detail="", address=None):
    """Add an event to the account's log (inside the caller's transaction, where it has one); the
    address is the request's, else `cli` (the service's own doings give "-")."""
    assert event in EVENTS, event
    if address is None:
        address = request.remote_addr if has_request_context() else "cli"
    SecurityEvent.create(user=user_id, event=event, ip=(address or "-")[:64], detail=detail[:200])
    forget_beyond_kept(user_id)
    recorded.send(event, user_id=user_id, detail=detail)


def record_key_event(event, user_id, detail=None, **_):
    """keys/events.py's key_changed: record the change in the owner's log, in its transaction."""
    if detail is not None:
        record(user_id, event, detail)


def init_app(app):
    key_events.key_changed.connect(record_key_event)


def forget_beyond_kept(user_id):
    """Delete the account's events older than its newest KEPT: one index walk of KEPT entries."""
    newest_first = (SecurityEvent.select(SecurityEvent.created_at, SecurityEvent.id)
                    .where(SecurityEvent.user == user_id)
                    .order_by(SecurityEvent.created_at.desc(), SecurityEvent.id.desc()))
    oldest_kept = newest_first.offset(KEPT - 1).first()
    if oldest_kept is None:
        return
    older = (SecurityEvent.created_at < oldest_kept.created_at) | (
        (SecurityEvent.created_at == oldest_kept.created_at) & (SecurityEvent.id < oldest_kept.id))
    SecurityEvent.delete().where((SecurityEvent.user == user_id) & older).execute()


def failures_this_hour(user_id, event="user.login_failed"):
    since = utcnow() - datetime.timedelta(hours=1)
    return (SecurityEvent.select().where((SecurityEvent.user == user_id) & (SecurityEvent.event == event)
                                         & (SecurityEvent.created_at >= since)).count())


def recent(user_id, limit=SHOWN):
    """The account's newest events first (all of them with limit None)."""
    events = (SecurityEvent.select().where(SecurityEvent.user == user_id)
              .order_by(SecurityEvent.created_at.desc(), SecurityEvent.id.desc()))
    return list(events.limit(limit) if limit else events)
