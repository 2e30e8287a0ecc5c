"""`python app.py`'s fallback server (gevent's WSGI server in one process, where gunicorn cannot be
imported; tests/fixtures/no_gunicorn stands in for Windows) on what only it does: its start line,
its JSON log lines and refusals, /metrics and /readyz in one process, the deadline on a request's
head, a Ctrl-C that loses no count, and gunicorn failing where it fails on Windows (at its
`import fcntl`: tests/fixtures/gunicorn_without_fcntl). The live suites (test_server.py,
test_sockets.py, test_malformed_requests.py, ...) run against it as well. Here too: the gevent internals it
relies on, and the settings it copies from gunicorn.conf.py and gunicorn."""

import ast
import inspect
import json
import re
import signal
import socket
import sys
import time

import gunicorn.config
import pytest
import requests
import simple_websocket
import websocket
from gevent import pywsgi
from liveserver import ROOT, Server, free_port, make_key, service_env, serving, start_server, stored_total, wait_for
from readings import json_lines, metric

from serving import accesslog, devserver

NEW_ID = re.compile(r"[0-9a-f]{32}")


def test_the_gevent_internals_the_handler_relies_on():
    one_request = inspect.getsource(pywsgi.WSGIHandler.handle_one_request)
    assert "self.read_requestline()" in one_request and "self.read_request(self.requestline)" in one_request
    assert "return self._handle_client_error(ex)" in one_request and "self.handle_one_response()" in one_request
    assert "self.MessageClass(self.rfile, 0)" in inspect.getsource(pywsgi.WSGIHandler.read_request)
    one_response = inspect.getsource(pywsgi.WSGIHandler.handle_one_response)
    assert "self.log_request()" in one_response and "self._send_error_response_if_possible(400)" in one_response
    assert "self._send_error_response_if_possible(500)" in inspect.getsource(pywsgi.WSGIHandler.handle_error)
    # run_application marks a body it lingered on so that pywsgi does not read it to its end.
    assert "self.run_application()" in one_response and "self.wsgi_input._discard()" in one_response
    assert "if self._chunked_input_error:" in inspect.getsource(pywsgi.Input._discard)
    assert "self.log_request()" in inspect.getsource(pywsgi.WSGIHandler.handle)
    assert issubclass(pywsgi._InvalidClientInput, OSError) and callable(pywsgi.headers_factory)
    # Where simple-websocket finds the socket of a connection served by gevent.
    assert "wsgi_input.raw._sock" in inspect.getsource(simple_websocket.Server.__init__)


def test_the_settings_it_copies_are_gunicorn_conf_s_and_gunicorn_s():
    settings = {node.targets[0].id: node.value
                for node in ast.parse((ROOT / "gunicorn.conf.py").read_text()).body
                if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id in ("keepalive", "graceful_timeout", "worker_connections", "access_log_format")}
    access_log_format = settings.pop("access_log_format")
    assert {name: ast.literal_eval(value) for name, value in settings.items()} == {
        "keepalive": devserver.KEEPALIVE_SECONDS, "graceful_timeout": devserver.GRACEFUL_SECONDS,
        "worker_connections": devserver.WORKER_CONNECTIONS}
    # gunicorn.conf.py's access_log_format is the access log's own (serving/accesslog.py).
    assert isinstance(access_log_format, ast.Name) and access_log_format.id == "SERVICE_FORMAT"
    assert accesslog.SERVICE_FORMAT == devserver.ACCESS_LOG_FORMAT
    assert (gunicorn.config.LimitRequestLine.default, gunicorn.config.LimitRequestFields.default,
            gunicorn.config.LimitRequestFieldSize.default) == (
        devserver.LIMIT_REQUEST_LINE, devserver.LIMIT_REQUEST_FIELDS, devserver.LIMIT_REQUEST_FIELD_SIZE)


@pytest.fixture(scope="module")
def fallback(tmp_path_factory):
    """The fallback server with LOG_FORMAT=json on a database that has a key (so no demo banner),
    with PROMETHEUS_MULTIPROC_DIR set as for gunicorn."""
    tmp_path = tmp_path_factory.mktemp("devserver")
    env = service_env(tmp_path, LOG_FORMAT="json")
    server_key = make_key(env)
    with serving(tmp_path, dict(env, PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "metrics")), "fallback") as server:
        server.key = server_key
        server.metrics_dir = tmp_path / "metrics"
        yield server


def access_lines(server):
    return [line for line in json_lines(server) if line["logger"] == "serving.devserver.access"]


def raw_request(server, data, close_writing=False):
    host, port = server.base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as connection:
        connection.sendall(data)
        if close_writing:
            connection.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    return answer.decode("latin-1")


def test_the_start_line_names_the_server_and_why(fallback):
    starts = [line for line in json_lines(fallback) if "gevent's WSGI server" in line["message"]]
    assert [(line["logger"], line["level"], line["message"]) for line in starts] == [(
        "serving.devserver", "INFO",
        "gunicorn is not available (No module named 'gunicorn' (refused by tests/fixtures/no_gunicorn)): serving "
        f"with gevent's WSGI server, one process, on {fallback.base} (pid {fallback.process.pid})")]
    # gevent patched the standard library before anything it patches was in use.
    assert "MonkeyPatchWarning" not in fallback.output()


