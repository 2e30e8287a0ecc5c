"""Resend, recover, rotate and the attempts list, through the CLI runner against a local receiver
that verifies every delivery with the `standardwebhooks` library, on SQLite and PostgreSQL."""

import datetime
import threading

import pytest
from webhookreceiver import verifies

from models import SecurityEvent, db, iso_seconds, utcnow
from webhooks import delivery, endpoints, outbox, recovery, signing
from webhooks.models import DELIVERED, FAILED, PENDING, WebhookEndpoint, WebhookMessage

SCHEDULE = "1s,1s"


@pytest.fixture
def app(make_app, database_url):
    app = make_app({
        "DATABASE_URL": database_url, "RATELIMIT_STORAGE_URL": "memory://", "PUBLIC_RATE_LIMIT": "off",
        "TESTING": True, "WEBHOOK_RETRY_SCHEDULE": SCHEDULE, "WEBHOOK_ALLOW_PRIVATE": True,
    })
    with app.app_context():
        yield app


def failed_message(app, hook, receiver):
    """A test event that failed for good: every attempt of the schedule answered 503."""
    receiver.answer = lambda sent: 503
    message = endpoints.send_test(hook)
    for _ in range(len(SCHEDULE.split(",")) + 1):
        WebhookMessage.update(next_attempt_at=utcnow()).where(
            (WebhookMessage.id == message.id) & (WebhookMessage.state == PENDING)).execute()
        delivery.deliver_due(app)
    assert WebhookMessage.get_by_id(message.id).state == FAILED
    receiver.answer = lambda sent: 204
    return WebhookMessage.get_by_id(message.id)


def delivered_message(app, hook):
    message = endpoints.send_test(hook)
    delivery.deliver_due(app)
    assert WebhookMessage.get_by_id(message.id).state == DELIVERED
    return WebhookMessage.get_by_id(message.id)


# The attempts list

def test_attempts_prints_the_last_attempts_newest_first_one_a_line(app, runner, hook, receiver):
    message = failed_message(app, hook, receiver)
    result = runner.invoke(args=["webhooks", "attempts", str(hook.id)])
    assert result.exit_code == 0, result.output
    lines = [line.split("\t") for line in result.stdout.splitlines()]
    assert [(line[0], line[2], line[3], line[4]) for line in lines] == [
        (message.message_id, "webhook.test", "HTTP 503", number) for number in ("3", "2", "1")]
    for line in lines:
        assert datetime.datetime.strptime(line[1], "%Y-%m-%dT%H:%M:%SZ")


def test_attempts_gives_an_error_text_for_an_attempt_without_an_answer_and_keeps_fifty(app, runner, user):
    endpoint, _ = endpoints.add_endpoint(user, "http://127.0.0.1:9/closed")
    endpoints.send_test(endpoint)
    delivery.deliver_due(app)
    [line] = runner.invoke(args=["webhooks", "attempts", str(endpoint.id)]).stdout.splitlines()
    assert line.split("\t")[3].startswith("Connection refused")
    for number in range(60):
        delivery.WebhookAttempt.create(endpoint=endpoint.id, message_id="msg_x", event="webhook.test", number=number,
                                       status=204, duration_ms=1)
    delivery.forget_old_attempts(endpoint.id)
    assert len(runner.invoke(args=["webhooks", "attempts", str(endpoint.id)]).stdout.splitlines()) == 50


def test_attempts_of_an_unknown_endpoint_is_one_line_and_exit_1(runner, app):
    result = runner.invoke(args=["webhooks", "attempts", "99"])
    assert (result.exit_code, result.stderr) == (1, "Error: There is no webhook endpoint with id 99.\n")


# Resend

@pytest.mark.parametrize("made_as", [delivered_message, failed_message])
def test_resend_sends_the_same_id_and_body_again_now_whatever_its_state(app, runner, hook, receiver, made_as):
    message = made_as(app, hook, receiver) if made_as is failed_message else made_as(app, hook)
    before = len(receiver.received())
    result = runner.invoke(args=["webhooks", "resend", message.message_id])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"Delivered {message.message_id}: HTTP 204 in ")
    [again] = receiver.received()[before:]
    assert (again.message_id, again.body, again.error) == (message.message_id, message.body.encode(), None)
    stored = WebhookMessage.get_by_id(message.id)
    assert (stored.state, stored.attempts) == (DELIVERED, message.attempts + 1)


