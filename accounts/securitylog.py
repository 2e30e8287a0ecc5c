"""The security logs: each account's own (log-ins, passwords, second factors) and each
organisation's (its keys, webhook endpoints and members), every line with who acted and from which
address. An event is written in the transaction of the change it records; never a secret or a
password."""

import contextlib
import datetime

from blinker import Namespace
from flask import g, has_app_context, has_request_context, request
from peewee import JOIN

from keys import events as key_events
from models import Organisation, SecurityEvent, User, utcnow

EVENTS = {
    "user.signup", "user.login", "user.login_failed", "user.logout", "user.password_changed",
    "user.sessions_revoked", "key.created", "key.rolled", "key.revoked", "key.revoked_as_leaked",
    "key.previous_secret_revoked", "key.limit_changed", "key.credits_changed", "key.updated", "key.imported",
    "user.2fa_enabled", "user.2fa_disabled", "user.2fa_failed", "user.recovery_code_used",
    "user.passkey_added", "user.passkey_removed", "user.passkey_login",
    "webhook.added", "webhook.removed", "webhook.disabled", "webhook.secret_rotated", "webhook.updated",
    "webhook.paused", "webhook.resumed",
    "user.password_reset_requested", "user.password_reset", "user.email_verified", "user.email_change_requested",
    "user.email_changed",
    "org.created", "org.renamed", "org.deleted", "org.billing_customer_set", "org.billing_customer_removed",
    "member.invited", "member.joined", "member.role_changed",
    "member.removed", "member.left", "invitation.revoked",
}
signals = Namespace()
# Sent by record() once an event is written, inside its transaction (sender: the event's name, with
# user_id and detail): mail/notices.py mails the owner about some of them in that transaction.
recorded = signals.signal("security-event-recorded")
SHOWN = 50
# Events kept per account; older ones are deleted as each new one is written (or once at the end of
# trims_deferred()).
KEPT = 1000
# Where trims_deferred() keeps the organisations whose logs it trims at its end.
DEFERRED_TRIMS = "securitylog_deferred_trims"
# Failed log-ins (and failed second factors) recorded per account and hour at most: others'
# guesses must not bury the log.
FAILURES_RECORDED_PER_HOUR = 20


def record(user_id, event, detail="", address=None):
    """Add an event to the account's log (inside the caller's transaction, where it has one); the
    address is the request's, else `cli` (the service's own doings give "-")."""
    assert event in EVENTS, event
    SecurityEvent.create(user=user_id, event=event, ip=where_from(address), detail=detail[:200])
    forget_beyond_kept((SecurityEvent.user == user_id) & SecurityEvent.org.is_null())
    recorded.send(event, user_id=user_id, detail=detail)


def record_in(org_id, event, detail="", address=None, actor_id=None):
    """Add an event to the organisation's log, with who acted: actor_id, else the user of the web
    request under way (acting_user_id), else no one (the command line, the service itself)."""
    assert event in EVENTS, event
    SecurityEvent.create(user=actor_id or acting_user_id(), org=org_id, event=event, ip=where_from(address),
                         detail=detail[:200])
    if (deferred := g.get(DEFERRED_TRIMS) if has_app_context() else None) is not None:
        deferred.add(org_id)
    else:
        forget_beyond_kept(SecurityEvent.org == org_id)


@contextlib.contextmanager
def trims_deferred(transaction):
    """Within it, each organisation's log is trimmed to KEPT once, at the end, in a transaction(),
    rather than at every event: one trim is an index walk of KEPT entries, and a report of leaked
    keys may revoke a thousand keys of one organisation."""
    if g.get(DEFERRED_TRIMS) is not None:
        yield  # an outer one trims
        return
    g.setdefault(DEFERRED_TRIMS, set())
    try:
        yield
    finally:
        for org_id in sorted(g.pop(DEFERRED_TRIMS, ())):
            with transaction():
                forget_beyond_kept(SecurityEvent.org == org_id)


def acting_user():
    """The logged-in user of the web request under way (web/hooks.py sets g.user); None for the
    command line, the API and the service's own jobs."""
    return g.get("user") if has_app_context() else None


def acting_user_id():
    user = acting_user()
    return user.id if user is not None else None


def where_from(address):
    if address is None:
        address = request.remote_addr if has_request_context() else "cli"
    return (address or "-")[:64]


def record_key_event(event, key, detail=None, **_):
    """keys/events.py's key_changed: record the change in the key's organisation's log, in its transaction."""
    if detail is not None:
        record_in(key.org_id, event, detail)


def init_app(app):
    key_events.key_changed.connect(record_key_event)


def forget_beyond_kept(whose):
    """Delete the log's events (whose: the account's or the organisation's) older than its newest
    KEPT: one index walk of KEPT entries."""
    newest_first = (SecurityEvent.select(SecurityEvent.created_at, SecurityEvent.id)
                    .where(whose)
                    .order_by(SecurityEvent.created_at.desc(), SecurityEvent.id.desc()))
    oldest_kept = newest_first.offset(KEPT - 1).first()
    if oldest_kept is None:
        return
    older = (SecurityEvent.created_at < oldest_kept.created_at) | (
        (SecurityEvent.created_at == oldest_kept.created_at) & (SecurityEvent.id < oldest_kept.id))
    SecurityEvent.delete().where(whose & older).execute()


def failures_this_hour(user_id, event="user.login_failed"):
    since = utcnow() - datetime.timedelta(hours=1)
    return (SecurityEvent.select().where((SecurityEvent.user == user_id) & (SecurityEvent.event == event)
                                         & (SecurityEvent.created_at >= since)).count())


def recent(user_id, limit=SHOWN):
    """The account's log, newest first (all of it with limit None): its own events and those of
    its personal organisation (the Security tab there, and `audit USERNAME`)."""
    personal = Organisation.select(Organisation.id).where(Organisation.personal_for == user_id)
    return newest(((SecurityEvent.user == user_id) & SecurityEvent.org.is_null()) | SecurityEvent.org.in_(personal),
                  limit)


def recent_in(org_id, limit=SHOWN):
    """The organisation's log, newest first (all of it with limit None)."""
    return newest(SecurityEvent.org == org_id, limit)


def newest(whose, limit):
    """The events, newest first, each with who acted loaded (event.user; None for no one)."""
    events = (SecurityEvent.select(SecurityEvent, User).join(User, JOIN.LEFT_OUTER).where(whose)
              .order_by(SecurityEvent.created_at.desc(), SecurityEvent.id.desc()))
    return list(events.limit(limit) if limit else events)
