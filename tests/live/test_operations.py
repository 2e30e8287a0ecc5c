"""Operations against the real server: the Procfile's gunicorn with two gevent workers and
LOG_FORMAT=json (metrics summed over both workers, the socket gauge, /metrics access, request ids,
JSON log lines), and /readyz while PostgreSQL or Redis is cut or hangs behind a TCP proxy."""

import json
import os
import re
import signal
import socket
import subprocess
import time

import pytest
import requests
import services
import websocket
from liveserver import (
    Server,
    free_port,
    make_key,
    metrics_folder,
    procfile_command,
    service_env,
    start_procfile,
    wait_for,
)
from readings import json_lines, metric, scrape
from tcpproxy import TcpProxy

from ops import metrics

TOKEN = "metrics-token-for-the-tests-0123"
NEW_ID = re.compile(r"[0-9a-f]{32}")


@pytest.fixture(scope="module")
def ops(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("operations")
    env = service_env(tmp_path, WEB_CONCURRENCY="2", LOG_FORMAT="json", METRICS_TOKEN=TOKEN)
    server = start_procfile(tmp_path, env)
    server.env = env
    server.key = make_key(env)
    server.tiny_key = make_key(env, "tiny")
    yield server
    server.stop()


def settled(read, seconds=60):
    """read()'s value once it stays the same over a fold (every worker folds its counts into the
    metrics once a second): every worker's earlier counts are in it. A fixed sleep of one fold
    assumed an idle machine, where no worker folds late."""
    deadline = time.monotonic() + seconds
    value = read()
    while True:
        time.sleep(metrics.FOLD_SECONDS + 0.5)
        value, previous = read(), value
        if value == previous:
            return value
        assert time.monotonic() < deadline, "the metrics never settled"


def access_lines(server):
    return [line for line in json_lines(server) if line["logger"] == "gunicorn.access"]


def test_counters_from_both_workers_are_summed(ops):
    before = settled(lambda: metric(ops, "http_requests_total", endpoint="/api/v1/demo/year", method="GET",
                                    status="200"))
    sent, pids = 0, set()
    # Each request on a connection of its own, so either worker may accept it.
    while len(pids) < 2 or sent < 50:
        assert sent < 2000, "one worker served every request"
        assert requests.get(ops.base + "/api/v1/demo/year", headers={"X-Request-ID": f"sum-{sent}"},
                            timeout=10).status_code == 200
        sent += 1
        if sent % 50 == 0:
            pids = {line["pid"] for line in access_lines(ops) if line.get("request_id", "").startswith("sum-")}
    # Each worker folds its counts into the metrics once a second.
    wait_for(lambda: metric(ops, "http_requests_total", endpoint="/api/v1/demo/year", method="GET",
                            status="200") == before + sent)
    found = scrape(ops)
    total = found[("http_requests_total", frozenset(
        {"endpoint": "/api/v1/demo/year", "method": "GET", "status": "200"}.items()))]
    assert total - before == sent
    buckets = {labels: count for (name, labels), count in found.items()
               if name == "http_request_duration_seconds_bucket" and ("endpoint", "/api/v1/demo/year") in labels}
    assert len(buckets) >= 10
    assert buckets[frozenset({"endpoint": "/api/v1/demo/year", "le": "+Inf"}.items())] == total


def test_the_socket_gauge_follows_opens_and_closes(ops):
    ws_base = ops.base.replace("http", "ws")
    before, upgrades = settled(lambda: (
        {name: metric(ops, "websocket_messages_sent_total", socket=name) for name in ("echo", "time")},
        metric(ops, "http_requests_total", endpoint="/api/v1/ws/echo", method="GET", status="101")))
    echoes = [websocket.create_connection(ws_base + "/api/v1/ws/echo", timeout=10,
                                          header=[f"X-Request-ID: echo-{n}"]) for n in range(3)]
    clocks = [websocket.create_connection(f"{ws_base}/api/v1/ws/time?api_key={ops.key}", timeout=10)
              for _ in range(2)]
    try:
        assert [ws.getheaders()["x-request-id"] for ws in echoes] == ["echo-0", "echo-1", "echo-2"]
        assert all(NEW_ID.fullmatch(ws.getheaders()["x-request-id"]) for ws in clocks)
        wait_for(lambda: (metric(ops, "websocket_connections", socket="echo"),
                          metric(ops, "websocket_connections", socket="time")) == (3, 2))
        for ws in echoes:
            ws.send("hello")
            assert json.loads(ws.recv())["message"] == "hello"
        for ws in clocks:
            assert json.loads(ws.recv())["type"] == "auth_success"
            assert json.loads(ws.recv())["type"] == "time_update"
        wait_for(lambda: metric(ops, "websocket_messages_sent_total", socket="echo") == before["echo"] + 3)
        wait_for(lambda: metric(ops, "websocket_messages_sent_total", socket="time") >= before["time"] + 4)
    finally:
        for ws in echoes + clocks:
            ws.close()
    wait_for(lambda: (metric(ops, "websocket_connections", socket="echo"),
                      metric(ops, "websocket_connections", socket="time")) == (0, 0))
    wait_for(lambda: metric(ops, "http_requests_total", endpoint="/api/v1/ws/echo", method="GET",
                            status="101") == upgrades + 3)
    # A socket's lifetime is not a request's latency.
    assert metric(ops, "http_request_duration_seconds_count", endpoint="/api/v1/ws/echo") == 0
    opened = [line for line in json_lines(ops) if line["message"].startswith("time socket opened for key")]
    handshake_ids = {ws.getheaders()["x-request-id"] for ws in clocks}
    assert {line.get("request_id") for line in opened[-2:]} == handshake_ids


@pytest.mark.parametrize("headers, status", [
    ({}, 200),
    ({"X-Forwarded-For": "203.0.113.7"}, 404),
    ({"X-Forwarded-For": "203.0.113.7", "Authorization": "Bearer not-the-token-0123456789"}, 404),
    ({"X-Forwarded-For": "203.0.113.7", "Authorization": f"Bearer {TOKEN}"}, 200),
])
def test_metrics_refused_to_other_clients_without_the_token(ops, headers, status):
    response = requests.get(ops.base + "/metrics", headers=headers, timeout=10)
    assert response.status_code == status
    if status == 404:
        assert response.json()["error"]["code"] == "not_found"
    else:
        assert "http_requests_total" in response.text


def test_a_forwarded_loopback_address_from_elsewhere_is_not_loopback(ops):
    """X-Forwarded-For is the client's own writing when it reaches gunicorn directly."""
    outside = subprocess.run(["hostname", "-I"], capture_output=True, text=True).stdout.split()
    if not outside:
        pytest.skip("this machine has no address besides loopback")
    port = ops.base.rsplit(":", 1)[1]
    direct = requests.get(f"http://{outside[0]}:{port}/metrics", headers={"X-Forwarded-For": "127.0.0.1"},
                          timeout=10)
    assert direct.status_code == 404


def test_rate_limited_requests_are_counted_by_policy(ops):
    before = metric(ops, "rate_limited_total", policy="tiny")
    # tiny is 2/minute and each worker keeps its own window: 5 requests are over in one of them.
    statuses = [requests.get(ops.base + "/api/v1/protected/test", headers={"X-API-Key": ops.tiny_key},
                             timeout=10).status_code for _ in range(5)]
    assert statuses.count(429) >= 1
    assert metric(ops, "rate_limited_total", policy="tiny") == before + statuses.count(429)


def test_usage_flushes_are_measured(ops):
    before = metric(ops, "usage_flush_duration_seconds_count")
    assert requests.get(ops.base + "/api/v1/protected/test", headers={"X-API-Key": ops.key},
                        timeout=10).status_code == 200
    wait_for(lambda: metric(ops, "usage_flush_duration_seconds_count") > before)
    assert ("usage_counts_pending", frozenset()) in scrape(ops)


def raw_request(server, data):
    with socket.create_connection(("127.0.0.1", int(server.base.rsplit(":", 1)[1])), timeout=10) as sock:
        sock.sendall(data)
        response = b""
        while chunk := sock.recv(65536):
            response += chunk
    return response.decode("latin-1")


def test_every_response_carries_a_request_id(ops):
    def request_id(path, **headers):
        return requests.get(ops.base + path, headers=headers, timeout=10).headers["X-Request-ID"]

    assert request_id("/api/v1/demo/year", **{"X-Request-ID": "client.id_1-A"}) == "client.id_1-A"
    for path in ("/api/v1/demo/year", "/no-such-page", "/api/v1/ws/echo", "/static/style.css", "/healthz"):
        assert NEW_ID.fullmatch(request_id(path)), path
    for bad in ("x" * 65, "two words", ops.key):
        assert NEW_ID.fullmatch(request_id("/healthz", **{"X-Request-ID": bad}))
    # Requests gunicorn refuses itself are answered by gunicorn, with an id that its log lines carry.
    # (A head its C parser cannot read, a bad Content-Length included, gets no access line: gunicorn
    # has no request to log. A request the app refuses, after its head was read, does.)
    for bad_request in (b"NOT A REQUEST\r\n\r\n", b"GET / HTTP/1.1\r\nContent-Length: x\r\n\r\n"):
        answer = raw_request(ops, bad_request)
        assert answer.startswith("HTTP/1.1 400")
        request_id = re.search(r"X-Request-ID: (\S+)", answer)[1]
        assert NEW_ID.fullmatch(request_id)
        wait_for(lambda: any(line.get("request_id") == request_id for line in json_lines(ops)))
        lines = [line for line in json_lines(ops) if line.get("request_id") == request_id]
        assert {line["logger"] for line in lines} == {"gunicorn.error"}


def test_a_worker_freezes_its_time_sockets_after_a_tick(ops):
    ws_base = ops.base.replace("http", "ws")

    def freezes():
        return metric(ops, "websocket_heap_collections_total", kind="freeze")

    before = settled(freezes)
    clocks = [websocket.create_connection(f"{ws_base}/api/v1/ws/time?api_key={ops.key}", timeout=10)
              for _ in range(4)]
    try:
        for ws in clocks:
            assert json.loads(ws.recv())["type"] == "auth_success"
            assert json.loads(ws.recv())["type"] == "time_update"
        wait_for(lambda: freezes() > before)
    finally:
        for ws in clocks:
            ws.close()


def test_json_log_lines_carry_the_request_and_never_a_key(ops):
    key = ops.key
    requests.get(f"{ops.base}/api/v1/ws/time?api_key={key}", headers={"X-Request-ID": "json-1"}, timeout=10)
    requests.get(f"{ops.base}/api/v1/{key}", timeout=10)
    requests.get(f"{ops.base}/api/v1/protected/test", headers={"X-API-Key": key, "X-Request-ID": key}, timeout=10)
    raw_request(ops, f"GET /api/v1/status?api_key={key} HTTP/1.1 trailing\r\n\r\n".encode())
    wait_for(lambda: any(line.get("request_id") == "json-1" for line in access_lines(ops)))
    lines = json_lines(ops)
    assert lines and all({"time", "level", "message", "logger", "pid"} <= line.keys() for line in lines)
    access = [line for line in lines if line["logger"] == "gunicorn.access"]
    assert access and all(
        {"request_id", "method", "path", "status", "duration_ms"} <= line.keys() and NEW_ID.fullmatch(
            line["request_id"]) or line["request_id"].startswith(("sum-", "echo-", "client.", "json-"))
        for line in access)
    refused = [line for line in access if line["request_id"] == "json-1"]
    assert len(refused) == 1
    assert refused[0]["path"] == "/api/v1/ws/time" and refused[0]["status"] == 426
    assert refused[0]["method"] == "GET" and refused[0]["duration_ms"] > 0
    text = ops.output()
    assert key not in text and key.removeprefix("sk_live_") not in text


def test_a_killed_worker_takes_its_sockets_out_of_the_gauge(ops):
    ws_base = ops.base.replace("http", "ws")
    # What every worker has folded into the metrics (once a second).
    served = settled(lambda: metric(ops, "http_requests_total", endpoint="/api/v1/demo/year", method="GET",
                                    status="200"))
    sockets = [websocket.create_connection(ws_base + "/api/v1/ws/echo", timeout=10) for _ in range(4)]
    try:
        wait_for(lambda: metric(ops, "websocket_connections", socket="echo") == 4)
        workers = subprocess.check_output(["pgrep", "-P", str(ops.process.pid)]).split()
        for pid in workers:
            os.kill(int(pid), signal.SIGKILL)
        # The master starts new workers; the dead ones' sockets leave the gauge, their counts stay.
        wait_for(lambda: metric(ops, "websocket_connections", socket="echo") == 0)
        assert metric(ops, "http_requests_total", endpoint="/api/v1/demo/year", method="GET", status="200") == served
    finally:
        for ws in sockets:
            ws.close()


def test_by_default_metrics_live_in_a_private_folder_removed_on_exit(tmp_path):
    env = service_env(tmp_path)
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    server = start_procfile(tmp_path, env)
    try:
        assert requests.get(server.base + "/healthz", timeout=10).status_code == 200
        assert metric(server, "http_requests_total", endpoint="/healthz", method="GET", status="200") == 1
        # Found by the files its workers map: other test runs' servers may make folders meanwhile.
        ours = metrics_folder(server.process.pid)
        assert os.path.dirname(ours) == "/dev/shm"
        assert os.stat(ours).st_mode & 0o777 == 0o700
    finally:
        server.stop()
    assert not os.path.exists(ours)


def test_metrics_start_afresh_with_the_server(tmp_path):
    env = service_env(tmp_path, PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "metrics"))
    settings, argv = procfile_command()
    for run in range(2):
        port = free_port()
        server = Server(argv, dict(env, **settings, PORT=str(port)), port, tmp_path / f"run-{run}.log")
        try:
            for _ in range(5):
                requests.get(server.base + "/healthz", timeout=10)
            assert metric(server, "http_requests_total", endpoint="/healthz", method="GET", status="200") == 5
        finally:
            server.stop()