def test_a_resend_that_fails_goes_on_with_the_schedule_from_where_its_attempts_stand(app, runner, hook, receiver):
    delivered = delivered_message(app, hook)
    failed = failed_message(app, hook, receiver)
    receiver.answer = lambda sent: 500
    for message, state in [(delivered, PENDING), (failed, FAILED)]:
        result = runner.invoke(args=["webhooks", "resend", message.message_id])
        assert result.exit_code == 1
        assert result.stderr.startswith(f"Error: {message.message_id} not delivered: HTTP 500 (")
        assert WebhookMessage.get_by_id(message.id).state == state


def test_the_eleventh_resend_within_a_minute_is_refused_with_one_line(app, runner, hook):
    message = delivered_message(app, hook)
    for _ in range(recovery.RESENDS_PER_MINUTE):
        assert runner.invoke(args=["webhooks", "resend", message.message_id]).exit_code == 0
    refused = runner.invoke(args=["webhooks", "resend", message.message_id])
    assert refused.exit_code == 1 and refused.stdout == ""
    assert refused.stderr.startswith("Error: This endpoint has had 10 resends in the last minute, the most it may; "
                                     "try again in ")
    assert len(refused.stderr.splitlines()) == 1
    # A minute on, resends are allowed again.
    later = utcnow() + datetime.timedelta(seconds=61)
    recovery.resend(WebhookMessage.get_by_id(message.id), now=later)


def test_the_allowance_is_per_endpoint(app, runner, user, hook):
    other, _ = endpoints.add_endpoint(user, hook.url.replace("/alice", "/other"))
    message = delivered_message(app, hook)
    for _ in range(recovery.RESENDS_PER_MINUTE):
        recovery.resend(WebhookMessage.get_by_id(message.id))
        WebhookMessage.update(state=DELIVERED, next_attempt_at=None).where(WebhookMessage.id == message.id).execute()
    with pytest.raises(recovery.ResendRefused):
        recovery.resend(WebhookMessage.get_by_id(message.id))
    test = endpoints.send_test(other)
    WebhookMessage.update(state=DELIVERED, next_attempt_at=None).where(WebhookMessage.id == test.id).execute()
    recovery.resend(test)


def test_resends_at_once_never_pass_the_allowance(app, hook):
    """Twenty threads each resending a message of the endpoint at once, each on its own connection:
    exactly ten get through."""
    outbox.write_messages([hook.id] * 20, "webhook.test", {}, utcnow())
    messages = list(WebhookMessage.select())
    WebhookMessage.update(state=DELIVERED, next_attempt_at=None).execute()
    start, outcomes = threading.Barrier(len(messages)), []

    def resend(message):
        with app.app_context():
            start.wait()
            try:
                with db.obj.connection_context():
                    recovery.resend(message)
                outcomes.append("resent")
            except recovery.ResendRefused as refused:
                outcomes.append(str(refused))

    threads = [threading.Thread(target=resend, args=(message,)) for message in messages]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert outcomes.count("resent") == recovery.RESENDS_PER_MINUTE, outcomes
    assert WebhookMessage.select().where(WebhookMessage.state == PENDING).count() == recovery.RESENDS_PER_MINUTE


def test_a_message_being_sent_is_not_resent_beside_its_attempt(app, runner, hook):
    message = endpoints.send_test(hook)
    [claimed] = delivery.claim(db.obj, 1)
    result = runner.invoke(args=["webhooks", "resend", message.message_id])
    assert result.exit_code == 1
    assert result.stderr == f"Error: {message.message_id} is being sent right now; see its attempt in a moment.\n"
    # Its attempt records as it would have, and then it may be resent.
    assert delivery.record(claimed, delivery.Outcome(204, None, 1), [1]) == DELIVERED
    assert runner.invoke(args=["webhooks", "resend", message.message_id]).exit_code == 0


