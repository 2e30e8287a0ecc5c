"""Webhooks with Flask's test client, the CLI runner and a local receiver that verifies every
delivery with the `standardwebhooks` library, on SQLite and PostgreSQL: signing, each key event
with its data, retries, the address rules, the CLI and the Security tab's section."""

import base64
import collections
import contextlib
import datetime
import html.parser
import http.client
import logging
import pathlib
import re
import socket
import subprocess
import sys
import threading
import time

import pytest
from peewee import OperationalError
from standardwebhooks import Webhook
from webhookreceiver import receiving
from werkzeug.datastructures import MultiDict

import auth
import settings
from accounts import users
from keys import events as key_events
from models import ApiKey, SecurityEvent, db, personal_organisation, utcnow
from webhooks import addresses, delivery, endpoints, outbox, periodic, signing
from webhooks.models import DELIVERED, FAILED, PENDING, WebhookAttempt, WebhookEndpoint, WebhookMessage

REFUSED = ["127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254", "0.0.0.0", "::", "::1",
           "::ffff:127.0.0.1", "::ffff:10.0.0.1", "fc00::1", "fe80::1", "224.0.0.1", "ff02::1", "100.64.0.1",
           "255.255.255.255", "64:ff9b::a00:1", "2002:7f00:1::1", "192.0.0.8", "192.0.0.9", "192.0.0.170"]
# Refused by name whatever this Python's ipaddress says: site-local and documentation addresses, and the
# protocol assignments Python versions disagree about (3.11 and 3.12 call fec0::/10, 3fff::/20 and
# 192.0.0.10 global; 3.13 calls 2001:1::1, 2001:3::/32 and 2001:20::/28 global).
REFUSED_BY_NAME = ["fec0::1", "feff:ffff::1", "3fff::1", "3fff:fff:ffff::1", "192.0.2.1", "198.51.100.7", "203.0.113.9",
            "2001:db8::1", "192.0.0.10", "2001:1::1", "2001:3::1", "2001:20::1", "::ffff:203.0.113.9",
            "2002:c000:201::1", "64:ff9b::c633:6407"]
PUBLIC = ["93.184.216.34", "8.8.8.8", "2606:4700:4700::1111", "::ffff:8.8.8.8", "3fff:1000::1", "2002:808:808::1"]


@pytest.fixture
def app(make_app, database_url):
    app = make_app({
        "DATABASE_URL": database_url, "RATELIMIT_STORAGE_URL": "memory://", "RATE_LIMIT_TIERS": "free=5/minute",
        "PUBLIC_RATE_LIMIT": "off", "TESTING": True, "WTF_CSRF_ENABLED": False,
        "WEBHOOK_RETRY_SCHEDULE": "1s,1s", "WEBHOOK_ALLOW_PRIVATE": True,
    })
    with app.app_context():
        yield app


@pytest.fixture
def receiver():
    with receiving() as receiver:
        yield receiver


@pytest.fixture
def hook(app, user, receiver):
    """(endpoint, secret) of alice's endpoint at the receiver, subscribed to every event."""
    endpoint, secret = endpoints.add_endpoint(user, f"{receiver.url}/alice")
    receiver.secrets["/alice"] = secret
    return endpoint, secret


def deliver(app):
    return delivery.deliver_due(app)


def due_now(message_id):
    """Bring a message's next attempt forward to now, as if its pause had passed."""
    WebhookMessage.update(next_attempt_at=utcnow()).where(
        (WebhookMessage.message_id == message_id) & (WebhookMessage.state == PENDING)).execute()


# Signing

def test_a_secret_is_whsec_and_the_base64_of_24_random_bytes():
    secret = signing.new_secret()
    assert secret.startswith("whsec_") and len(base64.b64decode(secret[6:], validate=True)) == 24
    assert signing.new_secret() != secret


