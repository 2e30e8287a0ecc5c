"""The key lifecycle on the real server in both run modes, on SQLite and PostgreSQL: a key
that expires while its time socket is open, scopes on the time socket, a roll through the CLI
during and after its grace period, and leaked-key revocation."""

import functools
import sqlite3
import time
from urllib.parse import urlparse

import pytest
import requests
import websocket
from liveserver import cli, service_env, serving, stored_total, wait_for
from serverfixtures import each_run_mode


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def env(request, tmp_path_factory):
    env = service_env(tmp_path_factory.mktemp("lifecycle"), request.param)
    cli(env, "users", "create", "dora", "--email", "dora@example.com", "--password-stdin",
        stdin="a long password\n")
    return env


server_mode = each_run_mode


def create(commands, *options):
    """A production key of dora's, made by commands (a CliSession, or a function that runs the CLI)."""
    return commands("keys", "create", "dora", "--name", "live key", "--type", "production",
                    *options).strip().splitlines()[-1]


def status(server, secret, path="/api/v1/protected/test"):
    return requests.get(server.base + path, headers={"X-API-Key": secret}, timeout=10).status_code


def close_code(ws):
    while True:
        opcode, data = ws.recv_data(control_frame=True)
        if opcode == websocket.ABNF.OPCODE_CLOSE:
            return int.from_bytes(data[:2], "big")


def test_a_key_that_expires_fails_and_its_socket_closes_with_4401(server, commands):
    # 5 s: time to open the socket and make a request before the end, on a loaded machine too.
    secret = create(commands, "--expires-in", "5s")
    started = time.monotonic()
    ws = websocket.create_connection(server.base.replace("http", "ws") + f"/api/v1/ws/time?api_key={secret}",
                                     timeout=20)
    assert status(server, secret) == 200
    assert close_code(ws) == 4401
    assert time.monotonic() - started < 5 + 10
    assert status(server, secret) == 401


def test_the_time_socket_needs_its_scope(server, commands):
    secret = create(commands, "--scopes", "test:read")
    with pytest.raises(websocket.WebSocketBadStatusException) as refused:
        websocket.create_connection(server.base.replace("http", "ws") + f"/api/v1/ws/time?api_key={secret}",
                                    timeout=10)
    assert refused.value.status_code == 403
    assert b'"insufficient_scope"' in refused.value.resp_body
    assert status(server, secret) == 200
    assert status(server, secret, "/api/v1/user/me") == 403


def test_a_roll_through_the_cli_keeps_the_old_secret_for_its_grace_period(server, commands):
    old = create(commands)
    key_id = commands("keys", "list", "dora").strip().splitlines()[-1].split("\t")[0]
    new = commands("keys", "roll", key_id, "--grace", "5s").strip().splitlines()[-1]
    rolled = time.monotonic()  # the grace ends at most 5 s from here
    assert status(server, old) == status(server, new) == 200
    time.sleep(max(0.0, rolled + 5 - time.monotonic()) + 0.5)
    assert status(server, old) == 401 and status(server, new) == 200


def test_a_leaked_key_is_revoked_by_whoever_holds_it(server, commands):
    secret = create(commands)
    response = requests.post(server.base + "/api/v1/keys/revoke", headers={"X-API-Key": secret}, timeout=10)
    assert response.status_code == 200
    assert response.json() == {"revoked": True, "api_key_name": "live key", "secret": "current"}
    assert status(server, secret) == 401


def test_a_socket_opened_with_a_rolled_out_secret_closes_with_4401(server, commands):
    old = create(commands)
    ws = websocket.create_connection(server.base.replace("http", "ws") + f"/api/v1/ws/time?api_key={old}",
                                     timeout=20)
    ws.recv()
    key_id = commands("keys", "list", "dora").strip().splitlines()[-1].split("\t")[0]
    new = commands("keys", "roll", key_id, "--grace", "0").strip().splitlines()[-1]
    started = time.monotonic()
    assert close_code(ws) == 4401
    assert time.monotonic() - started < 10
    assert status(server, new) == 200


def test_a_write_lock_held_by_another_process_leaves_the_worker_serving(tmp_path, run_mode):
    # As `db prune` in another process holds SQLite's write lock for each batch: the worker's usage
    # flush waits for it, and must not stop the worker's other requests meanwhile.
    env = service_env(tmp_path)
    cli(env, "users", "create", "dora", "--email", "dora@example.com", "--password-stdin", stdin="a long password\n")
    secret = create(functools.partial(cli, env))
    with serving(tmp_path, env, run_mode) as server:
        assert status(server, secret) == 200
        made, slowest = 1, 0.0
        holder = sqlite3.connect(urlparse(env["DATABASE_URL"]).path[1:], isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            held_until = time.monotonic() + 5
            while time.monotonic() < held_until:
                started = time.monotonic()
                assert status(server, secret) == 200  # each one more count for the waiting flush
                slowest = max(slowest, time.monotonic() - started)
                made += 1
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        # A request that waited for the lock would wait seconds; one that did not, a few ms (the rest
        # is a loaded machine's margin).
        assert slowest < 2
        # Nothing was lost: the flush wrote every count once the lock was free.
        wait_for(lambda: stored_total(env["DATABASE_URL"], secret) == made)
        stats = requests.get(server.base + "/api/v1/usage/stats", headers={"X-API-Key": secret}, timeout=10)
    assert stats.json()["total_requests"] == made + 1
