"""Each organisation's webhook endpoints: adding one (its secret made and shown once), changing,
pausing and resuming one, listing, removing, and asking for a test event; the CLI, the Security tab
and the tests call these."""

import datetime

from flask import current_app
from peewee import PostgresqlDatabase, fn

from accounts import securitylog, users
from models import db, iso_seconds, utcnow
from orgs import organisations
from store.writelock import write_transaction
from webhooks import addresses, outbox, signing
from webhooks.models import ALL_EVENTS, PENDING, WebhookAttempt, WebhookEndpoint, WebhookMessage

MAX_ENDPOINTS = 10
MAX_DESCRIPTION_LENGTH = 200
# How long a rotated-out secret goes on signing beside the new one, unless told otherwise, and at most.
DEFAULT_OVERLAP = datetime.timedelta(hours=24)
MAX_OVERLAP = datetime.timedelta(days=7)


class EndpointCapReached(ValueError):
    pass


class EndpointGone(ValueError):
    def __init__(self):
        super().__init__("The webhook endpoint was removed.")


def parse_events(names):
    """What an endpoint subscribed to the events named stores: ALL_EVENTS when none is named (or
    `*` is), so that it also gets the events of later releases; else the names, checked and in the
    contract's order."""
    names = [name.strip() for name in names if name.strip()]
    if not names or ALL_EVENTS in names:
        return ALL_EVENTS
    if unknown := [name for name in names if name not in outbox.EVENTS]:
        raise ValueError(f"Unknown event {unknown[0]!r}; the events are: {', '.join(outbox.EVENTS)} (or * for every "
                         "event).")
    return ",".join(event for event in outbox.EVENTS if event in names)


def add_endpoint(user, url, events=None, org=None):
    """Add an endpoint for the organisation (an id; None: the user's personal one), subscribed to
    events (None or empty: every event, those of later releases included); return (WebhookEndpoint,
    its signing secret). The secret exists only here; the database keeps it sealed. ValueError
    (RefusedAddress among them) with a sentence for a URL or event refused, EndpointCapReached
    beyond MAX_ENDPOINTS."""
    users.refuse_control_characters(url, "A webhook URL")
    events = parse_events(events or [])
    url = addresses.check_url(url, current_app.config["WEBHOOK_ALLOW_PRIVATE"])
    secret = signing.new_secret()
    org_id = org if org is not None else users.personal_organisation_id(user)
    with db.atomic():
        organisations.lock_organisation(org_id)
        if WebhookEndpoint.select().where(WebhookEndpoint.org == org_id).count() >= MAX_ENDPOINTS:
            raise EndpointCapReached(f"An organisation may have {MAX_ENDPOINTS} webhook endpoints; remove one "
                                     "before adding another.")
        endpoint = WebhookEndpoint.create(org=org_id, url=url, events=events, sealed_secret=signing.seal(secret))
        subscribed = "all events" if events == ALL_EVENTS else events.replace(",", ", ")
        securitylog.record_in(org_id, "webhook.added", f"{url} (id {endpoint.id}; {subscribed})")
    return endpoint, secret


def remove_endpoint(endpoint):
    """Delete the endpoint with its messages and attempts; return True when this call removed it."""
    with db.atomic():
        removed = WebhookEndpoint.delete().where(WebhookEndpoint.id == endpoint.id).execute()
        if removed:
            securitylog.record_in(endpoint.org_id, "webhook.removed", f"{endpoint.url} (id {endpoint.id})")
    return bool(removed)


