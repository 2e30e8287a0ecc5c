"""bench/sharedstores.py's arithmetic, what two INFO snapshots say other clients did and counts turned
into costs per request with the idle worker's own taken out, and its INFO snapshots of a real
redis-server."""

import shutil
import socket

import pytest
import services

from bench import sharedstores


def snapshot(commands, bytes_in, bytes_out, connections, calls, reply_bytes=4000):
    return {"commands": commands, "in": bytes_in, "out": bytes_out, "cpu": 1.0, "connections": connections,
            "clients": 2, "calls": calls, "request_bytes": 29, "reply_bytes": reply_bytes}


def test_the_snapshots_own_info_calls_bytes_and_connection_are_left_out():
    before = snapshot(100, 5_000, 90_000, 7, {"info": 3, "evalsha": 10, "get": 10}, reply_bytes=4_100)
    # Between them: 2 scripts (each running a GET), one ZADD; 300 bytes in, 60 out; one connection.
    after = snapshot(100 + 1 + 5, 5_000 + 300 + 29, 90_000 + 4_100 + 60, 7 + 1 + 1,
                     {"info": 4, "evalsha": 12, "get": 12, "zadd": 1})
    delta = sharedstores.redis_delta(before, after)
    assert delta == {"commands": 5, "in": 300, "out": 60, "cpu": 0.0, "connections": 1, "scripts": 2,
                     "calls": {"evalsha": 2, "get": 2, "zadd": 1}}


def test_two_snapshots_with_nothing_between_them_cost_nothing():
    before = snapshot(100, 5_000, 90_000, 7, {"info": 3}, reply_bytes=4_100)
    after = snapshot(101, 5_029, 94_100, 8, {"info": 4})
    delta = sharedstores.redis_delta(before, after)
    assert (delta["commands"], delta["in"], delta["out"], delta["connections"], delta["calls"]) == (0, 0, 0, 0, {})


def test_costs_per_unit_leave_out_what_the_idle_worker_does_meanwhile():
    # 12 s of an idle worker's 3 transactions a second, around 10,000 requests.
    delta = {"postgres.xact_commit": 20_036, "postgres.tup_inserted": 30_000, "redis.commands": 40_000}
    idle = {"postgres.xact_commit": 3.0, "postgres.tup_inserted": 0.0}
    cost = sharedstores.per_unit(delta, idle, 12, 10_000)
    assert cost == {"postgres.xact_commit": pytest.approx(2.0), "postgres.tup_inserted": 3.0, "redis.commands": 4.0}


def test_a_real_redis_servers_counters_show_exactly_what_one_client_sent():
    if shutil.which("redis-server") is None:
        services.unavailable("redis-server is not installed (Debian: apt-get install redis-server)")
    server = sharedstores.PrivateRedis()
    try:
        before = sharedstores.redis_info(server.port)
        request = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n*2\r\n$3\r\nGET\r\n$1\r\nk\r\n"
        replies = b"+OK\r\n$1\r\nv\r\n"
        with socket.create_connection(("127.0.0.1", server.port)) as connection:
            connection.sendall(request)
            answered = b""
            while len(answered) < len(replies):
                answered += connection.recv(64)
        assert answered == replies
        delta = sharedstores.redis_delta(before, sharedstores.redis_info(server.port))
    finally:
        server.stop()
    assert (delta["commands"], delta["in"], delta["out"], delta["connections"], delta["calls"]) == (
        2, len(request), len(replies), 1, {"set": 1, "get": 1})
