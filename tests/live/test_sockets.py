"""Both WebSockets against the real server in both run modes (the Procfile's gunicorn command, and
`python app.py`'s fallback server where gunicorn cannot be imported), with websocket-client."""

import datetime
import json
import os
import re
import signal
import socket
import sys
import time

import pytest
import requests
import websocket
from liveserver import Server, cli_session, free_port, make_key, service_env, start_server, without_gunicorn
from serverfixtures import each_run_mode, env_on_each_database

MS_TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
DISPLAY_TIME = "%Y-%m-%d %H:%M:%S UTC"


env = env_on_each_database
server_mode = each_run_mode


@pytest.fixture(scope="module")
def key(env, commands):
    return make_key(env, commands=commands)


def ws_url(server, path):
    return server.base.replace("http://", "ws://") + path


def connect(server, path, **options):
    return websocket.create_connection(ws_url(server, path), timeout=10, **options)


def close_code(ws):
    """Read until the server's close frame; return its code."""
    while True:
        opcode, data = ws.recv_data(control_frame=True)
        if opcode == websocket.ABNF.OPCODE_CLOSE:
            return int.from_bytes(data[:2], "big")


def connect_when_free(server, path, seconds=60):
    """Connect, retrying while the server still counts sockets that were just closed (429)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return connect(server, path)
        except websocket.WebSocketBadStatusException as refused:
            assert refused.status_code == 429 and time.monotonic() < deadline
            time.sleep(0.1)


def refusal(server, path):
    with pytest.raises(websocket.WebSocketBadStatusException) as raised:
        connect(server, path)
    return raised.value


def test_echo_replies_in_order_with_the_contract_shape(server):
    ws = connect(server, "/api/v1/ws/echo")
    texts = ["hello", "", "ünïcødé ✓ 🚀", '{"json": "inside"}', "x" * 65536]
    for text in texts:
        ws.send(text)
    replies = [json.loads(ws.recv()) for _ in texts]
    ws.close()
    assert [reply["message"] for reply in replies] == texts
    for reply in replies:
        assert list(reply) == ["type", "message", "timestamp", "server_time"]
        assert reply["type"] == "echo"
        assert MS_TIMESTAMP.fullmatch(reply["timestamp"])
        datetime.datetime.strptime(reply["server_time"], DISPLAY_TIME)


def test_echo_closes_binary_frames_with_1003(server):
    ws = connect(server, "/api/v1/ws/echo")
    ws.send_binary(b"\x00\x01")
    assert close_code(ws) == 1003


@pytest.mark.parametrize("text", ["x" * 70_000, "x" * 1_000_000, "€" * 30_000])
def test_echo_closes_oversized_messages_with_1009(server, text):
    ws = connect(server, "/api/v1/ws/echo")
    ws.send(text)
    assert close_code(ws) == 1009


def test_one_socket_closing_leaves_others_alone(server):
    bystander = connect(server, "/api/v1/ws/echo")
    offender = connect(server, "/api/v1/ws/echo")
    offender.send_binary(b"\x00")
    assert close_code(offender) == 1003
    bystander.send("still here")
    assert json.loads(bystander.recv())["message"] == "still here"
    bystander.close()


def test_time_socket_streams_whole_seconds(server, key):
    ws = connect(server, f"/api/v1/ws/time?api_key={key}")
    assert json.loads(ws.recv()) == {"type": "auth_success", "api_key_name": "free key"}
    ticks = [json.loads(ws.recv()) for _ in range(4)]
    ws.close()
    seconds = []
    for tick in ticks:
        assert list(tick) == ["type", "formatted", "timestamp"]
        assert tick["type"] == "time_update"
        formatted = datetime.datetime.strptime(tick["formatted"], DISPLAY_TIME)
        sent = datetime.datetime.strptime(tick["timestamp"], "%Y-%m-%dT%H:%M:%S.%fZ")
        assert sent.replace(microsecond=0) == formatted
        seconds.append(formatted)
    assert [b - a for a, b in zip(seconds, seconds[1:])] == [datetime.timedelta(seconds=1)] * 3


@pytest.mark.parametrize("query, code", [
    ("", "missing_api_key"),
    ("?api_key=", "missing_api_key"),
    ("?api_key=nonsense", "invalid_api_key"),
    ("?api_key=sk_live_" + "Z" * 40, "invalid_api_key"),
])
def test_time_socket_refuses_bad_keys_before_upgrading(server, query, code):
    refused = refusal(server, "/api/v1/ws/time" + query)
    assert refused.status_code == 401
    assert json.loads(refused.resp_body)["error"]["code"] == code
    assert refused.resp_headers["content-type"] == "application/json"
    assert refused.resp_headers["www-authenticate"].startswith("ApiKey")


def test_time_socket_ignores_a_key_header(server, key):
    with pytest.raises(websocket.WebSocketBadStatusException) as raised:
        connect(server, "/api/v1/ws/time", header=[f"X-API-Key: {key}"])
    assert raised.value.status_code == 401


def test_handshake_counts_as_a_request(server, key):
    headers = {"X-API-Key": key}
    before = requests.get(server.base + "/api/v1/usage/stats", headers=headers, timeout=10).json()["total_requests"]
    connect(server, f"/api/v1/ws/time?api_key={key}").close()
    refusal(server, "/api/v1/ws/time?api_key=" + key[:-1] + "!")
    after = requests.get(server.base + "/api/v1/usage/stats", headers=headers, timeout=10).json()["total_requests"]
    assert after == before + 2


def test_time_socket_over_the_limit_gets_429(server, env, commands):
    key = make_key(env, tier="tiny", commands=commands)
    for _ in range(2):
        connect(server, f"/api/v1/ws/time?api_key={key}").close()
    refused = refusal(server, f"/api/v1/ws/time?api_key={key}")
    assert refused.status_code == 429
    assert json.loads(refused.resp_body)["error"]["code"] == "rate_limit_exceeded"
    assert int(refused.resp_headers["retry-after"]) >= 1


def test_at_most_ten_time_sockets_per_key(server, env, commands):
    key = make_key(env, commands=commands)
    sockets = [connect(server, f"/api/v1/ws/time?api_key={key}") for _ in range(10)]
    refused = refusal(server, f"/api/v1/ws/time?api_key={key}")
    assert refused.status_code == 429
    assert json.loads(refused.resp_body)["error"]["code"] == "too_many_connections"
    sockets.pop().close()
    sockets.append(connect_when_free(server, f"/api/v1/ws/time?api_key={key}"))
    for ws in sockets:
        ws.close()


def test_revoked_key_closes_its_socket_with_4401(server, env, commands):
    key = make_key(env, commands=commands)
    ws = connect(server, f"/api/v1/ws/time?api_key={key}")
    assert json.loads(ws.recv())["type"] == "auth_success"
    key_id = next(line.split("\t")[0] for line in commands("keys", "list", "carol").splitlines()
                  if f"\t{key[:12]}...\t" in line)
    commands("keys", "revoke", key_id)
    ws.settimeout(60)
    assert close_code(ws) == 4401


def test_socket_logs_never_contain_the_key(server, key):
    connect(server, f"/api/v1/ws/time?api_key={key}").close()
    refusal(server, f"/api/v1/ws/time?api_key={key}x")
    server.wait_for_output("/api/v1/ws/time closed after")
    output = server.wait_for_output('"GET /api/v1/ws/time HTTP/1.1" 401')
    assert key not in output and key[12:] not in output


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT])
def test_shutdown_closes_sockets_with_1001(tmp_path, stop_signal, run_mode):
    env = service_env(tmp_path)
    with cli_session(env) as commands:
        key = make_key(env, commands=commands)
    server = start_server(tmp_path, env, run_mode)
    try:
        echo = connect(server, "/api/v1/ws/echo")
        clock = connect(server, f"/api/v1/ws/time?api_key={key}")
        clock.recv()
        server.process.send_signal(stop_signal)
        assert close_code(echo) == 1001
        assert close_code(clock) == 1001
    finally:
        assert server.stop() == 0


def test_stop_signals_repeated_until_the_process_ends_still_end_it_with_status_0(tmp_path, run_mode):
    """A platform may signal the process, then its whole group: a stop signal that arrives while the
    process stops (its interpreter ending included) changes nothing."""
    server = start_server(tmp_path, service_env(tmp_path), run_mode)
    try:
        while server.process.poll() is None:
            os.killpg(server.process.pid, signal.SIGTERM)
            time.sleep(0.001)
        assert server.process.returncode == 0
    finally:
        server.stop()


def test_python_app_py_gives_the_same_close_codes(tmp_path, run_mode):
    port = free_port()
    env = service_env(tmp_path, PORT=str(port))
    if run_mode == "fallback":
        env = without_gunicorn(env)
    server = Server([sys.executable, "app.py"], env, port, tmp_path / "app-py.log", run_mode)
    try:
        secret = re.search(r"sk_test_[A-Za-z0-9]{32,}", server.output())[0]
        clock = connect(server, f"/api/v1/ws/time?api_key={secret}")
        assert json.loads(clock.recv())["api_key_name"] == "Demo key"
        echo = connect(server, "/api/v1/ws/echo")
        echo.send_binary(b"\x00")
        assert close_code(echo) == 1003
        server.process.send_signal(signal.SIGINT)
        assert close_code(clock) == 1001
        # SIGINT alone stops it. A second signal meant to clean up could reach the process after
        # the interpreter has put the default handlers back on its way out, and end it with -15.
        assert server.process.wait(timeout=30) == 0
    finally:
        server.stop()


def test_vanished_clients_free_their_slots(server, env, commands):
    key = make_key(env, commands=commands)
    for _ in range(30):
        ws = connect(server, f"/api/v1/ws/time?api_key={key}")
        ws.recv()
        ws.sock.close()  # gone without a close frame
    sockets = [connect_when_free(server, f"/api/v1/ws/time?api_key={key}") for _ in range(10)]
    for ws in sockets:
        ws.close()


def test_echo_sockets_are_capped_per_ip(server):
    # Slots of the sockets earlier tests closed may take a moment to free.
    sockets = [connect_when_free(server, "/api/v1/ws/echo") for _ in range(50)]
    try:
        refused = refusal(server, "/api/v1/ws/echo")
        assert refused.status_code == 429
        assert json.loads(refused.resp_body)["error"]["code"] == "too_many_connections"
        sockets[0].send("the others still work")
        assert json.loads(sockets[0].recv())["message"] == "the others still work"
    finally:
        for ws in sockets:
            ws.close()


def test_slow_clients_do_not_hold_up_others(server):
    port = int(server.base.rsplit(":", 1)[1])
    slow = []
    try:
        for _ in range(200):
            connection = socket.create_connection(("127.0.0.1", port))
            connection.sendall(b"GET /api/v1/status HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            slow.append(connection)
        response = requests.get(server.base + "/api/v1/status", timeout=10)
        assert response.status_code == 200
        ws = connect(server, "/api/v1/ws/echo")
        ws.send("through")
        assert json.loads(ws.recv())["message"] == "through"
        ws.close()
    finally:
        for connection in slow:
            connection.close()


def send_fragmented(ws, parts):
    for index, part in enumerate(parts):
        opcode = websocket.ABNF.OPCODE_TEXT if index == 0 else websocket.ABNF.OPCODE_CONT
        ws.send_frame(websocket.ABNF.create_frame(part, opcode, fin=int(index == len(parts) - 1)))


def test_fragmented_messages_are_echoed_whole(server):
    ws = connect(server, "/api/v1/ws/echo")
    whole = "fragmented ✓".encode()
    send_fragmented(ws, [whole[:4], whole[4:12], whole[12:]])  # the cut falls inside the ✓
    assert json.loads(ws.recv())["message"] == "fragmented ✓"
    ws.close()


def test_fragments_adding_up_to_too_much_close_with_1009(server):
    ws = connect(server, "/api/v1/ws/echo")
    send_fragmented(ws, [b"x" * 40_000, b"x" * 40_000])
    assert close_code(ws) == 1009