def update_endpoint(endpoint, url=None, events=None, description=None):
    """Change what is given of the endpoint's URL (checked as a new one's), events (parse_events'
    input; empty: every event) and description ('' for none); return the names of the fields that
    changed, recorded as one webhook.updated line. Its secret, messages and attempts stay."""
    asked = {}
    if url is not None:
        users.refuse_control_characters(url, "A webhook URL")
        asked["url"] = addresses.check_url(url, current_app.config["WEBHOOK_ALLOW_PRIVATE"])
    if events is not None:
        asked["events"] = parse_events(events)
    if description is not None:
        description = description.strip()
        users.refuse_control_characters(description, "A description")
        if len(description) > MAX_DESCRIPTION_LENGTH:
            raise ValueError(f"A description is at most {MAX_DESCRIPTION_LENGTH} characters.")
        asked["description"] = description or None
    with write_transaction(db.obj):
        lock_endpoint(endpoint.id)
        current = WebhookEndpoint.get_by_id(endpoint.id)
        changes = {field: value for field, value in asked.items() if getattr(current, field) != value}
        if changes:
            WebhookEndpoint.update(**changes).where(WebhookEndpoint.id == endpoint.id).execute()
            securitylog.record_in(endpoint.org_id, "webhook.updated",
                                  f"{changes.get('url', current.url)} (id {endpoint.id}): changed {', '.join(changes)}")
    return list(changes)


def pause_endpoint(endpoint, by=None, now=None):
    """Pause the endpoint: its messages, those written meanwhile included, wait (neither attempted
    nor failed) until it is resumed. by: the username of who paused it (None: the command line).
    Return True when this call paused it."""
    now = now or utcnow()
    with write_transaction(db.obj):
        lock_endpoint(endpoint.id)
        paused = (WebhookEndpoint.update(paused_at=now, paused_by=by)
                  .where((WebhookEndpoint.id == endpoint.id) & WebhookEndpoint.paused_at.is_null()).execute())
        if paused:
            # A message under an attempt is left to it: delivery.record makes it wait should it fail.
            (WebhookMessage.update(next_attempt_at=None)
             .where((WebhookMessage.endpoint == endpoint.id) & (WebhookMessage.state == PENDING)
                    & unclaimed(now)).execute())
            securitylog.record_in(endpoint.org_id, "webhook.paused", f"{endpoint.url} (id {endpoint.id})")
    return bool(paused)


def resume_endpoint(endpoint, now=None):
    """Resume a paused endpoint: its waiting messages go out at once, in the order they were made.
    Return True when this call resumed it."""
    now = now or utcnow()
    with write_transaction(db.obj):
        lock_endpoint(endpoint.id)
        # Its days of failing start afresh: the days it was paused are none of the receiver's.
        resumed = (WebhookEndpoint.update(paused_at=None, paused_by=None, failing_since=None)
                   .where((WebhookEndpoint.id == endpoint.id) & WebhookEndpoint.paused_at.is_null(False)).execute())
        if resumed:
            # Every waiting message due now, so that they go out in the order they were made.
            (WebhookMessage.update(next_attempt_at=now)
             .where((WebhookMessage.endpoint == endpoint.id) & (WebhookMessage.state == PENDING)
                    & unclaimed(now)).execute())
            securitylog.record_in(endpoint.org_id, "webhook.resumed", f"{endpoint.url} (id {endpoint.id})")
    return bool(resumed)


def unclaimed(now):
    """No attempt of the message is under way: its last claim's lease ended or was given back."""
    return WebhookMessage.claimed_until.is_null() | (WebhookMessage.claimed_until <= now)


def is_paused(endpoint_id):
    return WebhookEndpoint.select().where((WebhookEndpoint.id == endpoint_id)
                                          & WebhookEndpoint.paused_at.is_null(False)).exists()


def rotate_secret(endpoint, overlap=DEFAULT_OVERLAP, now=None):
    """Give the endpoint a new signing secret; return (it, when the overlap ends or None). The secret
    exists only here. Until the overlap ends the secret it replaces signs each delivery too; a zero
    overlap ends that at once. A rotation during an overlap drops the oldest secret: two at most
    ever sign."""
    if not datetime.timedelta(0) <= overlap <= MAX_OVERLAP:
        raise ValueError(f"The overlap is at most {MAX_OVERLAP.days} days (7d), or 0 to end the old secret at once.")
    now = now or utcnow()
    secret = signing.new_secret()
    with write_transaction(db.obj):
        lock_endpoint(endpoint.id)
        current = (WebhookEndpoint.select(WebhookEndpoint.sealed_secret)
                   .where(WebhookEndpoint.id == endpoint.id).scalar())
        until = now + overlap if overlap else None
        (WebhookEndpoint.update(sealed_secret=signing.seal(secret), sealed_previous_secret=current if until else None,
                                previous_until=until)
         .where(WebhookEndpoint.id == endpoint.id).execute())
        ends = f"the old one signs too until {iso_seconds(until)}" if until else "the old one no longer signs"
        securitylog.record_in(endpoint.org_id, "webhook.secret_rotated", f"{endpoint.url} (id {endpoint.id}; {ends})")
    return secret, until


