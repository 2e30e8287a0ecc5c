"""Several workers and instances: PostgreSQL for the data, Redis for shared limits, and what
happens when either goes away and comes back."""

import concurrent.futures
import time

import pytest
import requests
import services
import websocket
from liveserver import cli_session, make_key, service_env, start_instances, start_procfile, stored_total, wait_for
from tcpproxy import TcpProxy

from accounts import users
from models import Membership, Organisation
from orgs import keyactions


def get_all(urls, headers):
    """GET every url at once from 50 threads; return the statuses."""
    with concurrent.futures.ThreadPoolExecutor(50) as pool:
        return list(pool.map(lambda url: requests.get(url, headers=headers, timeout=30).status_code, urls))


@pytest.fixture(scope="class")
def cluster(tmp_path_factory):
    """Two instances of four workers each, on one PostgreSQL database and one Redis, and the
    command line on them (one process): for the tests of one class, each with keys of its own."""
    tmp_path = tmp_path_factory.mktemp("cluster")
    env = service_env(tmp_path, DATABASE_URL=services.postgres_url(), RATELIMIT_STORAGE_URL=services.redis_url(),
                      WEB_CONCURRENCY="4", RATE_LIMIT_TIERS="free=100000/hour,five=5/minute")
    with cli_session(env) as commands:
        servers = start_instances(tmp_path, env)
        try:
            yield env, servers, commands
        finally:
            for server in servers:
                server.stop()


class TestCluster:
    """Several workers and instances sharing one database and one Redis. The class's tests share
    the cluster, which is stopped before the module's other tests empty the database or Redis."""

    def test_redis_shares_each_window_across_workers_and_instances(self, cluster):
        env, servers, commands = cluster
        key = make_key(env, tier="five", commands=commands)
        urls = [f"{servers[i % 2].base}/api/v1/protected/test" for i in range(50)]
        statuses = get_all(urls, {"X-API-Key": key})
        assert sorted(statuses) == [200] * 5 + [429] * 45

    def test_counts_are_exact_across_workers_and_instances(self, cluster):
        env, servers, commands = cluster
        key = make_key(env, commands=commands)
        urls = [f"{servers[i % 2].base}/api/v1/protected/test" for i in range(600)]
        statuses = get_all(urls, {"X-API-Key": key})
        assert statuses == [200] * 600
        wait_for(lambda: stored_total(env["DATABASE_URL"], key) == 600)

    def test_time_socket_cap_holds_across_workers(self, cluster):
        env, servers, commands = cluster
        key = make_key(env, commands=commands)
        url = lambda i: servers[i % 2].base.replace("http", "ws") + f"/api/v1/ws/time?api_key={key}"  # noqa: E731
        sockets = [websocket.create_connection(url(i), timeout=10) for i in range(10)]
        try:
            with pytest.raises(websocket.WebSocketBadStatusException) as refused:
                websocket.create_connection(url(10), timeout=10)
            assert refused.value.status_code == 429
            assert b"too_many_connections" in refused.value.resp_body
        finally:
            for ws in sockets:
                ws.close()