def test_the_signature_is_hmac_sha256_of_id_timestamp_body_as_the_library_computes_it():
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    body = b'{"type":"webhook.test","timestamp":"2026-11-22T00:53:39.123Z","data":{}}'
    headers = signing.headers([secret], "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body)
    # The library's own signing of the same message, and a known answer, computed independently.
    expected = Webhook(secret).sign("msg_p5jXN8AQM9LWM0D4loKWxJek",
                                    datetime.datetime.fromtimestamp(1614265330, datetime.UTC), body.decode())
    assert headers["webhook-signature"] == expected
    assert headers["webhook-timestamp"] == "1614265330" and headers["webhook-id"] == "msg_p5jXN8AQM9LWM0D4loKWxJek"


def test_a_delivery_verifies_with_the_library_and_keeps_its_bytes(app, hook, receiver):
    endpoint, secret = hook
    message = endpoints.send_test(endpoint)
    [(claimed, outcome, state)] = deliver(app)
    assert state == DELIVERED and outcome.status == 204
    [received] = receiver.received()
    assert received.error is None, received.error
    assert received.verified == {"type": "webhook.test", "timestamp": received.payload["timestamp"],
                                 "data": {"endpoint_id": endpoint.id, "url": endpoint.url, "org": "alice"}}
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", received.payload["timestamp"])
    assert received.headers["content-type"] == "application/json"
    assert received.message_id == message.message_id and received.message_id.startswith("msg_")
    assert received.body == message.body.encode()
    assert secret not in received.body.decode() and secret not in str(received.headers)


def test_the_secret_is_stored_sealed(app, hook):
    endpoint, secret = hook
    stored = WebhookEndpoint.get_by_id(endpoint.id).sealed_secret
    assert secret not in stored and secret[6:] not in stored and signing.unseal(stored) == secret


def test_http_client_still_opens_its_socket_through_create_connection():
    # delivery.post replaces this attribute to connect to a checked address; a Python that moved it
    # would connect unchecked.
    assert http.client.HTTPConnection("example.com")._create_connection is socket.create_connection


# Events and their data

def test_key_events_reach_the_receiver_with_their_data(app, client, user, hook, receiver):
    key, secret = auth.issue_key(user, "Laptop", "production", expires_in=3600, scopes=["test:read"])
    new_secret = auth.roll_key(key, grace=60)
    auth.revoke_key(ApiKey.get_by_id(key.id))
    leaked, leaked_secret = auth.issue_key(user, "Leaky", "development")
    assert client.post("/api/v1/keys/revoke", headers={"X-API-Key": leaked_secret}).status_code == 200
    deliver(app)
    by_type = {delivery.payload["type"]: delivery for delivery in receiver.wait_for(5)
               if delivery.payload["data"]["key_name"] == "Laptop" or delivery.payload["type"] != "key.created"}
    assert all(delivery.error is None for delivery in by_type.values())
    # Made from the command line (no one logged in acted): no actor; the organisation is alice's own.
    names = {"key_id": key.id, "key_name": "Laptop", "org": "alice", "actor": None}
    created = by_type["key.created"].verified["data"]
    assert created == {**names, "key_prefix": secret[:12], "key_type": "production", "scopes": ["test:read"],
                       "expires_at": created["expires_at"]}
    assert created["expires_at"].endswith("Z")
    rolled = by_type["key.rolled"].verified["data"]
    assert rolled == {**names, "key_prefix": new_secret[:12], "previous_key_prefix": secret[:12],
                      "previous_valid_until": rolled["previous_valid_until"]}
    assert by_type["key.revoked"].verified["data"] == {**names, "key_prefix": new_secret[:12],
                                                       "revoked_at": by_type["key.revoked"].verified["data"]["revoked_at"]}
    assert by_type["key.revoked_as_leaked"].verified["data"]["key_id"] == leaked.id
    everything = " ".join(delivery.body.decode() + str(delivery.headers) for delivery in receiver.received())
    for shown_once in (secret, new_secret, leaked_secret, hook[1]):
        assert shown_once not in everything and shown_once[12:] not in everything


def test_an_endpoint_gets_only_the_events_it_is_subscribed_to(app, user, receiver):
    endpoint, secret = endpoints.add_endpoint(user, f"{receiver.url}/revocations", ["key.revoked"])
    receiver.secrets["/revocations"] = secret
    key, _ = auth.issue_key(user, "Laptop", "production")
    auth.revoke_key(key)
    deliver(app)
    assert [delivery.payload["type"] for delivery in receiver.wait_for(1)] == ["key.revoked"]


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
    deliver(app)
    assert [delivery.verified["type"] for delivery in receiver.wait_for(1)] == [later]


def test_a_change_that_rolls_back_leaves_no_message(app, user, hook):
    with pytest.raises(auth.KeyCapReached):
        app.config["MAX_KEYS_PER_USER"] = 0
        auth.issue_key(user, "Refused", "production")
    assert WebhookMessage.select().count() == 0


def test_an_account_without_endpoints_costs_one_query_and_gets_no_message(app, user):
    auth.issue_key(user, "Laptop", "production")
    assert WebhookMessage.select().count() == 0


def test_expiring_and_expired_are_sent_once_each(app, user, hook, receiver):
    soon, _ = auth.issue_key(user, "Soon", "production", expires_in=3 * 86400)
    auth.issue_key(user, "Later", "production", expires_in=30 * 86400)
    deliver(app)
    receiver.deliveries.clear()
    assert periodic.run() == 1 and periodic.run() == 0
    after_expiry = utcnow() + datetime.timedelta(days=3, hours=12)
    assert periodic.run(now=after_expiry) == 1 and periodic.run(now=after_expiry) == 0
    deliver(app)
    expiring, expired = sorted(receiver.wait_for(2), key=lambda delivery: delivery.payload["type"])[::-1]
    assert expiring.payload["type"] == "key.expiring" and expired.payload["type"] == "key.expired"
    for event in (expiring, expired):
        assert event.verified["data"] == {"key_id": soon.id, "key_name": "Soon", "key_prefix": soon.display_prefix,
                                          "expires_at": event.verified["data"]["expires_at"], "org": "alice",
                                          "actor": None}


def test_deferred_events_are_written_once_by_the_usage_flush_with_its_counts(app, user, hook, monkeypatch):
    key, _ = auth.issue_key(user, "Busy", "production")
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
    key, secret = auth.issue_key(user, "Busy", "production")
    ApiKey.update(rate_limits=limits).where(ApiKey.id == key.id).execute()
    statuses = [client.get("/api/v1/protected/test", headers={"X-API-Key": secret}).status_code for _ in range(7)]
    assert statuses == [200] * 5 + [429] * 2
    app.extensions["usage"].flush()
    deliver(app)
    thresholds = sorted((delivery.verified["data"] for delivery in receiver.received()
                         if delivery.payload["type"] == "usage.threshold"), key=lambda data: data["used"])
    window = "free" if limits is None else "key-minute"
    assert [(data["window"], data["used"], data["percent"]) for data in thresholds] == [(window, 4, 80), (window, 5, 100)]
    assert thresholds[0] == {"key_id": key.id, "key_name": "Busy", "key_prefix": key.display_prefix, "window": window,
                             "limit": 5, "window_seconds": 60, "used": 4, "percent": 80,
                             "reset_at": thresholds[0]["reset_at"], "org": "alice"}


def test_credits_low_at_ten_percent_and_exhausted_at_zero_once_each(app, client, user, hook, receiver):
    key, secret = auth.issue_key(user, "Metered", "production", credits_given=20)
    ApiKey.update(rate_limits="100/minute").where(ApiKey.id == key.id).execute()
    statuses = [client.get("/api/v1/protected/test", headers={"X-API-Key": secret}).status_code for _ in range(22)]
    assert statuses == [200] * 20 + [429] * 2
    app.extensions["usage"].flush()
    deliver(app)
    events = sorted((delivery.verified for delivery in receiver.received()
                     if delivery.payload["type"].startswith("credits.")), key=lambda event: -event["data"]["credits_remaining"])
    assert [(event["type"], event["data"]["credits_remaining"]) for event in events] == [
        ("credits.low", 2), ("credits.exhausted", 0)]
    assert events[0]["data"]["credits_granted"] == 20
    assert events[1]["data"] == {"key_id": key.id, "key_name": "Metered", "key_prefix": key.display_prefix,
                                 "credits_remaining": 0, "next_refill_at": None, "org": "alice"}


def test_threshold_marks_for_small_and_large_allowances():
    from metering import thresholds

    assert thresholds.marks(1) == {0: 100} and thresholds.marks(5) == {1: 80, 0: 100}
    assert thresholds.marks(1000) == {200: 80, 0: 100} and thresholds.marks(7) == {1: 80, 0: 100}


def test_old_messages_are_forgotten_in_batches_until_none_is_left(app, hook, monkeypatch):
    monkeypatch.setattr(periodic, "BATCH", 10)
    monkeypatch.setattr(periodic, "PAUSE_SECONDS", 0, raising=False)
    week_ago = utcnow() - periodic.MESSAGES_KEPT_FOR - datetime.timedelta(minutes=1)
    WebhookMessage.insert_many([{"endpoint": hook[0].id, "message_id": outbox.new_message_id(), "event": "webhook.test",
                                 "body": "{}", "created_at": week_ago, "state": DELIVERED} for _ in range(25)]).execute()
    kept = outbox.write_test(hook[0])
    periodic.run()
    assert [message.id for message in WebhookMessage.select()] == [kept.id]


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


# Retries

def test_a_receiver_failing_twice_gets_three_attempts_with_one_webhook_id(app, hook, receiver):
    receiver.answer = lambda delivery: 500 if len(receiver.received()) <= 2 else 200
    message = endpoints.send_test(hook[0])
    states = []
    for _ in range(3):
        [(claimed, outcome, state)] = deliver(app)
        states.append((claimed.number, outcome.status, state))
        if state == PENDING:
            # Measured from the attempt's own record, not from now: on a loaded machine the pause
            # may be over by the time the test gets here.
            attempted_at = WebhookAttempt.select().order_by(WebhookAttempt.id.desc()).get().attempted_at
            next_attempt_at = WebhookMessage.get_by_id(message.id).next_attempt_at
            pause = next_attempt_at - attempted_at
            assert datetime.timedelta(seconds=0.5) < pause <= datetime.timedelta(seconds=1)
            # Not due before its pause.
            assert delivery.claim(db.obj, 1, now=next_attempt_at - datetime.timedelta(milliseconds=1)) == []
            due_now(message.message_id)
    assert states == [(1, 500, PENDING), (2, 500, PENDING), (3, 200, DELIVERED)]
    assert {delivery.message_id for delivery in receiver.received()} == {message.message_id}
    assert all(delivery.error is None for delivery in receiver.received())


def test_a_redirect_is_a_failure_and_is_not_followed(app, hook, receiver):
    receiver.answer = lambda delivery: 302
    endpoints.send_test(hook[0])
    [(_, outcome, state)] = deliver(app)
    assert outcome.status == 302 and state == PENDING
    assert [delivery.path for delivery in receiver.received()] == ["/alice"]


def test_a_message_fails_for_good_once_the_schedule_is_spent(app, hook, receiver):
    receiver.answer = lambda delivery: 503
    message = endpoints.send_test(hook[0])
    for _ in range(3):
        deliver(app)
        due_now(message.message_id)
    assert deliver(app) == []
    stored = WebhookMessage.get_by_id(message.id)
    assert (stored.state, stored.attempts, stored.next_attempt_at) == (FAILED, 3, None)
    assert [attempt.number for attempt in endpoints.recent_attempts(hook[0])] == [3, 2, 1]


def test_an_endpoint_failing_for_five_days_is_disabled(app, user, hook, receiver):
    receiver.answer = lambda delivery: 500
    endpoint = hook[0]
    endpoints.send_test(endpoint)
    deliver(app)
    WebhookEndpoint.update(failing_since=utcnow() - datetime.timedelta(days=5, minutes=1)).execute()
    waiting = WebhookMessage.get(WebhookMessage.state == PENDING)
    due_now(waiting.message_id)
    deliver(app)
    stored = WebhookEndpoint.get_by_id(endpoint.id)
    assert stored.disabled_at is not None and endpoints.state(stored) == "disabled"
    assert WebhookMessage.get_by_id(waiting.id).state == FAILED
    assert SecurityEvent.get(SecurityEvent.event == "webhook.disabled").detail.startswith(endpoint.url)
    auth.issue_key(user, "Unheard", "production")
    assert WebhookMessage.select().where(WebhookMessage.event == "key.created").count() == 0


def test_a_claimed_message_is_not_claimed_again_until_its_lease_ends(app, hook):
    endpoints.send_test(hook[0])
    [first] = delivery.claim(db.obj, 10)
    assert delivery.claim(db.obj, 10) == []
    later = utcnow() + datetime.timedelta(seconds=delivery.LEASE_SECONDS + 1)
    [again] = delivery.claim(db.obj, 10, now=later)
    assert (again.message_id, again.number) == (first.message_id, 2)


def test_a_claim_takes_one_message_an_endpoint_and_none_of_an_endpoint_in_flight(app, user, receiver):
    silent, _ = endpoints.add_endpoint(user, f"{receiver.url}/silent")
    healthy, _ = endpoints.add_endpoint(user, f"{receiver.url}/healthy")
    backlog = [outbox.write_test(silent) for _ in range(3)]
    later = outbox.write_test(healthy)
    assert sorted(message.pk for message in delivery.claim(db.obj, 2)) == [backlog[0].id, later.id]
    assert delivery.claim(db.obj, 10, busy={silent.id}) == []
    assert [message.pk for message in delivery.claim(db.obj, 10)] == [backlog[1].id]


def test_a_failing_endpoint_gets_one_message_at_a_time_and_its_backlog_waits(app, hook, receiver):
    receiver.answer = lambda delivery: 500
    messages = [outbox.write_test(hook[0]) for _ in range(3)]
    [(probe, _, state)] = deliver(app)
    assert state == PENDING and len(receiver.received()) == 1 and probe.pk == messages[0].id
    waits = {message.next_attempt_at for message in WebhookMessage.select()}
    assert len(waits) == 1 and waits.pop() > utcnow()
    assert [message.attempts for message in WebhookMessage.select().order_by(WebhookMessage.id)] == [1, 0, 0]
    receiver.answer = lambda delivery: 204
    WebhookMessage.update(next_attempt_at=utcnow()).execute()
    assert [state for *_, state in deliver(app)] == [DELIVERED] * 3


def test_lookups_under_gevent_are_bounded_so_slow_names_leave_the_worker_resolver_threads():
    """Twelve attempts cut while their names take 10 s to resolve: a lookup of the worker's own
    (its database host, say) still finds a resolver thread at once (well under those 10 s, with a
    margin for a loaded machine)."""
    script = """
from gevent import monkey; monkey.patch_all()
import os, socket, time, gevent
from webhooks import addresses
hub, real = gevent.get_hub(), socket.getaddrinfo
sleep = monkey.get_original("time", "sleep")
def slow(host, port, *args, **kwargs):
    if host == "slow.example.test":
        return hub.threadpool.apply(lambda: sleep(10) or [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.216.34", port))])
    return real(host, port, *args, **kwargs)
socket.getaddrinfo = slow
def cut_attempt():
    with gevent.Timeout(0.2, False):
        addresses.resolve("slow.example.test", 443)
attempts = [gevent.spawn(cut_attempt) for _ in range(12)]
gevent.joinall(attempts)
started = time.monotonic()
socket.getaddrinfo("127.0.0.1", 80)
print(round(time.monotonic() - started, 2), flush=True)
os._exit(0)  # without waiting for the slow lookups' threads
"""
    waited = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True,
                            cwd=pathlib.Path(__file__).parents[3])
    assert float(waited.stdout) < 3, waited.stdout


