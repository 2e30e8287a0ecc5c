"""Each account's security log: who did what to the account and its keys, from which address.
An event is written in the transaction of the change it records; never a secret or a password."""

from flask import has_request_context, request

from models import SecurityEvent

EVENTS = {
    "user.signup", "user.login", "user.login_failed", "user.logout", "user.password_changed",
    "user.sessions_revoked", "key.created", "key.rolled", "key.revoked", "key.revoked_as_leaked",
}
SHOWN = 50


def record(user_id, event, detail=""):
    """Add an event to the account's log (inside the caller's transaction, where it has one)."""
    assert event in EVENTS, event
    address = request.remote_addr if has_request_context() else "cli"
    SecurityEvent.create(user=user_id, event=event, ip=address or "-", detail=detail[:200])


def recent(user_id, limit=SHOWN):
    """The account's newest events first (all of them with limit None)."""
    events = (SecurityEvent.select().where(SecurityEvent.user == user_id)
              .order_by(SecurityEvent.created_at.desc(), SecurityEvent.id.desc()))
    return list(events.limit(limit) if limit else events)
