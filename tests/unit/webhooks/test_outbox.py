"""webhooks/outbox.py: each key event reaches the receiver with its data, only at the endpoints
subscribed to it, never from a change that rolled back; the hot path's events (usage thresholds,
credits) written by the usage flush, capped while it cannot write them, one app's never another's."""

import collections
import logging

import pytest
from peewee import OperationalError

from keys import events as key_events
from models import ApiKey, personal_organisation, utcnow
from orgs import keyactions
from webhooks import delivery, endpoints, outbox
from webhooks.models import WebhookEndpoint, WebhookMessage


def test_key_events_reach_the_receiver_with_their_data(app, client, user, hook, receiver):
    key, secret = keyactions.issue_key(user, "Laptop", "production", expires_in=3600, scopes=["test:read"])
    new_secret = keyactions.roll_key(key, grace=60)
    keyactions.revoke_key(ApiKey.get_by_id(key.id))
    leaked, leaked_secret = keyactions.issue_key(user, "Leaky", "development")
    assert client.post("/api/v1/keys/revoke", headers={"X-API-Key": leaked_secret}).status_code == 200
    delivery.deliver_due(app)
    by_type = {sent.payload["type"]: sent for sent in receiver.wait_for(5)
               if sent.payload["data"]["key_name"] == "Laptop" or sent.payload["type"] != "key.created"}
    assert all(sent.error is None for sent in by_type.values())
    # Made from the command line (no one logged in acted): no actor; the organisation is alice's own.
    names = {"key_id": key.id, "key_name": "Laptop", "org": "alice", "actor": None}
    created = by_type["key.created"].verified["data"]
    assert created == {**names, "key_prefix": secret[:12], "key_type": "production", "scopes": ["test:read"],
                       "expires_at": created["expires_at"], "imported": False}
    assert created["expires_at"].endswith("Z")
    rolled = by_type["key.rolled"].verified["data"]
    assert rolled == {**names, "key_prefix": new_secret[:12], "previous_key_prefix": secret[:12],
                      "previous_valid_until": rolled["previous_valid_until"]}
    revoked = by_type["key.revoked"].verified["data"]
    assert revoked == {**names, "key_prefix": new_secret[:12], "revoked_at": revoked["revoked_at"]}
    assert by_type["key.revoked_as_leaked"].verified["data"]["key_id"] == leaked.id
    everything = " ".join(sent.body.decode() + str(sent.headers) for sent in receiver.received())
    for shown_once in (secret, new_secret, leaked_secret, receiver.secrets["/alice"]):
        assert shown_once not in everything and shown_once[12:] not in everything


def test_an_endpoint_gets_only_the_events_it_is_subscribed_to(app, user, receiver):
    endpoint, secret = endpoints.add_endpoint(user, f"{receiver.url}/revocations", ["key.revoked"])
    receiver.secrets["/revocations"] = secret
    key, _ = keyactions.issue_key(user, "Laptop", "production")
    keyactions.revoke_key(key)
    delivery.deliver_due(app)
    assert [sent.payload["type"] for sent in receiver.wait_for(1)] == ["key.revoked"]


def test_an_endpoint_of_every_event_gets_the_events_of_later_releases(app, user, receiver):
    """It stores *, not this release's events: an event that is not among them reaches it (through
    emit's query and through the usage flush), and not an endpoint whose row names every event."""
    everything, secret = endpoints.add_endpoint(user, f"{receiver.url}/all")
    receiver.secrets["/all"] = secret
    named, _ = endpoints.add_endpoint(user, f"{receiver.url}/named", list(outbox.EVENTS))
    assert WebhookEndpoint.get_by_id(everything.id).events == "*"
    assert WebhookEndpoint.get_by_id(named.id).events == ",".join(outbox.EVENTS)
    later = "key.renamed"
    assert later not in outbox.EVENTS
    receiver.uncatalogued.add(later)
    org = personal_organisation(user.id).id
    outbox.DeferredEvents.write([(org, later, {"key_id": 7}, utcnow())])
    assert [(message.endpoint_id, message.event) for message in WebhookMessage.select()] == [(everything.id, later)]
    delivery.deliver_due(app)
    assert [sent.verified["type"] for sent in receiver.wait_for(1)] == [later]


def test_a_change_that_rolls_back_leaves_no_message(app, user, hook):
    with pytest.raises(keyactions.KeyCapReached):
        app.config["MAX_KEYS_PER_USER"] = 0
        keyactions.issue_key(user, "Refused", "production")
    assert WebhookMessage.select().count() == 0


def test_an_account_without_endpoints_costs_one_query_and_gets_no_message(app, user):
    keyactions.issue_key(user, "Laptop", "production")
    assert WebhookMessage.select().count() == 0