def test_json_access_lines_carry_the_request_and_never_a_key(fallback):
    key = fallback.key
    requests.get(f"{fallback.base}/api/v1/ws/time?api_key={key}", headers={"X-Request-ID": "json-1"}, timeout=10)
    requests.get(f"{fallback.base}/api/v1/{key}", headers={"X-Request-ID": "json-2"}, timeout=10)
    ok = requests.get(f"{fallback.base}/api/v1/protected/test", headers={"X-API-Key": key, "X-Request-ID": key},
                      timeout=10)
    assert NEW_ID.fullmatch(ok.headers["X-Request-ID"])
    wait_for(lambda: any(line["request_id"] == ok.headers["X-Request-ID"] for line in access_lines(fallback)))
    by_id = {line["request_id"]: line for line in access_lines(fallback)}
    refused = by_id["json-1"]
    assert {name: refused[name] for name in ("method", "path", "status", "remote_addr")} == {
        "method": "GET", "path": "/api/v1/ws/time", "status": 426, "remote_addr": "127.0.0.1"}
    assert refused["duration_ms"] > 0 and refused["bytes"] > 0 and refused["message"] == "GET /api/v1/ws/time 426"
    assert by_id["json-2"]["path"] == "/api/v1/sk_live_[redacted]" and by_id["json-2"]["status"] == 404
    assert by_id[ok.headers["X-Request-ID"]]["status"] == 200
    assert all({"time", "level", "message", "logger", "pid"} <= line.keys() for line in json_lines(fallback))
    text = fallback.output()
    assert key not in text and key.removeprefix("sk_live_") not in text