def test_the_deadline_holds_without_gevent_against_a_receiver_that_dribbles(app, user):
    """The CLI is not patched by gevent: a byte every 0.2 s (for 30 s) must not keep an attempt past
    its deadline (1 s, and a margin for a loaded machine)."""
    listener = socket.create_server(("127.0.0.1", 0))

    def dribble():
        connection, _ = listener.accept()
        with connection, contextlib.suppress(OSError):  # the attempt, cut, closes its end
            connection.recv(65536)
            connection.sendall(b"HTTP/1.1 200 OK\r\n")
            for _ in range(150):
                connection.sendall(b"X")
                time.sleep(0.2)

    threading.Thread(target=dribble, daemon=True).start()
    endpoint, _ = endpoints.add_endpoint(user, f"http://127.0.0.1:{listener.getsockname()[1]}/slow")
    endpoints.send_test(endpoint)
    [claimed] = delivery.claim(db.obj, 1)
    started = time.monotonic()
    outcome = delivery.send(claimed, True, deadline=1)
    assert outcome == (None, "No answer within 1 s.", outcome.duration_ms)
    assert time.monotonic() - started < 1 + 5
    listener.close()


def test_a_stop_gives_back_only_a_message_still_pending(app, hook, receiver):
    """The stop cuts an attempt that has just been recorded delivered: it is not sent again."""
    endpoints.send_test(hook[0])
    [claimed] = delivery.claim(db.obj, 1)
    assert delivery.attempt(app, claimed)[1] == DELIVERED
    delivery.release_claims([claimed])
    stored = WebhookMessage.get()
    assert (stored.state, stored.next_attempt_at, stored.attempts) == (DELIVERED, None, 1)
    assert deliver(app) == [] and len(receiver.received()) == 1


