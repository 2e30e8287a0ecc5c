"""serving/worker.py: a response's head goes out with its first body bytes in one send, on real
sockets, read back by http.client; every other shape of response (no body, several parts,
chunked, a file by sendfile, a body larger than the socket's buffer) arrives as gunicorn's own
worker sends it. The live servers serve
everything through this worker (tests/live/test_server.py names it in the start's log)."""

import email.utils
import hashlib
import http.client
import inspect
import socket
import tempfile
import threading
import time
import types

import gevent.socket
import pytest
from gunicorn import http as gunicorn_http, util
from gunicorn.config import Config
from gunicorn.glogging import Logger
from gunicorn.http import wsgi
from gunicorn.workers.base_async import AsyncWorker
from gunicorn.workers.ggevent import GeventWorker

from serving import worker as serving_worker
from serving.worker import Response, Worker

# What serving/worker.py copies or changes in gunicorn 27.0.1. A new gunicorn that changes one of
# these fails here: compare its source with the copy before taking the new fingerprint.
COPIED = {
    AsyncWorker.handle_request: "913e17a9542aa70d",
    GeventWorker.handle_request: "46750b15c6e4d4b4",
    GeventWorker.patch: "e755a4b317f558e7",
    wsgi.Response.default_headers: "cb490cea5d6f5408",
    wsgi.Response.send_headers: "7aff3b7d004fc17b",
    wsgi.Response.write: "a13659ff072c00e1",
    wsgi.Response._emit_body: "df723e865a1e5adc",
    wsgi.Response.sendfile: "417ea65fb9a19f5b",
    wsgi.Response.write_file: "dbbc6333931219cc",
    wsgi.Response.close: "1e78fc7777ff09ae",
    wsgi.Response.process_headers: "496d84a357b028ae",
    util.is_hoppish: "37c54c9e838fc97a",
    wsgi.create: "2c35d4a2dc629ede",
    util.write: "cd995031295fd782",
    util.write_chunk: "9cd46540c593e44d",
}


def fingerprint(function):
    return hashlib.sha256(inspect.getsource(function).encode()).hexdigest()[:16]


@pytest.mark.parametrize("function", COPIED, ids=lambda function: function.__qualname__)
def test_what_the_worker_copies_is_as_it_was_copied(function):
    assert fingerprint(function) == COPIED[function]


class CountedSends:
    """A real socket, counting what is written to it in each call."""

    def __init__(self, sock):
        self.sock = sock
        self.sends = []

    def sendall(self, data):
        self.sends.append(bytes(data))
        self.sock.sendall(data)

    def send(self, data):
        self.sends.append(bytes(data))
        return self.sock.send(data)

    def sendfile(self, file, offset=0, count=None):
        self.sends.append(f"sendfile of {count} bytes")
        return self.sock.sendfile(file, offset, count)

    def __getattr__(self, name):
        return getattr(self.sock, name)


@pytest.fixture
def exchange():
    """serve(request_line, respond) parses the request from a real socket, lets respond(resp)
    answer it through serving.worker.Response, and returns (what each send wrote, the response
    http.client read from the other end, its body)."""
    client, server = socket.socketpair()
    client.settimeout(5)
    server.settimeout(5)

    def serve(request_line, respond):
        client.sendall(request_line.encode() + b"\r\nHost: test\r\n\r\n")
        sent = CountedSends(server)
        req = next(gunicorn_http.get_parser(Config(), sent, ("127.0.0.1", 1)))
        resp, _ = wsgi.create(req, sent, ("127.0.0.1", 1), ("127.0.0.1", 2), Config(), response_class=Response)
        respond(resp)
        reply = http.client.HTTPResponse(client, method=req.method)
        reply.begin()
        return sent.sends, reply, reply.read()

    yield serve
    client.close()
    server.close()


def test_the_date_header_is_the_time_of_the_response(exchange):
    sends, reply, read = exchange("GET / HTTP/1.1", lambda resp: answer(resp, [b"{}"], [("Content-Length", "2")]))
    assert abs(email.utils.parsedate_to_datetime(reply.getheader("Date")).timestamp() - time.time()) < 2
    assert reply.getheader("Date").endswith(" GMT")


def answer(resp, body_parts, headers=(("Content-Type", "application/json"),)):
    resp.start_response("200 OK", list(headers))
    for part in body_parts:
        resp.write(part)
    resp.close()


def test_a_small_response_is_one_send_of_head_and_body(exchange):
    body = b'{"year": 2026}'
    sends, reply, read = exchange("GET /api/v1/demo/year HTTP/1.1", lambda resp: answer(
        resp, [body], [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]))
    assert len(sends) == 1
    assert sends[0].startswith(b"HTTP/1.1 200 OK\r\n") and sends[0].endswith(b"\r\n\r\n" + body)
    assert (reply.status, reply.getheader("Content-Type"), read) == (200, "application/json", body)


