"""The real thing: the Procfile's gunicorn command (gevent worker) and `python app.py` on free
ports, driven over HTTP by `requests`, with keys made by the real CLI. The tests that take
`run_mode` run against both run modes (tests/conftest.py); those without it are about gunicorn's
own workers or answers. The tests that take `server` share one per database and run mode, each
with keys of its own; those that stop or restart a server start their own on the same database."""

import concurrent.futures
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
import requests
from liveserver import (
    Server,
    assert_served_and_stored,
    cli,
    free_port,
    make_key,
    service_env,
    start_procfile,
    start_server,
    stored_total,
    usernames,
    wait_for,
    without_gunicorn,
)
from serverfixtures import each_run_mode, env_on_each_database

env = env_on_each_database
server_mode = each_run_mode


def test_procfile_runs_gunicorn_with_the_gevent_worker_of_serving_worker(tmp_path, env):
    server = start_procfile(tmp_path, env)
    try:
        assert "Using worker: serving.worker.Worker" in server.output()
        assert requests.get(server.base + "/api/v1/status", timeout=10).json() == {
            "status": "operational", "version": "1.2.0", "authenticated": False}
    finally:
        server.stop()


def test_every_endpoint_over_http(server, env, commands):
    username = next(usernames)
    key = make_key(env, commands=commands, user=username)
    headers = {"X-API-Key": key}
    year = requests.get(server.base + "/api/v1/demo/year", timeout=10).json()
    assert year["year"] == time.gmtime().tm_year
    assert requests.get(server.base + "/api/v1/status", headers=headers, timeout=10).json()["authenticated"] is True
    test = requests.get(server.base + "/api/v1/protected/test", headers=headers, timeout=10)
    assert test.status_code == 200
    assert test.json()["api_key_type"] == "production"
    assert test.headers["RateLimit-Policy"] == '"free";q=100000;w=3600'
    me = requests.get(server.base + "/api/v1/user/me", headers=headers, timeout=10).json()
    assert (me["username"], me["api_key_count"]) == (username, 1)
    stats = requests.get(server.base + "/api/v1/usage/stats", headers=headers, timeout=10)
    assert stats.json()["total_requests"] == 3
    assert stats.json()["requests_remaining"] == int(stats.headers["X-RateLimit-Remaining"]) == 99997
    missing = requests.get(server.base + "/api/v1/protected/test", timeout=10)
    assert missing.status_code == 401
    assert missing.json()["error"]["code"] == "missing_api_key"
    assert missing.headers["Content-Type"] == "application/json"
    assert requests.get(server.base + "/api/v1/nope", timeout=10).json()["error"]["code"] == "not_found"


def test_rate_limit_over_http(server, env, commands):
    headers = {"X-API-Key": make_key(env, tier="tiny", commands=commands)}
    statuses = [requests.get(server.base + "/api/v1/protected/test", headers=headers, timeout=10).status_code
                for _ in range(4)]
    assert statuses == [200, 200, 429, 429]
    refused = requests.get(server.base + "/api/v1/usage/stats", headers=headers, timeout=10)
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert 1 <= int(refused.headers["Retry-After"]) <= 60


def test_revocation_by_cli_takes_effect_on_the_next_request(server, env, commands):
    key = make_key(env, commands=commands)
    headers = {"X-API-Key": key}
    assert requests.get(server.base + "/api/v1/protected/test", headers=headers, timeout=10).status_code == 200
    key_id = next(line.split("\t")[0] for line in commands("keys", "list", "carol").splitlines()
                  if f"\t{key[:12]}...\t" in line)
    commands("keys", "revoke", key_id)
    refused = requests.get(server.base + "/api/v1/protected/test", headers=headers, timeout=10)
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "invalid_api_key"