def test_an_organisation_s_allowance_is_exact_across_its_members_keys_workers_and_instances(tmp_path, make_app):
    """ACCOUNT_RATE_LIMIT counts per organisation: two members' keys of one organisation, used at
    once on two instances of two workers each, share its 30 requests exactly (the others are the
    account window's 429s); a key of another organisation spends none of them."""
    env = service_env(tmp_path, DATABASE_URL=services.postgres_url(), RATELIMIT_STORAGE_URL=services.redis_url(),
                      WEB_CONCURRENCY="2", ACCOUNT_RATE_LIMIT="30/minute")
    with make_app({"DATABASE_URL": env["DATABASE_URL"], "RATELIMIT_STORAGE_URL": env["RATELIMIT_STORAGE_URL"],
                   "RATE_LIMIT_TIERS": env["RATE_LIMIT_TIERS"]}).app_context():
        alice, bob, carol = (users.create_user(name, f"{name}@example.com", "a long password")
                             for name in ("alice", "bob", "carol"))
        acme = Organisation.create(name="Acme", slug="acme")
        Membership.create(org=acme, user=alice, role="owner")
        Membership.create(org=acme, user=bob, role="developer")
        members = [keyactions.issue_key(member, f"{member.username}'s", "production", org=acme.id)[1]
                   for member in (alice, bob)]
        _, other = keyactions.issue_key(carol, "Own", "production")
    servers = start_instances(tmp_path, env)
    try:
        with concurrent.futures.ThreadPoolExecutor(50) as pool:
            responses = list(pool.map(lambda i: requests.get(f"{servers[i % 2].base}/api/v1/protected/test",
                                                             headers={"X-API-Key": members[i // 2 % 2]}, timeout=30),
                                      range(100)))
        elsewhere = requests.get(f"{servers[0].base}/api/v1/protected/test", headers={"X-API-Key": other}, timeout=30)
    finally:
        for server in servers:
            server.stop()
    assert sorted(response.status_code for response in responses) == [200] * 30 + [429] * 70
    refused = [response for response in responses if response.status_code == 429]
    assert {(response.json()["error"]["code"], response.headers["X-RateLimit-Limit"],
             tuple(response.headers["RateLimit"].split(";")[:2])) for response in refused} == {
        ("account_rate_limit_exceeded", "30", ('"account"', "r=0"))}
    assert (elsewhere.status_code, elsewhere.headers["X-RateLimit-Remaining"]) == (200, "29")
    assert sum(stored_total(env["DATABASE_URL"], secret) for secret in members) == 30


def test_sqlite_with_several_workers_loses_nothing(tmp_path):
    env = service_env(tmp_path, WEB_CONCURRENCY="4")
    key = make_key(env)
    server = start_procfile(tmp_path, env)
    try:
        statuses = get_all([f"{server.base}/api/v1/protected/test"] * 400, {"X-API-Key": key})
        assert statuses == [200] * 400
    finally:
        server.stop()
    assert stored_total(env["DATABASE_URL"], key) == 400
    output = server.output()
    assert "database is locked" not in output
    assert "each of the 4 workers keeps its own rate limits" in output


def test_one_worker_gives_each_of_many_requests_at_once_its_own_count_on_redis(tmp_path):
    # The worker sends the windows of requests waiting together in one call to Redis.
    env = service_env(tmp_path, RATELIMIT_STORAGE_URL=services.redis_url(), WEB_CONCURRENCY="1",
                      RATE_LIMIT_TIERS="free=1000/hour")
    key = make_key(env)
    server = start_procfile(tmp_path, env)
    try:
        with concurrent.futures.ThreadPoolExecutor(50) as pool:
            responses = list(pool.map(lambda _: requests.get(server.base + "/api/v1/protected/test",
                                                             headers={"X-API-Key": key}, timeout=30), range(300)))
    finally:
        server.stop()
    assert [response.status_code for response in responses] == [200] * 300
    assert sorted(int(response.headers["X-RateLimit-Remaining"]) for response in responses) == list(range(700, 1000))


def test_requests_waiting_on_a_hung_redis_all_fail_closed_in_time(tmp_path):
    url = services.redis_url()
    proxy = TcpProxy(services.redis_address(url))
    env = service_env(tmp_path, RATELIMIT_STORAGE_URL=services.via(url, proxy.port),
                      WEB_CONCURRENCY="1")
    key = make_key(env)
    server = start_procfile(tmp_path, env)
    url = server.base + "/api/v1/protected/test"
    try:
        assert requests.get(url, headers={"X-API-Key": key}, timeout=10).status_code == 200
        proxy.stall()
        started = time.monotonic()
        assert get_all([url] * 30, {"X-API-Key": key}) == [503] * 30
        assert time.monotonic() - started < 10
        proxy.resume()
        wait_for(lambda: requests.get(url, headers={"X-API-Key": key}, timeout=10).status_code == 200)
    finally:
        server.stop()
        proxy.close()


def test_redis_outage_fails_closed_for_keys_and_recovers(tmp_path):
    url = services.redis_url()
    proxy = TcpProxy(services.redis_address(url))
    env = service_env(tmp_path, RATELIMIT_STORAGE_URL=services.via(url, proxy.port),
                      PUBLIC_RATE_LIMIT="600/minute")
    key = make_key(env)
    headers = {"X-API-Key": key}
    server = start_procfile(tmp_path, env)
    try:
        assert requests.get(server.base + "/api/v1/protected/test", headers=headers, timeout=10).status_code == 200
        proxy.cut()
        down = requests.get(server.base + "/api/v1/protected/test", headers=headers, timeout=10)
        assert down.status_code == 503
        assert (down.json()["error"]["code"], down.headers["Retry-After"]) == ("service_unavailable", "5")
        assert requests.get(server.base + "/api/v1/demo/year", timeout=10).status_code == 200
        proxy.restore()
        wait_for(lambda: requests.get(server.base + "/api/v1/protected/test", headers=headers,
                                      timeout=10).status_code == 200)
    finally:
        server.stop()
        proxy.close()
    assert "Rate-limit storage unavailable" in server.output()


def test_database_outage_is_503_and_recovers_without_losing_counts(tmp_path):
    database_url = services.postgres_url()
    proxy = TcpProxy(services.POSTGRES)
    env = service_env(tmp_path, DATABASE_URL=services.via(database_url, proxy.port))
    key = make_key(env)
    headers = {"X-API-Key": key}
    server = start_procfile(tmp_path, env)
    served = []

    def call():
        response = requests.get(server.base + "/api/v1/protected/test", headers=headers, timeout=10)
        served.append(response.status_code)
        return response

    try:
        for _ in range(3):
            assert call().status_code == 200
        proxy.cut()
        down = call()
        assert down.status_code == 503
        assert down.json()["error"]["code"] == "service_unavailable"
        proxy.restore()
        wait_for(lambda: call().status_code == 200)
    finally:
        server.stop()
        proxy.close()
    assert set(served) <= {200, 503}
    assert stored_total(database_url, key) == served.count(200)