def test_later_body_parts_follow_the_first(exchange):
    sends, reply, read = exchange("GET / HTTP/1.1", lambda resp: answer(
        resp, [b"one,", b"two,", b"three"], [("Content-Length", "13")]))
    assert [send.endswith(part) for send, part in zip(sends, [b"one,", b"two,", b"three"])] == [True] * 3
    assert len(sends) == 3 and read == b"one,two,three"


def test_a_head_request_sends_the_head_once_at_its_first_write(exchange):
    sent_before_close = []

    def respond(resp):
        resp.start_response("200 OK", [("Content-Length", "7")])
        resp.write(b"dropped")
        sent_before_close.append(resp.sock.sends[:])
        resp.close()

    sends, reply, read = exchange("HEAD / HTTP/1.1", respond)
    assert len(sends) == 1 and sends[0].endswith(b"\r\n\r\n") and sent_before_close == [sends]
    assert (reply.status, reply.getheader("Content-Length"), read) == (200, "7", b"")


def test_an_empty_chunk_pushes_the_head_out_at_once(exchange):
    """A streaming app may write an empty part to send its head before its first event."""
    sent_before_close = []

    def respond(resp):
        resp.start_response("200 OK", [("Content-Type", "text/event-stream")])
        resp.write(b"")
        sent_before_close.append(resp.sock.sends[:])
        resp.write(b"data: 1\n\n")
        resp.close()

    sends, reply, read = exchange("GET /events HTTP/1.1", respond)
    assert len(sent_before_close[0]) == 1 and b"Transfer-Encoding: chunked\r\n" in sent_before_close[0][0]
    assert read == b"data: 1\n\n"


def test_a_large_first_part_is_sent_after_the_head_not_copied_behind_it(exchange):
    body = b"x" * (Response.JOINED_BODY_LIMIT + 1)
    sends, reply, read = exchange("GET / HTTP/1.1",
                                  lambda resp: answer(resp, [body], [("Content-Length", str(len(body)))]))
    assert sends[0].endswith(b"\r\n\r\n") and sends[1:] == [body] and read == body


def test_an_answer_that_fails_before_reaching_the_client_gets_gunicorns_500(exchange):
    """The head was held when write() refused a str: nothing reached the client, so the worker's
    error answer can still take the response's place (gunicorn's own worker sent the head and then
    cut the connection)."""
    worker = Worker(0, 1, [], None, 30, Config(), Logger(Config()))

    def app(environ, start_response):
        start_response("200 OK", [("Content-Length", "2")])
        return ["{}"]

    worker.call_app = app

    def respond(resp):
        with pytest.raises(TypeError):
            worker.handle_request(("127.0.0.1", 2), resp.req, resp.sock, ("127.0.0.1", 1))
        assert resp.sock.sends == []
        worker.handle_error(resp.req, resp.sock, ("127.0.0.1", 1), TypeError())

    try:
        sends, reply, read = exchange("GET / HTTP/1.1", respond)
    finally:
        worker.tmp.close()
    assert reply.status == 500


def test_an_app_object_is_called_through_its_bound_call_and_a_function_as_it_is():
    """gunicorn calls the app object itself: through its type's C slot, a new C frame that each
    open WebSocket keeps on its saved stack. The hooks of gunicorn.conf.py still get the app."""
    class App:
        def __call__(self, environ, start_response):
            return []

    def plain(environ, start_response):
        return []

    worker = Worker(0, 1, [], None, 30, Config(), Logger(Config()))
    try:
        for app, called_as in ((App(), None), (plain, plain)):
            worker.app = types.SimpleNamespace(wsgi=lambda app=app: app)
            worker.load_wsgi()
            assert worker.wsgi is app
            assert worker.call_app == (called_as or app.__call__)
            assert isinstance(worker.call_app, types.FunctionType | types.MethodType)
    finally:
        worker.tmp.close()


def test_an_empty_body_sends_the_head(exchange):
    sends, reply, read = exchange("GET / HTTP/1.1", lambda resp: answer(resp, [], [("Content-Length", "0")]))
    assert len(sends) == 1 and (reply.status, read) == (200, b"")


def test_a_chunked_response_sends_its_head_first(exchange):
    sends, reply, read = exchange("GET / HTTP/1.1", lambda resp: answer(resp, [b"streamed", b" on"]))
    assert reply.getheader("Transfer-Encoding") == "chunked" and read == b"streamed on"
    assert sends[0].endswith(b"\r\n\r\n") and b"streamed" not in sends[0]


def test_a_file_sent_by_sendfile_gets_its_head_first(exchange):
    with tempfile.TemporaryFile() as file:
        file.write(b"body { color: black }")
        file.seek(0)

        def respond(resp):
            resp.start_response("200 OK", [("Content-Type", "text/css"), ("Content-Length", "21")])
            resp.write_file(wsgi.FileWrapper(file))
            resp.close()

        sends, reply, read = exchange("GET /static/style.css HTTP/1.1", respond)
    assert sends[0].endswith(b"\r\n\r\n") and sends[1] == "sendfile of 21 bytes"
    assert read == b"body { color: black }"