def send_test(endpoint):
    """Queue a webhook.test message for the endpoint (delivered within seconds); return it. One at
    a time: ValueError while the last one still waits, so a button cannot make the service flood
    a URL."""
    if is_paused(endpoint.id):
        raise ValueError("The endpoint is paused: resume it to send a test event.")
    with db.atomic():
        if test_pending(endpoint):
            raise ValueError("A test event for this endpoint is still waiting to be delivered; try again once "
                             "it has been.")
        return outbox.write_test(endpoint)


def test_pending(endpoint):
    """True while the endpoint's last test event is still to be delivered or to fail (its first
    attempt made or not): send_test refuses another until then."""
    return WebhookMessage.select().where((WebhookMessage.endpoint == endpoint.id)
                                         & (WebhookMessage.event == "webhook.test")
                                         & (WebhookMessage.state == PENDING)).exists()


def waiting_test(endpoint):
    """The endpoint's test message that no attempt has been recorded for yet, or None."""
    attempted = WebhookAttempt.select().where((WebhookAttempt.endpoint == endpoint.id)
                                              & (WebhookAttempt.message_id == WebhookMessage.message_id))
    return (WebhookMessage.select().where((WebhookMessage.endpoint == endpoint.id)
                                          & (WebhookMessage.event == "webhook.test")
                                          & (WebhookMessage.state == PENDING) & ~fn.EXISTS(attempted)).first())


def lock_endpoint(endpoint_id):
    """Hold the endpoint's row until the transaction ends (two rotations, or two resends counted
    against the allowance, one after the other); a write first on SQLite, which takes the write
    lock. EndpointGone when it no longer exists."""
    if isinstance(db.obj, PostgresqlDatabase):
        found = WebhookEndpoint.select(WebhookEndpoint.id).where(WebhookEndpoint.id == endpoint_id).for_update().first()
    else:
        found = (WebhookEndpoint.update(created_at=WebhookEndpoint.created_at)
                 .where(WebhookEndpoint.id == endpoint_id).execute())
    if not found:
        raise EndpointGone()


def owned(org_id):
    """The organisation's endpoints, oldest first."""
    return list(WebhookEndpoint.select().where(WebhookEndpoint.org == org_id).order_by(WebhookEndpoint.id))


def recent_attempts(endpoint):
    """The endpoint's kept attempts, newest first."""
    return list(WebhookAttempt.select().where(WebhookAttempt.endpoint == endpoint.id)
                .order_by(WebhookAttempt.id.desc()))


def attempted(endpoint, message_id):
    """True when the endpoint's kept attempts include one of the message with this webhook-id."""
    return WebhookAttempt.select().where((WebhookAttempt.endpoint == endpoint.id)
                                         & (WebhookAttempt.message_id == message_id)).exists()


def kept_message_ids(endpoint, message_ids):
    """Those of the webhook-ids that name a message of the endpoint still kept: a message is
    forgotten a week after it was made, while its attempts stay among the endpoint's last 50."""
    if not message_ids:
        return set()
    return {row.message_id for row in WebhookMessage.select(WebhookMessage.message_id)
            .where((WebhookMessage.endpoint == endpoint.id) & WebhookMessage.message_id.in_(sorted(message_ids)))}


def state(endpoint):
    """The endpoint's state in a word: paused, disabled, failing or active."""
    if endpoint.paused_at is not None:
        return "paused"
    if endpoint.disabled_at is not None:
        return "disabled"
    return "failing" if endpoint.failing_since is not None else "active"