def test_a_message_in_flight_when_its_endpoint_is_disabled_is_not_tried_again(app, hook, receiver):
    receiver.answer = lambda delivery: 500
    endpoints.send_test(hook[0])
    [claimed] = delivery.claim(db.obj, 1)
    # Another process disables the endpoint meanwhile, failing its waiting messages (this one too).
    WebhookEndpoint.update(disabled_at=utcnow()).execute()
    WebhookMessage.update(state=FAILED, next_attempt_at=None).execute()
    assert delivery.attempt(app, claimed)[1] == FAILED
    stored = WebhookMessage.get()
    assert (stored.state, stored.next_attempt_at) == (FAILED, None)
    assert [attempt.status for attempt in endpoints.recent_attempts(hook[0])] == [500]


# Where webhooks may go

@pytest.mark.parametrize("address", REFUSED + REFUSED_BY_NAME)
def test_addresses_that_are_not_public_are_refused(address):
    assert not addresses.is_public(address)


@pytest.mark.parametrize("address", PUBLIC)
def test_public_addresses_are_allowed(address):
    assert addresses.is_public(address)


@pytest.mark.parametrize("url", ["http://127.0.0.1/", "http://10.0.0.1/hook", "http://169.254.169.254/latest",
                                 "http://[::ffff:127.0.0.1]:8080/", "http://0.0.0.0/", "http://[::1]/",
                                 "http://localhost/", "https://192.168.0.10/"])