def disabled_during_an_attempt(app, hook, receiver):
    """A message claimed for an attempt, and its endpoint disabled meanwhile by another message's
    failed attempt (which marks every waiting message failed): return the claim under way."""
    receiver.answer = lambda sent: 503
    message = endpoints.send_test(hook)
    [claimed] = delivery.claim(db.obj, 1)
    [other_id] = outbox.write_messages([hook.id], "webhook.test", {"endpoint_id": hook.id, "url": hook.url,
                                                                 "org": hook.org.slug}, utcnow())
    other = WebhookMessage.get(WebhookMessage.message_id == other_id)
    WebhookEndpoint.update(failing_since=utcnow() - datetime.timedelta(days=6)).execute()
    [other_claim] = delivery.claim(db.obj, 1, only=other.id)
    delivery.record(other_claim, delivery.Outcome(503, None, 1), [1])
    assert WebhookEndpoint.get_by_id(hook.id).disabled_at is not None
    assert WebhookMessage.get_by_id(message.id).state == FAILED
    return claimed


@pytest.mark.parametrize("command", ["resend", "recover"])
def test_a_message_failed_while_in_an_attempt_gets_no_second_attempt_beside_it(app, runner, hook, receiver, command):
    """The endpoint disabled during an attempt fails the message at once; resending or recovering it
    then must not start a second attempt while the first is under way (reviewer's finding)."""
    claimed = disabled_during_an_attempt(app, hook, receiver)
    if command == "resend":
        result = runner.invoke(args=["webhooks", "resend", claimed.message_id])
        assert result.exit_code == 1 and "is being sent right now" in result.stderr
    else:
        result = runner.invoke(args=["webhooks", "recover", str(hook.id), "--since", "1h"])
        assert result.stdout.startswith("Recovering 1 failed message")  # the other one, not in an attempt
    assert [message.message_id for message in delivery.claim(db.obj, 10)] != [claimed.message_id]
    assert delivery.record(claimed, delivery.Outcome(204, None, 1), [1]) == DELIVERED


def test_recover_enables_a_disabled_endpoint_so_a_failing_receiver_gets_one_probe(app, runner, hook, receiver):
    """Recovering twenty failed messages of a disabled endpoint whose receiver still fails: one
    attempt, the others waiting for its retry; pressing again finds nothing to recover."""
    receiver.answer = lambda sent: 503
    outbox.write_messages([hook.id] * 20, "webhook.test", {"endpoint_id": hook.id, "url": hook.url,
                                                           "org": hook.org.slug}, utcnow())
    WebhookMessage.update(state=FAILED, next_attempt_at=None, attempts=3).execute()
    WebhookEndpoint.update(disabled_at=utcnow(), failing_since=utcnow() - datetime.timedelta(days=6)).execute()
    assert runner.invoke(args=["webhooks", "recover", str(hook.id), "--since", "1h"]).stdout.startswith(
        "Recovering 20 failed messages")
    endpoint = WebhookEndpoint.get_by_id(hook.id)
    assert (endpoint.disabled_at, endpoint.failing_since) == (None, None)
    assert len(delivery.deliver_due(app)) == 1
    assert WebhookMessage.select().where(WebhookMessage.state == PENDING).count() == 20
    assert runner.invoke(args=["webhooks", "recover", str(hook.id), "--since", "1h"]).stdout.startswith(
        "Recovering 0 failed messages")
    assert len(receiver.received()) == 1


def test_resend_of_a_spent_message_that_fails_says_so_not_disabled(app, runner, hook, receiver):
    failed = failed_message(app, hook, receiver)
    receiver.answer = lambda sent: 500
    result = runner.invoke(args=["webhooks", "resend", failed.message_id])
    assert result.stderr.endswith("It is not tried again: its retry schedule is spent.\n")