def test_user_me_and_usage_stats_see_a_command_s_change_on_the_next_request(server, env, commands):
    """Their answers are kept while nothing is committed (store/kept.py): a command's commit is seen."""
    username = next(usernames)
    headers = {"X-API-Key": make_key(env, commands=commands, user=username)}

    def get(path):
        return requests.get(f"{server.base}/api/v1/{path}", headers=headers, timeout=10).json()

    assert [get("user/me")["api_key_count"] for _ in range(3)] == [1, 1, 1]
    make_key(env, commands=commands, user=username)
    assert get("user/me")["api_key_count"] == 2
    newest = max(int(line.split("\t")[0]) for line in commands("keys", "list", username).splitlines())
    commands("keys", "revoke", str(newest))
    assert get("user/me")["api_key_count"] == 1
    assert [get("usage/stats")["total_requests"] for _ in range(3)] == [6, 7, 8]


@pytest.mark.parametrize("value", ["sk_live_" + "a" * 4000, "sk_live_\xe9\xe9" + "a" * 40,
                                   "sk_live_" + "a" * 40 + "\t"])
def test_odd_key_headers_get_a_json_401(server, value):
    response = requests.get(server.base + "/api/v1/protected/test", headers={"X-API-Key": value.encode("latin-1")},
                            timeout=10)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"


@pytest.mark.parametrize("value, status, code", [(b"a" * 100_000, 431, "request_header_fields_too_large"),
                                                 (b"sk_live_\x01\x7f" + b"a" * 40, 400, "bad_request")])
def test_headers_the_server_cannot_parse_get_its_json_4xx(server, value, status, code):
    response = requests.get(server.base + "/api/v1/protected/test", headers={"X-API-Key": value}, timeout=10)
    assert response.status_code == status
    assert response.headers["Content-Type"] == "application/json"
    assert response.json()["error"]["code"] == code


def test_exact_counts_under_concurrency_and_across_restarts(tmp_path, env, commands, run_mode):
    key = make_key(env, commands=commands)
    headers = {"X-API-Key": key}
    clients, per_client = 20, 50

    def hammer(_):
        with requests.Session() as session:
            return [session.get(f"{server.base}/api/v1/protected/test", headers=headers).status_code
                    for _ in range(per_client)]

    server = start_server(tmp_path, env, run_mode)
    try:
        with concurrent.futures.ThreadPoolExecutor(clients) as pool:
            statuses = [status for batch in pool.map(hammer, range(clients)) for status in batch]
        assert statuses == [200] * (clients * per_client)
        stats = requests.get(server.base + "/api/v1/usage/stats", headers=headers, timeout=10).json()
        assert stats["total_requests"] == clients * per_client + 1
    finally:
        assert server.stop(signal.SIGTERM) == 0

    for stop_signal in (signal.SIGINT, signal.SIGTERM):
        server = start_server(tmp_path, env, run_mode)
        try:
            stats = requests.get(server.base + "/api/v1/usage/stats", headers=headers, timeout=10).json()
        finally:
            server.stop(stop_signal)
        expected = clients * per_client + 2 if stop_signal == signal.SIGINT else clients * per_client + 3
        assert stats["total_requests"] == expected
    assert f"\t{key[:12]}...\t" in commands("keys", "list", "carol")