def test_a_private_url_is_refused_at_registration(app, user, url):
    app.config["WEBHOOK_ALLOW_PRIVATE"] = False
    with pytest.raises(addresses.RefusedAddress, match="WEBHOOK_ALLOW_PRIVATE"):
        endpoints.add_endpoint(user, url)
    app.config["WEBHOOK_ALLOW_PRIVATE"] = True
    endpoints.add_endpoint(user, url)


@pytest.mark.parametrize("url", ["ftp://example.com/", "example.com/hook", "http://user:pw@example.com/",
                                 "http:///path", "http://example.com:99999/", "javascript:alert(1)",
                                 "http://exa mple.com/", "http://example.com/\x00", "http://93.184.216.34:0/"])
def test_urls_that_are_not_http_are_refused(app, user, url):
    with pytest.raises(ValueError):
        endpoints.add_endpoint(user, url)


def test_a_path_and_query_that_are_not_ascii_are_percent_encoded_when_the_endpoint_is_added(app, user, receiver):
    endpoint, secret = endpoints.add_endpoint(user, f"{receiver.url}/réception/%41?für=größe&ok=1")
    assert endpoint.url == f"{receiver.url}/r%C3%A9ception/%41?f%C3%BCr=gr%C3%B6%C3%9Fe&ok=1"
    receiver.secrets["/r%C3%A9ception/%41?f%C3%BCr=gr%C3%B6%C3%9Fe&ok=1"] = secret
    endpoints.send_test(endpoint)
    [(_, outcome, state)] = deliver(app)
    assert (outcome.status, state) == (204, DELIVERED)