def test_deferred_events_are_written_once_by_the_usage_flush_with_its_counts(app, user, hook, monkeypatch):
    key, _ = keyactions.issue_key(user, "Busy", "production")
    WebhookMessage.delete().execute()
    counter = app.extensions["usage"]
    counter.interval = 3600  # no flush but this test's
    counter.add(key.id, "/api/v1/protected/test", 200, True)
    deferred = app.extensions["webhook_events"]
    deferred.add(user.id, "usage.threshold", key_events.key_data(key, percent=80))
    assert WebhookMessage.select().count() == 0
    written = counter.write

    def fail(*args):
        raise OperationalError("the database went away")

    monkeypatch.setattr(counter, "write", fail)
    with pytest.raises(OperationalError):
        counter.flush()
    assert WebhookMessage.select().count() == 0 and ApiKey.get_by_id(key.id).total_requests == 0
    monkeypatch.setattr(counter, "write", written)
    counter.flush()
    counter.flush()
    [message] = WebhookMessage.select()
    assert message.event == "usage.threshold" and ApiKey.get_by_id(key.id).total_requests == 1
    assert deferred.waiting == collections.deque()


@pytest.mark.parametrize("limits", [None, "5/minute+100/hour"])
def test_usage_threshold_at_80_and_100_percent_once_per_window(app, client, user, hook, receiver, limits):
    key, secret = keyactions.issue_key(user, "Busy", "production")
    ApiKey.update(rate_limits=limits).where(ApiKey.id == key.id).execute()
    statuses = [client.get("/api/v1/protected/test", headers={"X-API-Key": secret}).status_code for _ in range(7)]
    assert statuses == [200] * 5 + [429] * 2
    app.extensions["usage"].flush()
    delivery.deliver_due(app)
    thresholds = sorted((sent.verified["data"] for sent in receiver.received()
                         if sent.payload["type"] == "usage.threshold"), key=lambda data: data["used"])
    window = "free" if limits is None else "key-minute"
    assert [(data["window"], data["used"], data["percent"]) for data in thresholds] == [
        (window, 4, 80), (window, 5, 100)]
    assert thresholds[0] == {"key_id": key.id, "key_name": "Busy", "key_prefix": key.display_prefix, "window": window,
                             "limit": 5, "window_seconds": 60, "used": 4, "percent": 80,
                             "reset_at": thresholds[0]["reset_at"], "org": "alice"}


def test_credits_low_at_ten_percent_and_exhausted_at_zero_once_each(app, client, user, hook, receiver):
    key, secret = keyactions.issue_key(user, "Metered", "production", credits_given=20)
    ApiKey.update(rate_limits="100/minute").where(ApiKey.id == key.id).execute()
    statuses = [client.get("/api/v1/protected/test", headers={"X-API-Key": secret}).status_code for _ in range(22)]
    assert statuses == [200] * 20 + [429] * 2
    app.extensions["usage"].flush()
    delivery.deliver_due(app)
    events = sorted((sent.verified for sent in receiver.received()
                     if sent.payload["type"].startswith("credits.")),
                    key=lambda event: -event["data"]["credits_remaining"])
    assert [(event["type"], event["data"]["credits_remaining"]) for event in events] == [
        ("credits.low", 2), ("credits.exhausted", 0)]
    assert events[0]["data"]["credits_granted"] == 20
    assert events[1]["data"] == {"key_id": key.id, "key_name": "Metered", "key_prefix": key.display_prefix,
                                 "credits_remaining": 0, "next_refill_at": None, "org": "alice"}


def test_events_of_users_without_endpoints_cost_the_flush_one_query(app, user, hook, caplog):
    events = [(user_id, "usage.threshold", {"percent": 80}, utcnow()) for user_id in range(1000, 1050)]
    events.append((user.id, "usage.threshold", {"percent": 80}, utcnow()))
    with caplog.at_level(logging.DEBUG, logger="peewee"):
        outbox.DeferredEvents.write(events)
    selects = [record for record in caplog.records if record.name == "peewee" and "SELECT" in record.getMessage()]
    assert len(selects) == 1
    assert [message.event for message in WebhookMessage.select()] == ["usage.threshold"]


def test_events_waiting_for_a_flush_are_capped_and_the_drops_logged_once_a_minute(caplog):
    deferred = outbox.DeferredEvents(kept=5)
    for n in range(7):
        deferred.add(n, "usage.threshold", {})
    with caplog.at_level(logging.WARNING, logger="webhooks.outbox"):
        taken = deferred.take()
        assert [user_id for user_id, *_ in taken] == [2, 3, 4, 5, 6]
        deferred.add(7, "usage.threshold", {})
        deferred.give_back(taken)  # the flush failed: the oldest beyond the cap go
        assert [user_id for user_id, *_ in deferred.waiting] == [3, 4, 5, 6, 7]
        deferred.take()
    assert [record.getMessage() for record in caplog.records] == [
        "2 webhook events were dropped: 5 were already waiting for a usage flush that could not write them."]
    assert deferred.drops.count == 1


def test_each_app_keeps_its_own_deferred_events(make_app, database_url):
    """Two apps in one process (tests, or a CLI beside a server) never write each other's events."""
    config = {"DATABASE_URL": database_url, "RATELIMIT_STORAGE_URL": "memory://", "TESTING": True}
    first, second = make_app(config), make_app(config)
    first.extensions["webhook_events"].add(1, "usage.threshold", {})
    assert second.extensions["webhook_events"].take() == []
    assert [user_id for user_id, *_ in first.extensions["webhook_events"].take()] == [1]
