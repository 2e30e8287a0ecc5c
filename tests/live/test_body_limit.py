"""MAX_BODY_BYTES on the live server in both run modes (two gunicorn workers, and the fallback
server), with raw sockets: a larger body, declared or sent in chunks, is refused before it is read;
a body within the limit is served and the workers carry on. The same rules in-process:
tests/unit/serving/test_bodylimit.py."""

import json
import socket
import time

import pytest
from serverfixtures import each_run_mode


@pytest.fixture(scope="module")
def server_settings():
    """Two gunicorn workers, or `python app.py`'s one-process fallback."""
    return {"WEB_CONCURRENCY": "2"}


server_mode = each_run_mode


def connect(server):
    host, port = server.base.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.settimeout(30)
    return sock


def read_until_closed(sock):
    """Everything the server sends until it closes the connection (a timeout fails the test)."""
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


MULTIPART_HEAD = (b"--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"big.bin\"\r\n"
                  b"Content-Type: application/octet-stream\r\n\r\n")


@pytest.mark.parametrize("path, accept, expected", [
    ("/login", "text/html", b"Content-Type: text/html"),
    ("/api/v1/keys/revoke", "application/json", b'"code":"payload_too_large"'),
])
def test_live_a_declared_300_mb_body_is_refused_before_it_is_sent(server, path, accept, expected):
    sock = connect(server)
    head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nAccept: {accept}\r\nContent-Length: 300000000\r\n"
            "Content-Type: multipart/form-data; boundary=b\r\n\r\n").encode()
    started = time.monotonic()
    sock.sendall(head + MULTIPART_HEAD + b"\0" * 4096)
    # The answer comes after a few kilobytes of the 300 MB, and the connection closes instead of
    # the server reading (and discarding, or spooling) the rest, which is never sent: a server that
    # waited for it would never answer (the bound leaves a loaded machine its time).
    answer = read_until_closed(sock)
    assert time.monotonic() - started < 30
    assert answer.startswith(b"HTTP/1.1 413 ") and expected in answer
    sock.close()


def test_live_a_chunked_stream_is_refused_once_past_the_limit(server):
    sock = connect(server)
    sock.sendall(b"POST /api/v1/keys/revoke HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
    # Eight times the limit and never the last chunk: the answer can only come from a server that
    # stopped at the limit. Within the 1 MiB a server lingers over, so none of it is left unread
    # when the server closes (which would reset the connection, answer and all, a race).
    piece = b"y" * 8192
    for _ in range(8 * 65536 // len(piece)):
        sock.sendall(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
    answer = b""
    while b"}}" not in answer and (chunk := sock.recv(65536)):  # the whole JSON body
        answer += chunk
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
    body = json.loads(answer.split(b"\r\n\r\n", 1)[1].split(b"}}", 1)[0] + b"}}")
    assert body["error"]["code"] == "payload_too_large"
    sock.close()


def test_live_a_body_within_the_limit_is_served_and_the_workers_carry_on(server):
    sock = connect(server)
    body = b"z" * 1000
    sock.sendall(b"POST /api/v1/keys/revoke HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + body)
    answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 401 "), answer[:200]
    sock.close()
    assert "Traceback" not in server.output()


@pytest.mark.parametrize("body", [b"zz\r\n", b"5\r\nab", b"3\r\nabcX\r\n0\r\n\r\n"])
def test_live_a_malformed_chunked_body_is_a_400_not_a_500(server, body):
    sock = connect(server)
    sock.sendall(b"POST /api/v1/keys/revoke HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + body)
    if body == b"5\r\nab":
        sock.shutdown(socket.SHUT_WR)  # cut short
    answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
    assert b"The chunked request body is malformed or was cut short." in answer
    sock.close()
    assert "Traceback" not in server.output()


def test_live_a_chunked_body_on_a_get_is_not_read_and_the_connection_closes(server):
    sock = connect(server)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + b"1\r\nx\r\n" * 1000)
    answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.count(b"HTTP/1.1") == 1
    sock.close()