def test_python_app_py_seeds_a_demo_key_once(tmp_path, run_mode):
    port = free_port()
    env = service_env(tmp_path, PORT=str(port))
    env.pop("PUBLIC_RATE_LIMIT")
    if run_mode == "fallback":
        env = without_gunicorn(env)
    server = Server([sys.executable, "app.py"], env, port, tmp_path / "app-py.log", run_mode)
    try:
        output = server.output()
        secret = re.search(r"^\s+(sk_test_[A-Za-z0-9]{32,})$", output, re.M)[1]
        curl = re.search(r"^\s+(curl .*)$", output, re.M)[1]
        assert curl == f'curl -H "X-API-Key: {secret}" http://127.0.0.1:{port}/api/v1/protected/test'
        response = requests.get(shlex.split(curl)[-1], headers={"X-API-Key": secret}, timeout=10)
        assert response.json()["api_key_name"] == "Demo key"
        if run_mode == "gunicorn":
            assert "Using worker: serving.worker.Worker" in output
            assert f"Listening at: http://127.0.0.1:{port}" in output
        else:
            assert f"serving with gevent's WSGI server, one process, on http://127.0.0.1:{port}" in output
        assert "To make a new demo key" not in output
    finally:
        assert server.stop(signal.SIGINT) == 0
    assert output.count(secret) == 2

    server = Server([sys.executable, "app.py"], env, port, tmp_path / "app-py-2.log", run_mode)
    try:
        output = server.output()
        assert "sk_test_" not in output
        stats = requests.get(server.base + "/api/v1/usage/stats", headers={"X-API-Key": secret}, timeout=10).json()
        assert stats["total_requests"] == 2
        # The line to make a new demo key, which works as printed.
        command = re.search(r"^To make a new demo key: (flask .*)$", output, re.M)[1]
        assert shlex.split(command)[:3] == ["flask", "--app", "app"]
        new_secret = cli(env, *shlex.split(command)[3:]).strip().splitlines()[-1]
        assert requests.get(server.base + "/api/v1/protected/test", headers={"X-API-Key": new_secret},
                            timeout=10).json()["api_key_type"] == "development"
    finally:
        server.stop()


def test_access_log_has_no_query_string(server):
    line = '"GET /api/v1/status HTTP/1.1" 200'
    before = server.output().count(line)
    requests.get(server.base + "/api/v1/status?api_key=sk_test_" + "q" * 40, timeout=10)
    wait_for(lambda: server.output().count(line) > before)
    assert "qqqq" not in server.output()


def status_of(url):
    """The status of a GET, or None while no worker answers in time (its replacement still loading,
    which takes seconds on a loaded machine)."""
    try:
        return requests.get(url, timeout=10).status_code
    except requests.RequestException:
        return None


def test_a_killed_worker_loses_at_most_its_pending_counts(tmp_path, env, commands):
    key = make_key(env, commands=commands)
    headers = {"X-API-Key": key}
    server = start_procfile(tmp_path, env)
    try:
        assert_served_and_stored(server, env, key, 100)
        for _ in range(50):
            requests.get(server.base + "/api/v1/protected/test", headers=headers, timeout=10)
        worker = int(subprocess.check_output(["pgrep", "-P", str(server.process.pid)]).split()[0])
        os.kill(worker, signal.SIGKILL)
        wait_for(lambda: status_of(server.base + "/api/v1/status") == 200)
        assert requests.get(server.base + "/api/v1/protected/test", headers=headers, timeout=10).status_code == 200
    finally:
        server.stop()
    assert 101 <= stored_total(env["DATABASE_URL"], key) <= 151


def test_a_pipelining_client_cannot_hold_the_worker(server):
    """500 requests pipelined on one connection, then one request on another: the other is
    served in between, not after all 500 (the access log keeps the order of serving)."""
    host, port = server.base.removeprefix("http://").split(":")
    request = b"GET /api/v1/demo/year HTTP/1.1\r\nHost: x\r\n\r\n"
    start = len(server.output())  # the shared server's log before this test
    greedy = socket.create_connection((host, int(port)), timeout=30)
    replies = []
    # Reading all along keeps the greedy connection's replies from filling its buffer, which
    # would make its greenlet wait and let the other request in anyway.
    reader = threading.Thread(target=lambda: replies.append(read_until(greedy, b"HTTP/1.1 200 OK", 500)))
    reader.start()
    greedy.sendall(request * 500)
    assert requests.get(server.base + "/api/v1/openapi.json", timeout=30).status_code == 200
    reader.join(timeout=60)
    greedy.close()
    assert replies == [500]

    def served():
        return [line for line in server.output()[start:].splitlines()
                if "/api/v1/demo/year" in line or "/openapi" in line]

    wait_for(lambda: len(served()) == 501)
    assert "/api/v1/openapi.json" not in served()[-1]


def read_until(sock, marker, count):
    """Read from sock until marker has been seen count times; return how many were seen."""
    seen = b""
    while seen.count(marker) < count:
        chunk = sock.recv(65536)
        if not chunk:
            break
        seen += chunk
    return seen.count(marker)