@pytest.mark.parametrize("webhook_id", ["msg_\x00x", "msg_" + "a" * 5000, "msg_é", "' OR 1=1 --"])
def test_resend_of_a_webhook_id_of_another_form_is_one_line(app, runner, webhook_id):
    result = runner.invoke(args=["webhooks", "resend", webhook_id])
    assert result.exit_code == 1 and result.stderr.startswith("Error: There is no kept webhook message")


def test_a_waiting_message_due_later_is_resent_now(app, runner, hook, receiver):
    receiver.answer = lambda sent: 503
    message = endpoints.send_test(hook)
    delivery.deliver_due(app)
    WebhookMessage.update(next_attempt_at=utcnow() + datetime.timedelta(hours=2)).where(
        WebhookMessage.id == message.id).execute()
    receiver.answer = lambda sent: 204
    assert runner.invoke(args=["webhooks", "resend", message.message_id]).exit_code == 0
    assert WebhookMessage.get_by_id(message.id).state == DELIVERED


def test_resend_of_an_unknown_or_forgotten_message_is_one_line(app, runner):
    result = runner.invoke(args=["webhooks", "resend", "msg_nothing"])
    assert result.exit_code == 1
    assert result.stderr == ("Error: There is no kept webhook message 'msg_nothing' (messages are kept for a week "
                             "after they were made).\n")


# Recover