@pytest.fixture
def resolver(monkeypatch):
    """answers: the address each test host name resolves to; getaddrinfo resolves every other name."""
    real, answers = socket.getaddrinfo, {}

    def fake(host, port, *args, **kwargs):
        if host not in answers:
            return real(host, port, *args, **kwargs)
        if ":" in answers[host]:
            return [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", (answers[host], port, 0, 0))]
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (answers[host], port))]

    monkeypatch.setattr(socket, "getaddrinfo", fake)
    return answers


def test_a_name_that_resolves_to_a_private_address_at_delivery_is_refused(app, user, resolver):
    """DNS rebinding: a public address when the endpoint is added, loopback when a delivery connects."""
    app.config["WEBHOOK_ALLOW_PRIVATE"] = False
    resolver["hooks.example.test"] = "93.184.216.34"
    endpoint, _ = endpoints.add_endpoint(user, "http://hooks.example.test/in")
    resolver["hooks.example.test"] = "127.0.0.1"
    endpoints.send_test(endpoint)
    [(_, outcome, state)] = deliver(app)
    assert outcome.status is None and "hooks.example.test (127.0.0.1)" in outcome.error and state == PENDING


@pytest.mark.parametrize("address", REFUSED_BY_NAME)
def test_site_local_documentation_and_protocol_addresses_are_refused_when_added(app, user, resolver, address):
    app.config["WEBHOOK_ALLOW_PRIVATE"] = False
    resolver["hooks.example.test"] = address
    literal = f"[{address}]" if ":" in address else address
    for url in ["http://hooks.example.test/in", f"http://{literal}/in"]:
        with pytest.raises(addresses.RefusedAddress, match=f"Webhooks are not sent to .*{re.escape(address)}"):
            endpoints.add_endpoint(user, url)
    assert WebhookEndpoint.select().count() == 0


@pytest.mark.parametrize("address", REFUSED_BY_NAME)
def test_site_local_documentation_and_protocol_addresses_are_refused_at_connection(app, user, resolver, address):
    app.config["WEBHOOK_ALLOW_PRIVATE"] = False
    resolver["hooks.example.test"] = "93.184.216.34"
    endpoint, _ = endpoints.add_endpoint(user, "http://hooks.example.test/in")
    resolver["hooks.example.test"] = address
    endpoints.send_test(endpoint)
    [(_, outcome, state)] = deliver(app)
    assert outcome.status is None and f"hooks.example.test ({address})" in outcome.error and state == PENDING


def test_localhost_is_refused_when_a_delivery_connects(app, user, receiver):
    endpoint, _ = endpoints.add_endpoint(user, receiver.url.replace("127.0.0.1", "localhost") + "/local")
    app.config["WEBHOOK_ALLOW_PRIVATE"] = False
    endpoints.send_test(endpoint)
    [(_, outcome, _)] = deliver(app)
    assert outcome.status is None and "not sent to localhost" in outcome.error
    assert receiver.received() == []


# Settings

def test_the_retry_schedule_parses_durations():
    assert settings.retry_schedule(settings.DEFAULT_RETRY_SCHEDULE) == [5, 300, 1800, 7200, 18000, 36000, 36000]
    assert settings.retry_schedule(" 1s, 2m,3h ,1d") == [1, 120, 10800, 86400]


@pytest.mark.parametrize("text", ["", "5", "0s", "1x", "1s,,2s", "-1s", ",".join(["1s"] * 21)])
def test_a_bad_retry_schedule_is_one_sentence(text):
    with pytest.raises(settings.ConfigError, match="WEBHOOK_RETRY_SCHEDULE must be"):
        settings.retry_schedule(text)


def test_allow_private_is_a_switch():
    assert settings.switch({"WEBHOOK_ALLOW_PRIVATE": "1"}, "WEBHOOK_ALLOW_PRIVATE") is True
    assert settings.switch({}, "WEBHOOK_ALLOW_PRIVATE") is False
    with pytest.raises(settings.ConfigError, match="WEBHOOK_ALLOW_PRIVATE must be 1 or 0"):
        settings.switch({"WEBHOOK_ALLOW_PRIVATE": "maybe"}, "WEBHOOK_ALLOW_PRIVATE")


# Command line

def test_the_cli_adds_lists_tests_and_removes_endpoints(app, runner, user, receiver):
    added = runner.invoke(args=["webhooks", "add", "alice", f"{receiver.url}/cli", "--events",
                                "key.revoked,key.created"])
    assert added.exit_code == 0, added.output
    secret = added.output.strip().splitlines()[-1]
    assert re.fullmatch(r"whsec_[A-Za-z0-9+/]{32}", secret)
    receiver.secrets["/cli"] = secret
    endpoint = WebhookEndpoint.get()
    listed = runner.invoke(args=["webhooks", "list", "alice"])
    assert listed.output == f"{endpoint.id}\t{receiver.url}/cli\tkey.created,key.revoked\tactive\n"
    assert secret not in listed.output and secret[6:] not in listed.output
    tested = runner.invoke(args=["webhooks", "test", str(endpoint.id)])
    assert tested.exit_code == 0 and "Delivered msg_" in tested.output and "HTTP 204" in tested.output
    assert receiver.received()[0].verified["type"] == "webhook.test"
    removed = runner.invoke(args=["webhooks", "remove", str(endpoint.id)])
    assert removed.exit_code == 0 and WebhookEndpoint.select().count() == 0
    assert [event.event for event in SecurityEvent.select().order_by(SecurityEvent.id)][-2:] == [
        "webhook.added", "webhook.removed"]


