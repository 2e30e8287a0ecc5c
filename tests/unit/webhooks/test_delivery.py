"""The webhook sender's edges, on SQLite and PostgreSQL: how a claim shares a process's slots
between accounts, every way a receiver can end an attempt recorded as a failed attempt with a short
text, and `webhooks test` saying what happened on one line."""

import contextlib
import datetime
import http.client
import socket
import ssl
import struct
import threading

import pytest

from accounts import users
from models import db, utcnow
from webhooks import addresses, delivery, endpoints, failures, outbox
from webhooks.models import PENDING, WebhookAttempt, WebhookEndpoint, WebhookMessage


@pytest.fixture
def app(app):
    """The receivers here listen on 127.0.0.1."""
    app.config["WEBHOOK_ALLOW_PRIVATE"] = True
    return app


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


@pytest.mark.parametrize("failure, text", [
    (http.client.RemoteDisconnected("Remote end closed connection without response"),
     "Connection closed without an answer."),
    (http.client.BadStatusLine("hello\r\n"), "The answer is not HTTP: its status line cannot be read."),
    (http.client.LineTooLong("header line"), "The answer's head has a line too long."),
    (http.client.IncompleteRead(b""), "The answer was cut short."),
    (ConnectionRefusedError(111, "Connection refused"), "Connection refused."),
    (ConnectionResetError(104, "Connection reset by peer"), "Connection reset."),
    (ConnectionAbortedError(103, "Software caused connection abort"), "Connection aborted."),
    (BrokenPipeError(32, "Broken pipe"), "Connection closed while the request was sent."),
    (socket.gaierror(-2, "Name or service not known"), "Network error: Name or service not known."),
    (OSError(113, "No route to host"), "Network error: No route to host."),
    (ssl.SSLEOFError(8, "EOF occurred in violation of protocol"),
     "TLS failed: EOF occurred in violation of protocol."),
    (ssl.SSLCertVerificationError(1, "certificate verify failed"),
     "TLS certificate not accepted: certificate verify failed."),
    (UnicodeError("label too long"), "The host name cannot be encoded."),
    (addresses.RefusedAddress("The host 'x.invalid' cannot be resolved."), "The host 'x.invalid' cannot be resolved."),
    (http.client.UnknownProtocol("HTTP/9\r\nX: \x00"), "The answer is not valid HTTP/1.1 (HTTP/9 X: ?)."),
    (RuntimeError("one\ntwo"), "The attempt failed: RuntimeError (one two)."),
    (RuntimeError(), "The attempt failed: RuntimeError (RuntimeError)."),
])
def test_every_failure_is_said_in_a_few_words_on_one_line(failure, text):
    assert failures.described(failure) == text


def test_a_long_failure_is_cut_to_the_column():
    text = failures.described(http.client.HTTPException("x" * 1000))
    assert len(text) == failures.MAX_LENGTH == WebhookAttempt.error.max_length


# webhooks test: one line in every case

@pytest.mark.parametrize("answer, error", [(b"", "Connection closed without an answer"),
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
