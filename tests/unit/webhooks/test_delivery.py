"""webhooks/delivery.py, the sender, on SQLite and PostgreSQL: retries under one webhook-id until
the schedule is spent, a redirect a failure, an endpoint failing for five days disabled; a claim's
lease, how a claim shares a process's slots between accounts and gives a failing endpoint one
message at a time; lookups and deadlines bounded; a stop giving back only what is still pending;
every way a receiver can end an attempt recorded as a failed attempt with a short text, and
`webhooks test` saying what happened on one line (each failure's words: test_failures.py)."""

import contextlib
import datetime
import http.client
import pathlib
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest

from accounts import users
from models import SecurityEvent, db, utcnow
from orgs import keyactions
from webhooks import delivery, endpoints, outbox
from webhooks.models import DELIVERED, FAILED, PENDING, WebhookAttempt, WebhookEndpoint, WebhookMessage


def account(name):
    return users.create_user(name, f"{name}@example.com", "correct horse battery")


def messages(owner, count, due, endpoint_count=1):
    """count messages for each of endpoint_count new endpoints of owner, due since `due`; return
    their ids, endpoint by endpoint, in the order written."""
    ids = []
    for _ in range(endpoint_count):
        endpoint, _ = endpoints.add_endpoint(owner, "http://127.0.0.1:9/hook")
        ids += [WebhookMessage.get(WebhookMessage.message_id == outbox.write_messages([endpoint.id], "key.revoked", {},
                                                                                     due)[0]).id for _ in range(count)]
    return ids


def claimed_ids(*args, **options):
    return sorted(message.pk for message in delivery.claim(db.obj, *args, **options))


def due_now(message_id):
    """Bring a message's next attempt forward to now, as if its pause had passed."""
    WebhookMessage.update(next_attempt_at=utcnow()).where(
        (WebhookMessage.message_id == message_id) & (WebhookMessage.state == PENDING)).execute()


# Claims: accounts share the slots

def test_each_account_has_a_turn_before_any_has_a_second(app, user):
    minute_ago = utcnow() - datetime.timedelta(minutes=1)
    alice = messages(user, 2, minute_ago, endpoint_count=3)
    bob = messages(account("bob"), 1, utcnow())
    assert claimed_ids(2) == sorted([alice[0], bob[0]])


def test_an_accounts_attempts_under_way_count_in_its_turn(app, user):
    alice = messages(user, 1, utcnow(), endpoint_count=2)
    bob = messages(account("bob"), 1, utcnow(), endpoint_count=2)
    carol = messages(account("carol"), 1, utcnow())
    # alice has 30 attempts under way in this process: bob's second goes before her first.
    assert claimed_ids(3, sending={user.id: 30}) == sorted([bob[0], bob[1], carol[0]])
    assert claimed_ids(3, sending={user.id: 30}) == sorted(alice)


def test_the_kept_slots_go_only_to_accounts_with_nothing_under_way_one_each(app, user):
    messages(user, 1, utcnow(), endpoint_count=3)
    bob = account("bob")
    bobs = messages(bob, 1, utcnow(), endpoint_count=2)
    carols = messages(account("carol"), 1, utcnow())
    # 10 slots free, all kept: alice's 40 attempts under way leave her none.
    assert claimed_ids(10, sending={user.id: 40}, kept=10) == sorted([bobs[0], carols[0]])
    # bob, now with one under way, has another only beyond the kept slots, before alice.
    assert claimed_ids(10, sending={user.id: 40, bob.id: 1}, kept=10) == []
    assert claimed_ids(11, sending={user.id: 38, bob.id: 1}, kept=10) == [bobs[1]]


def test_within_a_turn_a_message_just_due_goes_before_another_accounts_backlog(app, user):
    messages(user, 3, utcnow() - datetime.timedelta(minutes=1))
    bob = messages(account("bob"), 1, utcnow())
    assert claimed_ids(1) == bob


# Every way an attempt can end is a failed attempt, with a short text

def reset(connection):
    connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def read_request(connection):
    """Read one whole request, head and Content-Length body: a socket closed with bytes still
    unread sends a reset, which the sender would report instead of the answer under test. What is
    not HTTP (a TLS ClientHello) is read once."""
    received = connection.recv(65536)
    if not received[:1].isalpha():
        return
    while b"\r\n\r\n" not in received:
        piece = connection.recv(65536)
        if not piece:
            return
        received += piece
    head, _, body = received.partition(b"\r\n\r\n")
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")[1:]
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length and (piece := connection.recv(65536)):
        body += piece