@pytest.mark.parametrize("parts", [1, 2])
@pytest.mark.parametrize("size", [20, 4 * 1024 * 1024])
def test_a_gevent_socket_gets_the_whole_response_however_much_its_buffer_takes(size, parts):
    """The worker's sockets are gevent's: the real socket's send takes what fits, gevent's sendall
    the rest (a part of 4 MiB does not fit a 64 KiB buffer; the second finds it full), while the
    client reads."""
    client, server = socket.socketpair()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65536)
    served = gevent.socket.socket(fileno=server.detach())
    body = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    replies = []

    def read():
        reply = http.client.HTTPResponse(client, method="GET")
        reply.begin()
        replies.append(reply.read())

    reader = threading.Thread(target=read)
    try:
        client.sendall(b"GET / HTTP/1.1\r\nHost: test\r\n\r\n")
        req = next(gunicorn_http.get_parser(Config(), served, ("127.0.0.1", 1)))
        resp, _ = wsgi.create(req, served, ("127.0.0.1", 1), ("127.0.0.1", 2), Config(), response_class=Response)
        reader.start()
        answer(resp, [body] * parts, [("Content-Length", str(size * parts))])
        reader.join(timeout=30)
    finally:
        served.close()
        client.close()
    assert replies == [body * parts]


class StrSubclass(str):
    pass


HEADER_LISTS = [
    [("Content-Type", "application/json"), ("X-Request-ID", "abc"), ("RateLimit", '"free";r=9;t=60')],
    [("Content-Length", " 12 "), ("content-length", "13")],
    [("Connection", "Upgrade"), ("Upgrade", "websocket"), ("Keep-Alive", "timeout=5"), ("Server", "x")],
    [("Connection", "close"), ("Upgrade", "h2c"), ("Transfer-Encoding", "chunked"), ("date", "now")],
    [("X-Padded", " \t value \t "), ("X-Empty", ""), ("X-Latin", "caf\xe9")],
    [("X-Ok", "1"), ("Bad Name", "x")],
    [("X-Ok", "1"), ("", "x")],
    [("X-Ok", "1"), ("X-Split", "a\r\nSet-Cookie: b")],
    [("X-Ok", "1"), ("X-Nul", "a\x00b")],
    [("X-Ok", "1"), ("X-Wide", "\u2603")],
    [("X-Ok", "1"), (b"X-Bytes", "x")],
    [("X-Ok", "1"), ("X-Bytes", b"x")],
    [("X-Ok", "1"), (["X-List"], "x")],
    [("X-Ok", "1"), ("X-Number", 1)],
    [(StrSubclass("X-Sub"), StrSubclass(" y "))],
    [("X-Ok", "1"), ("Content-Length", "twelve")],
]


def headers_processed(response_class, headers):
    """What process_headers leaves, or the error it raises, on a response of response_class."""
    resp = response_class(types.SimpleNamespace(method="GET", version=(1, 1)), None, Config())
    try:
        resp.process_headers(headers)
    except Exception as error:
        return type(error), str(error), resp.headers
    return resp.headers, resp.response_length, resp.upgrade


@pytest.mark.parametrize("headers", HEADER_LISTS, ids=range(len(HEADER_LISTS)))
def test_headers_are_checked_and_kept_as_gunicorn_checks_and_keeps_them(headers):
    # Twice: the second time each name is one the worker has checked before.
    for _ in range(2):
        assert headers_processed(Response, headers) == headers_processed(wsgi.Response, headers)


def test_a_kept_config_reads_every_setting_as_gunicorn_s_config_does_and_keeps_it():
    cfg = Config()
    cfg.set("keepalive", 7)
    kept = serving_worker.KeptConfig.of(cfg)
    # Those Config makes a property of (worker_class, address...) are its own, read each time.
    plain = [name for name in cfg.settings if not isinstance(getattr(Config, name, None), property)]
    assert "keepalive" in plain and "worker_class" not in plain
    for name in cfg.settings:
        assert getattr(kept, name) == getattr(cfg, name)
        assert getattr(kept, name) == getattr(cfg, name)
    assert set(plain) <= set(vars(kept)) and not set(plain) & set(vars(cfg))
    assert (kept.keepalive, kept.is_ssl) == (7, cfg.is_ssl)
    assert kept.forwarded_allow_networks() == cfg.forwarded_allow_networks()
    with pytest.raises(AttributeError, match="No configuration setting for: no_such_setting"):
        assert kept.no_such_setting is None
    with pytest.raises(AttributeError, match="Invalid access"):
        kept.keepalive = 8