def test_the_cli_subscribes_to_every_event_without_events_and_accepts_webhook_test(app, runner, user, receiver):
    for path, events, shown in [("/all", [], "*"), ("/star", ["--events", "*"], "*"),
                                ("/tests", ["--events", "webhook.test"], "webhook.test")]:
        added = runner.invoke(args=["webhooks", "add", "alice", f"{receiver.url}{path}", *events])
        assert added.exit_code == 0 and f"{receiver.url}{path} ({shown}). Its signing" in added.output, added.output
        receiver.secrets[path] = added.output.strip().splitlines()[-1]
    everything, star, tests_only = endpoints.owned(user)
    added = SecurityEvent.select().where(SecurityEvent.event == "webhook.added").order_by(SecurityEvent.id)
    assert [event.detail for event in added] == [
        f"{receiver.url}/all (id {everything.id}; all events)", f"{receiver.url}/star (id {star.id}; all events)",
        f"{receiver.url}/tests (id {tests_only.id}; webhook.test)"]
    assert runner.invoke(args=["webhooks", "list", "alice"]).output == (
        f"{everything.id}\t{receiver.url}/all\t*\tactive\n{star.id}\t{receiver.url}/star\t*\tactive\n"
        f"{tests_only.id}\t{receiver.url}/tests\twebhook.test\tactive\n")
    auth.issue_key(user, "Laptop", "production")
    assert sorted(message.endpoint_id for message in WebhookMessage.select()) == [everything.id, star.id]
    tested = runner.invoke(args=["webhooks", "test", str(tests_only.id)])
    assert tested.exit_code == 0 and "Delivered msg_" in tested.output, tested.output
    assert [delivery.verified["type"] for delivery in receiver.received("/tests")] == ["webhook.test"]


def test_the_cli_says_why_it_refuses(app, runner, user):
    app.config["WEBHOOK_ALLOW_PRIVATE"] = False
    for args, sentence in [
        (["webhooks", "add", "alice", "http://127.0.0.1/"], "Webhooks are not sent to 127.0.0.1"),
        (["webhooks", "add", "alice", "https://93.184.216.34/", "--events", "key.exploded"], "Unknown event"),
        (["webhooks", "add", "nobody", "https://93.184.216.34/"], "There is no user named 'nobody'"),
        (["webhooks", "remove", "999"], "There is no webhook endpoint with id 999"),
        (["webhooks", "test", "999"], "There is no webhook endpoint with id 999"),
    ]:
        result = runner.invoke(args=args)
        assert result.exit_code == 1 and sentence in result.output, result.output


def test_the_cli_test_of_a_failing_endpoint_exits_1_and_leaves_it_to_the_schedule(app, runner, user, receiver):
    receiver.answer = lambda delivery: 500
    endpoint, _ = endpoints.add_endpoint(user, f"{receiver.url}/down")
    result = runner.invoke(args=["webhooks", "test", str(endpoint.id)])
    assert result.exit_code == 1 and "not delivered: HTTP 500" in result.output
    assert WebhookMessage.get().state == PENDING


def test_an_account_has_at_most_ten_endpoints(app, user, receiver):
    for n in range(endpoints.MAX_ENDPOINTS):
        endpoints.add_endpoint(user, f"{receiver.url}/{n}")
    with pytest.raises(endpoints.EndpointCapReached, match="10 webhook endpoints"):
        endpoints.add_endpoint(user, f"{receiver.url}/eleven")


# The Security tab

def test_the_security_tab_adds_an_endpoint_and_shows_its_secret_once(app, logged_in, receiver):
    response = logged_in.post("/settings/security/webhooks", data={
        "url": f"{receiver.url}/web", "events_shown": "1", "events": ["key.created", "usage.threshold"]})
    assert response.status_code == 302 and response.location.endswith("/settings/security#webhooks")
    page = logged_in.get("/settings/security").text
    secret = re.search(r'id="webhook-secret"[^>]*>(whsec_[^<]+)<', page)[1]
    assert signing.unseal(WebhookEndpoint.get().sealed_secret) == secret
    assert "key.created, usage.threshold" in page
    again = logged_in.get("/settings/security").text
    assert secret not in again and secret[6:] not in again and "webhook-secret" not in again


def sent_as_shown(page, action):
    """The fields a browser sends from the page's form with this action, left as shown: its hidden
    inputs, and the radio buttons and boxes the page checks."""
    fields, within = [], []

    class Form(html.parser.HTMLParser):
        def handle_starttag(self, tag, attrs):
            attrs = dict(attrs)
            if tag == "form":
                within[:] = [attrs.get("action") == action]
            elif tag == "input" and any(within) and (attrs.get("type") == "hidden" or "checked" in attrs):
                fields.append((attrs["name"], attrs["value"]))

        def handle_endtag(self, tag):
            if tag == "form":
                within.clear()

    Form().feed(page)
    return fields


