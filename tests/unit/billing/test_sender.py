"""The billing sender against receivers that hold each vendor to its own published description
(tests/support/billingvendors.py): what goes out is exactly the closed hours, in each target's
form; failures are retried on the schedule and given up after it; a 429 waits without spending an
attempt; an event the system took before is accepted, not sent twice; Stripe gets one call at a
time per customer and meter. On SQLite and PostgreSQL."""

import collections
import datetime
import http.server
import threading

import pytest
from billingreceiver import VendorReceiver
from prometheus_client import REGISTRY

from billing import closing, sender, targets
from billing.models import FAILED, PENDING, SENT, BillingEvent
from models import utcnow
from orgs import keyactions
from tests.unit.billing.conftest import HOUR, exported_since, write_usage

ONE_HOUR = datetime.timedelta(hours=1)
TARGETS = ["stripe", "lago", "openmeter", "cloudevents"]


@pytest.fixture
def receiver(billing_app):
    with VendorReceiver(billing_app.config["BILLING_EXPORT"]) as receiver:
        billing_app.config["BILLING_URL"] = receiver.url
        yield receiver
    assert receiver.invalid == []


def closed(app, org, keys, hours=2):
    """Usage in `hours` hours for each key, closed: {(key id, meter, hour): value}."""
    exported_since(org, HOUR)
    expected = {}
    for offset in range(hours):
        hour = HOUR + offset * ONE_HOUR
        for index, key in enumerate(keys):
            write_usage(key, hour, requests=3 + index + offset, credits=index + offset)
            write_usage(key, hour, status=429, requests=7)
            expected[key.id, "api_requests", hour] = 3 + index + offset
            if index + offset:
                expected[key.id, "api_credits", hour] = index + offset
    closing.close(app.config, now=HOUR + hours * ONE_HOUR + datetime.timedelta(minutes=2))
    return expected


def arrived(receiver):
    """What the receiver took: {(key id, meter, hour): value}."""
    return {(int(event["key_id"]), event["meter"], event["time"].replace(tzinfo=None)): event["value"]
            for event in receiver.accepted}


def make_due():
    """As if every wait of the pending events had passed."""
    BillingEvent.update(next_attempt_at=utcnow() - datetime.timedelta(seconds=1), sending_until=None).where(
        BillingEvent.state == PENDING).execute()


def states():
    return collections.Counter(state for state, in BillingEvent.select(BillingEvent.state).tuples())


@pytest.mark.parametrize("billing_app", TARGETS, indirect=True)
def test_each_target_gets_the_closed_hours_exactly_once(billing_app, org, two_keys, receiver):
    expected = closed(billing_app, org, two_keys)
    sent_before = REGISTRY.get_sample_value("billing_events_sent_total") or 0
    sender.send_due(billing_app)
    assert states() == {SENT: BillingEvent.select().count()}
    if billing_app.config["BILLING_EXPORT"] == "stripe":
        by_org = collections.Counter()
        for (_, meter, hour), value in expected.items():
            by_org[meter, hour] += value
        assert {(event["meter"], event["time"].replace(tzinfo=None)): event["value"]
                for event in receiver.accepted} == by_org
        assert {event["id"] for event in receiver.accepted} == {
            f"{org.id}-{meter}-{hour:%Y%m%d%H}" for meter, hour in by_org}
    else:
        assert arrived(receiver) == expected
        assert {event["id"] for event in receiver.accepted} == {
            f"{key_id}-{meter}-{hour:%Y%m%d%H}" for key_id, meter, hour in expected}
        assert {(event["org"], event["customer"]) for event in receiver.accepted} == {(org.slug, "cus_test")}
    assert len(receiver.accepted) == BillingEvent.select().count()
    assert REGISTRY.get_sample_value("billing_events_sent_total") - sent_before == len(receiver.accepted)
    assert all(request.headers["authorization"] == "Bearer test-billing-token" for request in receiver.requests)
    closing.close(billing_app.config, now=HOUR + 2 * ONE_HOUR + datetime.timedelta(minutes=9))
    assert sender.send_due(billing_app) == []


