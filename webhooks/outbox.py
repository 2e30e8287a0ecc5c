"""The outbox: each event becomes one message per endpoint subscribed to it, written in the
transaction of the change that caused it, so a change is never committed without its messages
(nor a message without its change): a key change's through keys/events.py's signal, a hot-path
event's through the usage flush that carries it. webhooks/delivery.py sends them."""

import collections
import json
import logging
import secrets
import time

from accounts import securitylog
from keys import events as key_events
from models import Organisation, iso_ms, utcnow
from orgs import organisations
from webhooks import catalog
from webhooks.models import PENDING, WebhookEndpoint, WebhookMarker, WebhookMessage, subscribes

log = logging.getLogger(__name__)

EVENTS = catalog.EVENTS
# The events the Security tab offers to choose: webhook.test goes to the endpoint it was asked for,
# whatever that endpoint is subscribed to, so a box for it would change nothing.
SUBSCRIBABLE = EVENTS[:-1]

# Deferred events kept while usage flushes fail (the database down): the newest, so that a long
# outage cannot use up the worker's memory.
DEFERRED_KEPT = 10_000
DROPS_LOGGED_EVERY = 60


class Drops:
    """The events dropped from a full queue, logged at most once every DROPS_LOGGED_EVERY seconds."""

    def __init__(self, kept):
        self.kept = kept
        self.count = 0
        self.logged_at = None

    def log_now_and_then(self):
        if self.count and (self.logged_at is None or time.monotonic() - self.logged_at >= DROPS_LOGGED_EVERY):
            log.warning("%d webhook events were dropped: %d were already waiting for a usage flush that "
                        "could not write them.", self.count, self.kept)
            self.count, self.logged_at = 0, time.monotonic()


class DeferredEvents:
    """Events decided on the hot path (metering/thresholds.py's Watcher), where no transaction is
    open, as (org_id, event, data, when): adding one never blocks and never touches the database.
    The app's usage counter carries them (metering/usage.py's riders): its next flush, within a
    second, writes their messages in the transaction of its counts, and gives them back when that
    transaction does not commit. A deque: adding and taking need no lock, between greenlets or real
    threads; beyond DEFERRED_KEPT waiting, the oldest is dropped."""

    def __init__(self, kept=DEFERRED_KEPT):
        self.waiting = collections.deque(maxlen=kept)
        self.drops = Drops(kept)

    def add(self, org_id, event, data):
        if len(self.waiting) == self.waiting.maxlen:
            self.drops.count += 1
        self.waiting.append((org_id, event, data, utcnow()))

    def take(self):
        """The events added so far, taken out of the queue."""
        self.drops.log_now_and_then()
        taken = []
        while self.waiting:
            taken.append(self.waiting.popleft())
        return taken

    def give_back(self, events):
        """Return taken events whose transaction did not commit, first in line for the next flush;
        the oldest are dropped beyond what the queue keeps."""
        kept = events[max(len(events) - (self.waiting.maxlen - len(self.waiting)), 0):]
        self.drops.count += len(events) - len(kept)
        self.waiting.extendleft(reversed(kept))

    @staticmethod
    def write(events):
        """Write the messages of taken events, inside the caller's transaction: one query finds the
        endpoints of all their organisations (most have none, and their events end here)."""
        if not events:
            return
        endpoints = collections.defaultdict(list)
        rows = (WebhookEndpoint.select(WebhookEndpoint.org, WebhookEndpoint.id, WebhookEndpoint.events,
                                       Organisation.slug, WebhookEndpoint.paused_at)
                .join(Organisation)
                .where(WebhookEndpoint.org.in_(list({org_id for org_id, *_ in events}))
                       & WebhookEndpoint.disabled_at.is_null()).tuples())
        slugs, paused = {}, set()
        for org_id, endpoint_id, names, slug, paused_at in rows:
            endpoints[org_id].append((endpoint_id, names))
            slugs[org_id] = slug
            if paused_at is not None:
                paused.add(endpoint_id)
        for org_id, event, data, when in events:
            if subscribed_ids := [endpoint_id for endpoint_id, names in endpoints[org_id] if subscribes(names, event)]:
                write_messages(subscribed_ids, event, {**data, "org": slugs[org_id]}, when, paused)