@pytest.mark.parametrize("request_head, status, code", [
    (b"NOT A REQUEST\r\n\r\n", 400, "bad_request"),
    (b"GET / HTTP/1.1\r\nContent-Length: x\r\n\r\n", 400, "bad_request"),
    (b"GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 400, "bad_request"),
    (b"GET / HTTP/1.1\r\nX-Folded: a\r\n b\r\n\r\n", 400, "bad_request"),
    (b"GET /" + b"a" * 5000 + b" HTTP/1.1\r\n\r\n", 414, "uri_too_long"),
])
def test_refusals_are_json_with_an_id_their_log_line_carries(fallback, request_head, status, code):
    answer = raw_request(fallback, request_head)
    head, _, body = answer.partition("\r\n\r\n")
    assert head.startswith(f"HTTP/1.1 {status} ")
    assert "Cache-Control: no-store\r\n" in head and "X-Content-Type-Options: nosniff\r\n" in head
    assert json.loads(body)["error"]["code"] == code
    request_id = re.search(r"X-Request-ID: (\S+)", head)[1]
    assert NEW_ID.fullmatch(request_id)
    wait_for(lambda: any(line.get("request_id") == request_id for line in json_lines(fallback)))
    lines = [line for line in json_lines(fallback) if line.get("request_id") == request_id]
    assert [(line["logger"], line["level"]) for line in lines] == [("serving.devserver", "WARNING")]
    assert lines[0]["message"].startswith("Invalid request from 127.0.0.1: ")


@pytest.mark.parametrize("partial_head", [b"GET /api/v1/status HTTP/1.1\r\nHost: x", b"GET /api/v1/sta"])
def test_a_client_gone_inside_its_head_is_let_go_without_an_answer(fallback, partial_head):
    assert raw_request(fallback, partial_head, close_writing=True) == ""
    assert requests.get(fallback.base + "/api/v1/status", timeout=10).status_code == 200


def test_metrics_and_readiness_in_one_process(fallback):
    year = {"endpoint": "/api/v1/demo/year", "method": "GET", "status": "200"}
    served = metric(fallback, "http_requests_total", **year)
    for _ in range(3):
        requests.get(fallback.base + "/api/v1/demo/year", timeout=10)
    assert metric(fallback, "http_requests_total", **year) == served + 3
    upgrades = {"endpoint": "/api/v1/ws/echo", "method": "GET", "status": "101"}
    upgraded = metric(fallback, "http_requests_total", **upgrades)
    echo = websocket.create_connection(fallback.base.replace("http", "ws") + "/api/v1/ws/echo", timeout=10)
    wait_for(lambda: metric(fallback, "websocket_connections", socket="echo") == 1)
    echo.close()
    wait_for(lambda: metric(fallback, "websocket_connections", socket="echo") == 0)
    wait_for(lambda: metric(fallback, "http_requests_total", **upgrades) == upgraded + 1)
    # One process sums nothing: gunicorn's folder for the workers' metrics is not used.
    assert not fallback.metrics_dir.exists()
    ready = requests.get(fallback.base + "/readyz", timeout=10)
    assert (ready.status_code, ready.json()) == (200, {"status": "ready",
                                                        "checks": {"database": "ok", "limit_storage": "ok"}})


def test_a_request_head_gets_keepalive_seconds_in_all(fallback):
    """A head sent a byte a second is cut off after KEEPALIVE_SECONDS, as gunicorn's worker does (the
    whole head would take ~50 s: the bound leaves a loaded machine some seconds of its own)."""
    host, port = fallback.base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as connection:
        started = time.monotonic()
        closed_after = None
        for byte in b"GET /api/v1/status HTTP/1.1\r\nX-Slow: " + b"x" * 20:
            try:
                connection.sendall(bytes([byte]))
                connection.settimeout(1)
                if connection.recv(1) == b"":
                    closed_after = time.monotonic() - started
                    break
            except socket.timeout:
                continue
            except OSError:
                closed_after = time.monotonic() - started
                break
    assert closed_after is not None
    assert devserver.KEEPALIVE_SECONDS - 1 < closed_after < devserver.KEEPALIVE_SECONDS + 10


def close_code(ws):
    while True:
        opcode, data = ws.recv_data(control_frame=True)
        if opcode == websocket.ABNF.OPCODE_CLOSE:
            return int.from_bytes(data[:2], "big")


def test_ctrl_c_writes_every_count_closes_sockets_with_1001_and_ends_idle_connections_at_once(tmp_path):
    env = service_env(tmp_path)
    key = make_key(env)
    server = start_server(tmp_path, env, "fallback")
    try:
        clock = websocket.create_connection(server.base.replace("http", "ws") + f"/api/v1/ws/time?api_key={key}",
                                            timeout=10)
        assert json.loads(clock.recv())["type"] == "auth_success"
        echo = websocket.create_connection(server.base.replace("http", "ws") + "/api/v1/ws/echo", timeout=10)
        with requests.Session() as session:
            statuses = {session.get(server.base + "/api/v1/protected/test", headers={"X-API-Key": key}).status_code
                        for _ in range(200)}
            # The last counts are still in memory (written once a second), and the session's
            # connection stays open, idle.
            server.process.send_signal(signal.SIGINT)
            stopping = time.monotonic()
            assert (close_code(clock), close_code(echo)) == (1001, 1001)
            assert server.process.wait(timeout=devserver.KEEPALIVE_SECONDS) == 0
            assert time.monotonic() - stopping < devserver.KEEPALIVE_SECONDS - 1
    finally:
        server.stop()
    assert statuses == {200}
    assert stored_total(env["DATABASE_URL"], key) == 201  # with the time socket's handshake
    output = server.output()
    assert "Stopped; usage counts written." in output and "Traceback" not in output


def test_where_gunicorn_fails_on_fcntl_as_on_windows_the_fallback_serves(tmp_path):
    """gunicorn imported part of the way before the patching, as on Windows (up to its `import
    fcntl`): the fallback still serves REST and both sockets, and stops with 1001."""
    port = free_port()
    env = service_env(tmp_path, PORT=str(port),
                      PYTHONPATH=str(ROOT / "tests" / "fixtures" / "gunicorn_without_fcntl"))
    server = Server([sys.executable, "app.py"], env, port, tmp_path / "app.log", "fallback")
    try:
        output = server.output()
        assert ("gunicorn is not available (No module named 'fcntl'): serving with gevent's WSGI server, one "
                f"process, on {server.base}") in output
        secret = re.search(r"sk_test_[A-Za-z0-9]{32,}", output)[0]
        test = requests.get(server.base + "/api/v1/protected/test", headers={"X-API-Key": secret}, timeout=10)
        assert test.json()["api_key_name"] == "Demo key"
        sockets = server.base.replace("http", "ws") + "/api/v1/ws"
        clock = websocket.create_connection(f"{sockets}/time?api_key={secret}", timeout=10)
        assert json.loads(clock.recv())["type"] == "auth_success"
        echo = websocket.create_connection(f"{sockets}/echo", timeout=10)
        echo.send("hello")
        assert json.loads(echo.recv())["message"] == "hello"
        server.process.send_signal(signal.SIGINT)
        assert (close_code(clock), close_code(echo)) == (1001, 1001)
        assert server.process.wait(timeout=10) == 0
    finally:
        server.stop()
    output = server.output()
    assert "Traceback" not in output and "MonkeyPatchWarning" not in output


def test_each_connection_is_sent_without_waiting_for_acks():
    """TCP_NODELAY on every accepted connection, as gunicorn sets it: a kept-alive request of
    python app.py took ~48 ms without it, gunicorn's 8 ms."""
    server = devserver.Server(("127.0.0.1", 0), lambda environ, start_response: [])
    seen = []

    class Recorder:
        def __init__(self, sock, address, server):
            seen.append(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))

        def handle(self):
            pass

    server.handler_class = Recorder
    with socket.create_server(("127.0.0.1", 0)) as listener, \
            socket.create_connection(listener.getsockname()) as client:
        accepted, address = listener.accept()
        with accepted:
            server.handle(accepted, address)
    assert client and seen == [1]