def test_recover_restarts_the_failed_messages_since_then_from_the_start_of_the_schedule(app, runner, hook, receiver):
    old = failed_message(app, hook, receiver)
    WebhookMessage.update(created_at=utcnow() - datetime.timedelta(days=2)).where(WebhookMessage.id == old.id).execute()
    recent = failed_message(app, hook, receiver)
    kept = delivered_message(app, hook)
    result = runner.invoke(args=["webhooks", "recover", str(hook.id), "--since", "24h"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"Recovering 1 failed message of endpoint {hook.id} made since ")
    stored = WebhookMessage.get_by_id(recent.id)
    assert (stored.state, stored.attempts) == (PENDING, 0)
    assert WebhookMessage.get_by_id(old.id).state == FAILED
    assert WebhookMessage.get_by_id(kept.id).state == DELIVERED
    before = len(receiver.received())
    [(claimed, outcome, state)] = delivery.deliver_due(app)
    assert (claimed.message_id, claimed.number, state) == (recent.message_id, 1, DELIVERED)
    assert receiver.received()[before].body == recent.body.encode()
    since = iso_seconds(utcnow() - datetime.timedelta(days=3))
    assert runner.invoke(args=["webhooks", "recover", str(hook.id), "--since", since]).stdout.startswith(
        f"Recovering 1 failed message of endpoint {hook.id} made since {since}.")


@pytest.mark.parametrize("text, expected", [
    ("2026-11-25T09:00:00Z", datetime.datetime(2026, 11, 25, 9)),
    ("2026-11-25T10:00:00+01:00", datetime.datetime(2026, 11, 25, 9)),
    ("2026-11-25T09:00:00", datetime.datetime(2026, 11, 25, 9)),
    ("2026-11-25", datetime.datetime(2026, 11, 25)),
    ("24h", datetime.datetime(2026, 11, 25, 9)),
    ("90m", datetime.datetime(2026, 11, 26, 7, 30)),
])
def test_since_takes_iso_8601_or_a_duration_back_from_now(text, expected):
    assert recovery.since_moment(text, now=datetime.datetime(2026, 11, 26, 9)) == expected


# Refused before the database is asked: one database is enough.
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("text", ["yesterday", "", "-1h", "24", "2026-13-01", "999999d", "0001-01-01T00:00:00+01:00"])
def test_since_refuses_anything_else_with_a_sentence(app, runner, hook, text):
    result = runner.invoke(args=["webhooks", "recover", str(hook.id), "--since", text])
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: --since takes an ISO 8601 time")


# Rotate

def signatures(delivery_seen):
    return delivery_seen.headers["webhook-signature"].split(" ")


def test_rotation_with_an_overlap_signs_with_both_new_first_then_only_the_new(app, runner, hook, receiver):
    old = receiver.secrets["/alice"]
    result = runner.invoke(args=["webhooks", "rotate", str(hook.id)])
    assert result.exit_code == 0, result.output
    new = result.stdout.splitlines()[-1]
    assert new.startswith("whsec_") and new != old
    assert "the old secret signs too until " in result.stdout.splitlines()[0]
    receiver.secrets["/alice"] = new
    delivered_message(app, hook)
    seen = receiver.received()[-1]
    assert len(signatures(seen)) == 2
    assert signatures(seen)[0] == signing.signature(new, seen.message_id, int(seen.headers["webhook-timestamp"]),
                                                    seen.body)
    assert signatures(seen)[1] == signing.signature(old, seen.message_id, int(seen.headers["webhook-timestamp"]),
                                                    seen.body)
    assert verifies(new, seen) and verifies(old, seen)
    # The overlap over: the new one alone.
    WebhookEndpoint.update(previous_until=utcnow() - datetime.timedelta(seconds=1)).execute()
    delivered_message(app, hook)
    seen = receiver.received()[-1]
    assert len(signatures(seen)) == 1 and verifies(new, seen) and not verifies(old, seen)
    [event] = SecurityEvent.select().where(SecurityEvent.event == "webhook.secret_rotated")
    assert new not in event.detail and old not in event.detail


def test_rotation_with_no_overlap_ends_the_old_secret_at_once(app, runner, hook, receiver):
    old = receiver.secrets["/alice"]
    result = runner.invoke(args=["webhooks", "rotate", str(hook.id), "--overlap", "0"])
    assert "the old secret no longer signs" in result.stdout
    receiver.secrets["/alice"] = new = result.stdout.splitlines()[-1]
    delivered_message(app, hook)
    seen = receiver.received()[-1]
    assert len(signatures(seen)) == 1 and verifies(new, seen) and not verifies(old, seen)


def test_a_rotation_during_an_overlap_drops_the_oldest_secret(app, runner, hook, receiver):
    first = receiver.secrets["/alice"]
    second = runner.invoke(args=["webhooks", "rotate", str(hook.id)]).stdout.splitlines()[-1]
    third = runner.invoke(args=["webhooks", "rotate", str(hook.id), "--overlap", "1h"]).stdout.splitlines()[-1]
    receiver.secrets["/alice"] = third
    delivered_message(app, hook)
    seen = receiver.received()[-1]
    assert len(signatures(seen)) == 2
    assert verifies(third, seen) and verifies(second, seen) and not verifies(first, seen)
    until = WebhookEndpoint.get_by_id(hook.id).previous_until
    assert datetime.timedelta(minutes=59) < until - utcnow() <= datetime.timedelta(hours=1)


@pytest.mark.parametrize("overlap", ["8d", "169h", "soon", "-1h"])
def test_an_overlap_past_seven_days_or_not_a_duration_is_refused(app, runner, hook, overlap):
    before = WebhookEndpoint.get_by_id(hook.id).sealed_secret
    result = runner.invoke(args=["webhooks", "rotate", str(hook.id), "--overlap", overlap])
    assert result.exit_code == 1 and result.stdout == ""
    assert WebhookEndpoint.get_by_id(hook.id).sealed_secret == before


def test_an_attempt_signed_after_a_rotation_carries_the_new_secret_though_claimed_before(app, hook, receiver):
    """A rotation between a message's claim and its attempt: the attempt is signed with the secrets
    in force when it is sent, so a receiver that took the new secret at once verifies it."""
    endpoints.send_test(hook)
    [claimed] = delivery.claim(db.obj, 1)
    new, _ = endpoints.rotate_secret(hook, datetime.timedelta(0))
    receiver.secrets["/alice"] = new
    outcome = delivery.send(claimed, True)
    assert outcome.status == 204
    assert receiver.received()[-1].error is None


def test_an_unreadable_previous_secret_does_not_stop_deliveries(app, hook, receiver):
    new, _ = endpoints.rotate_secret(hook)
    WebhookEndpoint.update(sealed_previous_secret="not sealed").execute()
    receiver.secrets["/alice"] = new
    delivered_message(app, hook)
    assert len(signatures(receiver.received()[-1])) == 1