def test_the_security_tab_form_subscribes_to_all_events_unless_events_are_chosen(app, logged_in, receiver):
    page = logged_in.get("/settings/security").text
    assert re.search(r'<label[^>]*><input type="radio" name="subscribe" value="all" checked> All events', page)
    fields = sent_as_shown(page, "/settings/security/webhooks")
    assert [name for name, _ in fields] == ["csrf_token", "events_shown", "subscribe"]
    response = logged_in.post("/settings/security/webhooks", data=MultiDict([*fields, ("url", f"{receiver.url}/a")]))
    assert response.status_code == 302 and WebhookEndpoint.get().events == "*"
    assert "Events: all, including those added later" in logged_in.get("/settings/security").text

    chosen = {"url": f"{receiver.url}/b", "events_shown": "1", "subscribe": "chosen"}
    response = logged_in.post("/settings/security/webhooks", data=chosen)
    assert response.status_code == 400 and "Choose at least one event." in response.text
    assert re.search(r'value="chosen" checked', response.text) and f'value="{receiver.url}/b"' in response.text
    response = logged_in.post("/settings/security/webhooks", data={**chosen, "subscribe": "some"})
    assert response.status_code == 400 and "Choose All events or Chosen events." in response.text
    response = logged_in.post("/settings/security/webhooks", data={**chosen, "events": ["key.revoked", "key.created"]})
    assert response.status_code == 302
    assert [endpoint.events for endpoint in WebhookEndpoint.select().order_by(WebhookEndpoint.id)] == [
        "*", "key.created,key.revoked"]
    assert "Events: key.created, key.revoked" in logged_in.get("/settings/security").text


def test_the_security_tab_sends_a_test_event_and_lists_the_attempt(app, logged_in, user, receiver):
    endpoint, secret = endpoints.add_endpoint(user, f"{receiver.url}/web")
    receiver.secrets["/web"] = secret
    response = logged_in.post(f"/settings/security/webhooks/{endpoint.id}/test")
    assert response.status_code == 302
    assert logged_in.post(f"/settings/security/webhooks/{endpoint.id}/test").status_code == 409  # one at a time
    deliver(app)
    assert receiver.received()[0].verified["type"] == "webhook.test"
    page = logged_in.get("/settings/security").text
    assert re.search(r'<tr class="attempt">.*webhook\.test.*HTTP 204.*ms.*>1<', page, re.S)
    assert secret not in page and secret[6:] not in page


def test_the_security_tab_refuses_with_a_sentence(app, logged_in):
    app.config["WEBHOOK_ALLOW_PRIVATE"] = False
    response = logged_in.post("/settings/security/webhooks", data={"url": "http://10.0.0.7/", "events_shown": "1",
                                                                   "events": ["key.created"]})
    assert response.status_code == 400 and "Webhooks are not sent to 10.0.0.7" in response.text
    response = logged_in.post("/settings/security/webhooks", data={"url": "https://93.184.216.34/",
                                                                   "events_shown": "1"})
    assert response.status_code == 400 and "Choose at least one event." in response.text
    assert WebhookEndpoint.select().count() == 0


def test_another_accounts_endpoint_is_a_404(app, logged_in, receiver):
    bob = users.create_user("bob", "bob@example.com", "correct horse battery")
    endpoint, _ = endpoints.add_endpoint(bob, f"{receiver.url}/bob")
    assert logged_in.post(f"/settings/security/webhooks/{endpoint.id}/test").status_code == 404
    assert logged_in.post(f"/settings/security/webhooks/{endpoint.id}/remove").status_code == 404
    assert WebhookEndpoint.select().count() == 1


def test_removing_an_endpoint_drops_its_messages(app, logged_in, user, receiver):
    endpoint, _ = endpoints.add_endpoint(user, f"{receiver.url}/web")
    endpoints.send_test(endpoint)
    assert logged_in.post(f"/settings/security/webhooks/{endpoint.id}/remove").status_code == 302
    assert WebhookMessage.select().count() == 0 and deliver(app) == []
    assert SecurityEvent.select().where(SecurityEvent.event == "webhook.removed").count() == 1


def test_the_webhook_forms_need_the_csrf_token(app, logged_in, user, receiver):
    app.config["WTF_CSRF_ENABLED"] = True
    endpoint, _ = endpoints.add_endpoint(user, f"{receiver.url}/web")
    for path in ["/settings/security/webhooks", f"/settings/security/webhooks/{endpoint.id}/test",
                 f"/settings/security/webhooks/{endpoint.id}/remove"]:
        assert logged_in.post(path, data={"url": f"{receiver.url}/x"}).status_code == 400
    assert WebhookEndpoint.select().count() == 1 and WebhookMessage.select().count() == 0