@pytest.mark.parametrize("billing_app", ["lago", "openmeter", "cloudevents"], indirect=True)
def test_events_go_in_calls_of_at_most_100(billing_app, org, owner, receiver):
    keys = [keyactions.issue_key(owner, f"k{n}", "development")[0] for n in range(15)]
    closed(billing_app, org, keys, hours=4)
    total = BillingEvent.select().count()
    assert total > 100
    sender.send_due(billing_app)
    assert len(receiver.accepted) == total
    assert len(receiver.requests) == -(-total // 100)


@pytest.mark.parametrize("billing_app", ["cloudevents"], indirect=True)
def test_a_failure_is_retried_on_the_schedule_then_given_up_and_logged(billing_app, org, two_keys, receiver, caplog):
    closed(billing_app, org, two_keys, hours=1)
    receiver.fail(3, 500)
    before = utcnow()
    [(rows, state)] = sender.send_due(billing_app)
    row = BillingEvent.get_by_id(rows[0].id)
    assert (state, row.attempts, row.error) == (PENDING, 1, row.error)
    assert row.error.startswith("500: ")
    assert before + datetime.timedelta(seconds=59) < row.next_attempt_at <= utcnow() + datetime.timedelta(minutes=1)
    make_due()
    assert [state for _, state in sender.send_due(billing_app)] == [PENDING]
    make_due()
    failed_before = REGISTRY.get_sample_value("billing_events_failed_total") or 0
    assert [state for _, state in sender.send_due(billing_app)] == [FAILED]
    assert states() == {FAILED: len(rows)}
    assert REGISTRY.get_sample_value("billing_events_failed_total") - failed_before == len(rows)
    assert "Gave up sending 3 billing events" in caplog.text and "after their attempts: 500: " in caplog.text
    assert "test-billing-token" not in caplog.text
    assert receiver.accepted == []


@pytest.mark.parametrize("billing_app", ["lago", "stripe"], indirect=True)
@pytest.mark.parametrize("how", ["close", ("slow", 3)])
def test_no_answer_is_a_failed_attempt(billing_app, org, two_keys, receiver, how, monkeypatch):
    closed(billing_app, org, two_keys, hours=1)
    receiver.fail(5, how)
    monkeypatch.setattr(targets, "TIMEOUT_SECONDS", 1)
    sender.send_due(billing_app, calls=1)
    rows = list(BillingEvent.select().where(BillingEvent.attempts == 1))
    assert rows and all(row.state == PENDING and row.error.startswith("No answer") for row in rows)


@pytest.mark.parametrize("billing_app", ["openmeter", "cloudevents"], indirect=True)
def test_a_429_waits_its_retry_after_and_spends_no_attempt(billing_app, org, two_keys, receiver):
    closed(billing_app, org, two_keys, hours=1)
    receiver.fail(1, ("429", 7))
    sender.send_due(billing_app)
    rows = list(BillingEvent.select())  # one call: every event of it
    assert {(row.state, row.attempts) for row in rows} == {(PENDING, 0)}
    soon = utcnow() + datetime.timedelta(seconds=5)
    assert all(soon < row.next_attempt_at <= soon + datetime.timedelta(seconds=2) for row in rows)


@pytest.mark.parametrize("billing_app", ["stripe"], indirect=True)
def test_stripe_s_429_without_a_wait_backs_off_1_then_2_seconds(billing_app, org, two_keys, receiver):
    closed(billing_app, org, two_keys, hours=1)
    receiver.fail(2, ("429", 30))
    system = targets.BillingSystem(billing_app.config)
    schedule = billing_app.extensions["billing"]
    waits = []
    for _ in range(2):
        [rows] = sender.claim("stripe", 1)
        start = utcnow()
        sender.attempt(system, schedule, rows)
        row = BillingEvent.get_by_id(rows[0].id)
        waits.append(round((row.next_attempt_at - start).total_seconds()))
        assert (row.state, row.attempts) == (PENDING, 0)
        make_due()
    assert waits == [1, 2]
    sender.send_due(billing_app)
    assert states() == {SENT: 2}


@pytest.mark.parametrize("billing_app", TARGETS, indirect=True)
def test_an_event_the_system_took_before_is_sent_and_not_counted_twice(billing_app, org, two_keys, receiver):
    """A process that crashed after its call and before recording it: the events come round again."""
    closed(billing_app, org, two_keys, hours=1)
    sender.send_due(billing_app)
    accepted = list(receiver.accepted)
    BillingEvent.update(state=PENDING, attempts=0, next_attempt_at=utcnow(), sent_at=None).execute()
    sender.send_due(billing_app)
    assert states() == {SENT: len(accepted)}
    assert receiver.accepted == accepted
    assert len(receiver.duplicates) == len(accepted)


@pytest.mark.parametrize("billing_app", ["lago"], indirect=True)
def test_lago_s_refusal_of_a_batch_for_one_stored_event_sends_the_others_at_once(billing_app, org, two_keys,
                                                                                 receiver):
    closed(billing_app, org, two_keys, hours=1)
    first = BillingEvent.select().order_by(BillingEvent.id).first()
    BillingEvent.update(next_attempt_at=utcnow() + ONE_HOUR).where(BillingEvent.id != first.id).execute()
    sender.send_due(billing_app)
    make_due()
    BillingEvent.update(state=PENDING, attempts=0, next_attempt_at=utcnow()).where(
        BillingEvent.id == first.id).execute()
    sender.send_due(billing_app)  # the others are due again at once, and sent
    assert states() == {SENT: BillingEvent.select().count()}
    assert len(receiver.accepted) == BillingEvent.select().count()
    assert [request.answer for request in receiver.requests] == [200, 422, 200]


@pytest.mark.parametrize("billing_app", ["stripe"], indirect=True)
def test_stripe_gets_one_call_at_a_time_per_customer_and_meter(billing_app, org, two_keys, receiver):
    closed(billing_app, org, two_keys, hours=3)
    claimed = sender.claim("stripe", 10)
    assert sorted(rows[0].meter for rows in claimed) == ["api_credits", "api_requests"]
    assert sender.claim("stripe", 10) == []  # each pair has a call under way
    system, schedule = targets.BillingSystem(billing_app.config), billing_app.extensions["billing"]
    sender.attempt(system, schedule, claimed[0])
    [again] = sender.claim("stripe", 10)
    assert again[0].meter == claimed[0][0].meter and again[0].hour > claimed[0][0].hour
    sender.attempt(system, schedule, claimed[1])
    sender.attempt(system, schedule, again)
    sender.send_due(billing_app)
    assert states() == {SENT: 6}
    assert receiver.concurrent_max(("cus_test", "api_requests")) == 1


@pytest.mark.parametrize("billing_app", ["stripe"], indirect=True)
def test_stripe_s_hours_older_than_35_days_fail_with_that_reason_unsent(billing_app, org, two_keys, receiver):
    old = HOUR - datetime.timedelta(days=36)
    exported_since(org, old)
    write_usage(two_keys[0], old, requests=2)
    closing.close(billing_app.config, now=old + 2 * ONE_HOUR)
    sender.send_due(billing_app)
    [row] = BillingEvent.select()
    assert (row.state, row.error) == (FAILED, targets.TOO_OLD)
    assert receiver.requests == []


@pytest.mark.parametrize("billing_app", ["cloudevents"], indirect=True)
def test_each_event_of_a_call_is_given_up_on_its_own_attempts(billing_app, org, two_keys, receiver):
    """An event on its last attempt, batched with fresh ones: only it is given up."""
    closed(billing_app, org, two_keys, hours=1)
    worn, *fresh = BillingEvent.select().order_by(BillingEvent.id)
    BillingEvent.update(attempts=2).where(BillingEvent.id == worn.id).execute()
    receiver.fail(1, 500)
    sender.send_due(billing_app)
    assert BillingEvent.get_by_id(worn.id).state == FAILED
    assert {(row.state, row.attempts) for row in BillingEvent.select().where(BillingEvent.id != worn.id)} == {
        (PENDING, 1)}


@pytest.mark.parametrize("billing_app", ["stripe"], indirect=True)
def test_stripe_s_event_tried_before_is_not_sent_again_past_a_day(billing_app, org, two_keys, receiver):
    """Stripe refuses a reused identifier for 24 hours only: past that, a second send of an event
    whose first one may have been counted would be counted twice."""
    closed(billing_app, org, two_keys, hours=1)
    BillingEvent.update(attempts=1, created_at=utcnow() - datetime.timedelta(hours=23, minutes=1)).execute()
    sender.send_due(billing_app)
    assert {(row.state, row.error) for row in BillingEvent.select()} == {(FAILED, targets.PAST_STRIPE_MEMORY)}
    assert receiver.requests == []


@pytest.mark.parametrize("billing_app", ["openmeter"], indirect=True)
def test_a_429_pauses_the_process_s_calls_for_its_wait(billing_app, org, two_keys, receiver):
    closed(billing_app, org, two_keys, hours=1)
    receiver.fail(1, ("429", 3))
    system = targets.BillingSystem(billing_app.config)
    [rows] = sender.claim("openmeter", 1)
    sender.attempt(system, billing_app.extensions["billing"], rows)
    assert system.paused()


@pytest.mark.parametrize("billing_app", ["stripe"], indirect=True)
def test_stripe_s_answer_is_read_only_to_its_bound(billing_app, org, two_keys):
    """A BILLING_URL that answers without end costs a worker 64 KiB, not its memory."""

    written = []

    class Endless(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(500)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            try:
                self.wfile.write(b'{"error": {"type": "api_error", "message": "')
                for _ in range(256):  # 256 MiB, unless the client hangs up first
                    self.wfile.write(b"x" * 2**20)
                    written.append(1)
            except OSError:
                pass

        def log_message(self, *args):
            pass

    closed(billing_app, org, two_keys, hours=1)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Endless)
    thread = threading.Thread(target=server.serve_forever)
    thread.start()
    try:
        billing_app.config["BILLING_URL"] = f"http://127.0.0.1:{server.server_address[1]}"
        [rows] = sender.claim("stripe", 1)
        outcome = targets.BillingSystem(billing_app.config).send(rows, utcnow())
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    assert not outcome.accepted and len(outcome.error) <= targets.ERROR_CHARACTERS
    assert len(written) < 16  # the client stopped reading at its bound and hung up


def test_an_answer_s_control_characters_never_reach_the_outbox_or_the_log():
    outcome = targets.outcome_of(502, None, "bad\x00gateway\x1b[31m\r\nX-Injected: 1")
    assert outcome.error == "502: bad gateway [31m X-Injected: 1"


def test_lago_s_refusal_naming_an_event_outside_the_batch_is_a_failed_attempt():
    answer = '{"code": "validation_errors", "error_details": {"7": {"transaction_id": ["value_already_exist"]}}}'
    outcome = targets.lago_outcome((422, None, answer), 2)
    assert (outcome.already, outcome.wait) == (frozenset(), None)


@pytest.mark.parametrize("billing_app", ["cloudevents"], indirect=True)
def test_events_are_kept_as_long_as_the_hourly_usage_rows(billing_app, org, two_keys):
    closed(billing_app, org, two_keys, hours=1)
    BillingEvent.update(state=SENT).execute()
    total = BillingEvent.select().count()
    kept_for = datetime.timedelta(days=billing_app.config["USAGE_HOURLY_RETENTION_DAYS"])
    assert sender.forget_old(billing_app.config, now=HOUR + kept_for) == 0
    assert sender.forget_old(billing_app.config, now=HOUR + kept_for + ONE_HOUR) == total