def init_app(app):
    """Subscribe to key changes, and make the app's queue of deferred events (which app.py hands to
    the limiter's threshold watcher and to the usage counter); return the queue."""
    key_events.key_changed.connect(emit_key_event)
    organisations.organisations_deleted.connect(forget_endpoints)
    deferred = app.extensions["webhook_events"] = DeferredEvents()
    return deferred


def forget_endpoints(org_ids):
    """orgs/organisations.py's organisations_deleted: their endpoints go with them (their
    messages and attempts by their foreign keys)."""
    WebhookEndpoint.delete().where(WebhookEndpoint.org.in_(org_ids)).execute()


def emit_key_event(event, key, data=None, **_):
    """keys/events.py's key_changed: the messages of a key event webhooks send, in its transaction,
    with who acted (a username; None for the service itself, the command line or the API). A new
    expiry is announced afresh: the markers of the old one's key.expiring and key.expired go."""
    if event == "key.updated" and "expires_at" in data["changed"]:
        WebhookMarker.delete().where(WebhookMarker.api_key == key.id).execute()
    if event in EVENTS:
        actor = securitylog.acting_user()
        emit(key.org_id, event, {**data, "actor": actor.username if actor is not None else None})


def emit(org_id, event, data, now=None):
    """Write one message per enabled endpoint of the organisation subscribed to the event, its data
    with the organisation's slug; call it inside the caller's open transaction (db.atomic()).
    Return how many were written."""
    assert event in EVENTS, event
    rows = (WebhookEndpoint.select(WebhookEndpoint.id, WebhookEndpoint.events, Organisation.slug,
                                   WebhookEndpoint.paused_at).join(Organisation)
            .where((WebhookEndpoint.org == org_id) & WebhookEndpoint.disabled_at.is_null()).tuples())
    endpoints = [(endpoint_id, slug, paused_at) for endpoint_id, events, slug, paused_at in rows
                 if subscribes(events, event)]
    if endpoints:
        write_messages([endpoint_id for endpoint_id, _, _ in endpoints], event, {**data, "org": endpoints[0][1]},
                       now or utcnow(), {endpoint_id for endpoint_id, _, paused_at in endpoints if paused_at})
    return len(endpoints)


def write_test(endpoint):
    """Write a webhook.test message for the endpoint (inside the caller's transaction); return it."""
    now = utcnow()
    [message_id] = write_messages([endpoint.id], "webhook.test",
                                  {"endpoint_id": endpoint.id, "url": endpoint.url, "org": endpoint.org.slug}, now,
                                  {endpoint.id} if endpoint.paused_at else ())
    return WebhookMessage.get(WebhookMessage.message_id == message_id)


def write_messages(endpoint_ids, event, data, now, paused=()):
    """Write one message of the event for each endpoint, in one statement (a report of leaked keys
    may revoke a thousand keys of an organisation with ten endpoints); return their webhook-ids.
    The messages of the paused endpoints (ids) wait without a next attempt until they are resumed."""
    body = message_body(event, data, now)
    message_ids = [new_message_id() for _ in endpoint_ids]
    WebhookMessage.insert_many([{"endpoint": endpoint_id, "message_id": message_id, "event": event, "body": body,
                                 "created_at": now, "state": PENDING,
                                 "next_attempt_at": None if endpoint_id in paused else now}
                                for endpoint_id, message_id in zip(endpoint_ids, message_ids)]).execute()
    return message_ids


def message_body(event, data, now):
    """The body every attempt sends, byte for byte: {"type", "timestamp", "data"}."""
    return json.dumps({"type": event, "timestamp": iso_ms(now), "data": data}, separators=(",", ":"))


def new_message_id():
    """msg_ and 24 random URL-safe characters: the webhook-id of every attempt of one message."""
    return "msg_" + secrets.token_urlsafe(18)