@contextlib.contextmanager
def answering(answer):
    """A receiver on a free port that reads one request, then sends answer (bytes) or does it
    (a function of the connection), and closes; yields its port."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(15)

    def serve():
        with contextlib.suppress(OSError), listener:
            connection, _ = listener.accept()
            with connection:
                read_request(connection)
                if callable(answer):
                    answer(connection)
                else:
                    connection.sendall(answer)

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        thread.join(timeout=20)


@pytest.mark.parametrize("answer, error", [
    (b"", "Connection closed without an answer."),
    (reset, "Connection reset."),
    (b"hello\r\n\r\n", "The answer is not HTTP: its status line cannot be read."),
    (b"HTTP/1.1 abc OK\r\n\r\n", "The answer is not HTTP: its status line cannot be read."),
    (b"HTTP/1.1 200 OK\r\nX-Long: " + b"a" * 70_000 + b"\r\n\r\n", "The answer's head has a line too long."),
    (b"HTTP/1.1 200 OK\r\n" + b"X-Many: 1\r\n" * 101 + b"\r\n",
     "The answer is not valid HTTP/1.1 (got more than 100 headers)."),
    (b"HTTP/2.0 200 OK\r\n\r\n", "The answer is not valid HTTP/1.1 (HTTP/2.0)."),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\nabc", "The answer was cut short."),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "The answer was cut short."),
])
def test_a_receiver_that_ends_an_attempt_badly_gets_a_failed_attempt_with_a_short_text(app, user, answer, error):
    with answering(answer) as port:
        endpoint, _ = endpoints.add_endpoint(user, f"http://127.0.0.1:{port}/hook")
        endpoints.send_test(endpoint)
        [(_, outcome, state)] = delivery.deliver_due(app)
    assert (outcome.status, outcome.error, state) == (None, error, PENDING)
    [attempt] = WebhookAttempt.select()
    assert (attempt.number, attempt.status, attempt.error) == (1, None, error)
    assert WebhookEndpoint.get_by_id(endpoint.id).failing_since is not None


def test_tls_to_a_receiver_that_speaks_plain_http_is_a_failed_attempt(app, user):
    with answering(b"HTTP/1.1 400 Bad Request\r\n\r\n") as port:
        endpoint, _ = endpoints.add_endpoint(user, f"https://127.0.0.1:{port}/hook")
        endpoints.send_test(endpoint)
        [(_, outcome, state)] = delivery.deliver_due(app)
    assert (outcome.status, outcome.error, state) == (None, "TLS failed: wrong version number.", PENDING)


def test_a_refused_connection_is_a_failed_attempt(app, user):
    with socket.create_server(("127.0.0.1", 0)) as closed:
        port = closed.getsockname()[1]
    endpoint, _ = endpoints.add_endpoint(user, f"http://127.0.0.1:{port}/hook")
    endpoints.send_test(endpoint)
    [(_, outcome, state)] = delivery.deliver_due(app)
    assert (outcome.status, outcome.error, state) == (None, "Connection refused.", PENDING)


# webhooks test: one line in every case

@pytest.mark.parametrize("answer, error", [
    (b"", "Connection closed without an answer"),
    (b"hello\r\n\r\n", "The answer is not HTTP: its status line cannot be read")])
def test_the_cli_test_of_a_receiver_that_fails_is_one_line(app, runner, user, answer, error):
    with answering(answer) as port:
        endpoint, _ = endpoints.add_endpoint(user, f"http://127.0.0.1:{port}/hook")
        result = runner.invoke(args=["webhooks", "test", str(endpoint.id)])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)
    [message] = WebhookMessage.select()
    assert result.output == (f"Error: {message.message_id} not delivered: {error} ({WebhookAttempt.get().duration_ms} "
                             "ms). It is tried again on the retry schedule.\n")


def test_the_cli_test_while_the_last_test_event_waits_is_one_sentence(app, runner, user):
    endpoint, _ = endpoints.add_endpoint(user, "http://127.0.0.1:9/hook")
    endpoints.send_test(endpoint)
    result = runner.invoke(args=["webhooks", "test", str(endpoint.id)])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)
    assert result.output == ("Error: A test event for this endpoint is still waiting to be delivered; try again once "
                             "it has been.\n")
    assert WebhookMessage.select().count() == 1


# Retries, leases and deadlines

def test_http_client_still_opens_its_socket_through_create_connection():
    # delivery.post replaces this attribute to connect to a checked address; a Python that moved it
    # would connect unchecked.
    assert http.client.HTTPConnection("example.com")._create_connection is socket.create_connection


def test_a_receiver_failing_twice_gets_three_attempts_with_one_webhook_id(app, hook, receiver):
    receiver.answer = lambda sent: 500 if len(receiver.received()) <= 2 else 200
    message = endpoints.send_test(hook)
    states = []
    for _ in range(3):
        [(claimed, outcome, state)] = delivery.deliver_due(app)
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
    assert {sent.message_id for sent in receiver.received()} == {message.message_id}
    assert all(sent.error is None for sent in receiver.received())


def test_a_redirect_is_a_failure_and_is_not_followed(app, hook, receiver):
    receiver.answer = lambda sent: 302
    endpoints.send_test(hook)
    [(_, outcome, state)] = delivery.deliver_due(app)
    assert outcome.status == 302 and state == PENDING
    assert [sent.path for sent in receiver.received()] == ["/alice"]


def test_a_message_fails_for_good_once_the_schedule_is_spent(app, hook, receiver):
    receiver.answer = lambda sent: 503
    message = endpoints.send_test(hook)
    for _ in range(3):
        delivery.deliver_due(app)
        due_now(message.message_id)
    assert delivery.deliver_due(app) == []
    stored = WebhookMessage.get_by_id(message.id)
    assert (stored.state, stored.attempts, stored.next_attempt_at) == (FAILED, 3, None)
    assert [attempt.number for attempt in endpoints.recent_attempts(hook)] == [3, 2, 1]


def test_an_endpoint_failing_for_five_days_is_disabled(app, user, hook, receiver):
    receiver.answer = lambda sent: 500
    endpoint = hook
    endpoints.send_test(endpoint)
    delivery.deliver_due(app)
    WebhookEndpoint.update(failing_since=utcnow() - datetime.timedelta(days=5, minutes=1)).execute()
    waiting = WebhookMessage.get(WebhookMessage.state == PENDING)
    due_now(waiting.message_id)
    delivery.deliver_due(app)
    stored = WebhookEndpoint.get_by_id(endpoint.id)
    assert stored.disabled_at is not None and endpoints.state(stored) == "disabled"
    assert WebhookMessage.get_by_id(waiting.id).state == FAILED
    assert SecurityEvent.get(SecurityEvent.event == "webhook.disabled").detail.startswith(endpoint.url)
    keyactions.issue_key(user, "Unheard", "production")
    assert WebhookMessage.select().where(WebhookMessage.event == "key.created").count() == 0


def test_a_claimed_message_is_not_claimed_again_until_its_lease_ends(app, hook):
    endpoints.send_test(hook)
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
    receiver.answer = lambda sent: 500
    messages = [outbox.write_test(hook) for _ in range(3)]
    [(probe, _, state)] = delivery.deliver_due(app)
    assert state == PENDING and len(receiver.received()) == 1 and probe.pk == messages[0].id
    waits = {message.next_attempt_at for message in WebhookMessage.select()}
    assert len(waits) == 1 and waits.pop() > utcnow()
    assert [message.attempts for message in WebhookMessage.select().order_by(WebhookMessage.id)] == [1, 0, 0]
    receiver.answer = lambda sent: 204
    WebhookMessage.update(next_attempt_at=utcnow()).execute()
    assert [state for *_, state in delivery.deliver_due(app)] == [DELIVERED] * 3


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
        return hub.threadpool.apply(
            lambda: sleep(10) or [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.216.34", port))])
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
    assert outcome == (None, "No answer within 1 s.", outcome.duration_ms, None)
    assert time.monotonic() - started < 1 + 5
    listener.close()


def test_a_stop_gives_back_only_a_message_still_pending(app, hook, receiver):
    """The stop cuts an attempt that has just been recorded delivered: it is not sent again."""
    endpoints.send_test(hook)
    [claimed] = delivery.claim(db.obj, 1)
    assert delivery.attempt(app, claimed)[1] == DELIVERED
    delivery.release_claims([claimed])
    stored = WebhookMessage.get()
    assert (stored.state, stored.next_attempt_at, stored.attempts) == (DELIVERED, None, 1)
    assert delivery.deliver_due(app) == [] and len(receiver.received()) == 1


def test_a_message_in_flight_when_its_endpoint_is_disabled_is_not_tried_again(app, hook, receiver):
    receiver.answer = lambda sent: 500
    endpoints.send_test(hook)
    [claimed] = delivery.claim(db.obj, 1)
    # Another process disables the endpoint meanwhile, failing its waiting messages (this one too).
    WebhookEndpoint.update(disabled_at=utcnow()).execute()
    WebhookMessage.update(state=FAILED, next_attempt_at=None).execute()
    assert delivery.attempt(app, claimed)[1] == FAILED
    stored = WebhookMessage.get()
    assert (stored.state, stored.next_attempt_at) == (FAILED, None)
    assert [attempt.status for attempt in endpoints.recent_attempts(hook)] == [500]