@pytest.fixture(scope="module")
def proxied(tmp_path_factory):
    """A server (text logs) whose PostgreSQL and Redis are each behind a TCP proxy."""
    redis_url, database_url = services.redis_url(), services.postgres_url()
    tmp_path = tmp_path_factory.mktemp("readiness")
    postgres, redis = TcpProxy(services.POSTGRES), TcpProxy(services.redis_address(redis_url))
    env = service_env(tmp_path, DATABASE_URL=services.via(database_url, postgres.port),
                      RATELIMIT_STORAGE_URL=services.via(redis_url, redis.port))
    server = start_procfile(tmp_path, env)
    yield server, postgres, redis
    server.stop()
    postgres.close()
    redis.close()


def readyz(server, request_id=None):
    started = time.monotonic()
    response = requests.get(server.base + "/readyz", headers={"X-Request-ID": request_id} if request_id else {},
                            timeout=30)
    return response.status_code, response.json(), time.monotonic() - started


# A worker reuses its readiness answer for a second.
REUSE_SECONDS = 1.1
READY = (200, {"status": "ready", "checks": {"database": "ok", "limit_storage": "ok"}})


def test_readyz_turns_503_when_postgresql_or_redis_is_cut_and_back(proxied):
    server, postgres, redis = proxied
    assert readyz(server)[:2] == READY
    postgres.cut()
    time.sleep(REUSE_SECONDS)
    status, body, _ = readyz(server, "ready-pg-1")
    assert (status, body) == (503, {"status": "unavailable", "checks": {
        "database": "The database cannot be reached.", "limit_storage": "ok"}})
    assert requests.get(server.base + "/healthz", timeout=10).status_code == 200
    postgres.restore()
    wait_for(lambda: readyz(server)[:2] == READY)
    redis.cut()
    time.sleep(REUSE_SECONDS)
    status, body, _ = readyz(server)
    assert status == 503 and body["checks"]["database"] == "ok"
    assert body["checks"]["limit_storage"].startswith("The rate-limit storage ")
    redis.restore()
    wait_for(lambda: readyz(server)[:2] == READY)
    # Text logs: the access line ends with the request id, the app's lines show it in brackets.
    output = server.output()
    assert re.search(r'"GET /readyz HTTP/1.1" 503 \S+ \S+ ready-pg-1$', output, re.M)
    assert re.search(r"WARNING ops.health \[ready-pg-1\] Readiness: the database failed", output)


def test_readyz_gives_up_on_a_dependency_that_hangs(proxied):
    server, postgres, redis = proxied
    # Redis gives up on its own after its 1 s socket timeout; PostgreSQL would wait for ever.
    for proxy, check, sentence in ((postgres, "database", "The database did not answer within 2 seconds."),
                                   (redis, "limit_storage", "The rate-limit storage does not answer.")):
        wait_for(lambda: readyz(server)[:2] == READY)
        proxy.stall()
        time.sleep(REUSE_SECONDS)
        try:
            status, body, took = readyz(server)
            assert status == 503
            assert body["checks"][check] == sentence
            assert took < 4
            assert requests.get(server.base + "/healthz", timeout=10).status_code == 200
        finally:
            proxy.resume()
    wait_for(lambda: readyz(server)[:2] == READY)
