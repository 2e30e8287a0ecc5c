"""RATE_LIMIT_ON_STORAGE_FAILURE=open against the real server (gunicorn, two workers, PostgreSQL),
its Redis cut under load through a TCP proxy: every keyed request is admitted and answered 200,
never 503 or 500, each one counted in the database and its credit spent; the admissions show in
ratelimit_storage_failopen_total, and each worker warns at most once a minute; a key revoked
while Redis is away is refused from the next request, cached or not; usage/stats, which must report
the window, answers 503. (`closed`, the default: tests/live/test_scale_out.py.)"""

import concurrent.futures
import re
import threading

import psycopg
import pytest
import requests
import services
from liveserver import cli_session, make_key, service_env, serving, stored_total, wait_for
from tcpproxy import TcpProxy

WORKERS = 2
WARNING = "keyed requests without counting them"


@pytest.fixture(scope="module")
def proxy():
    proxy = TcpProxy(services.redis_address(services.redis_url()))
    yield proxy
    proxy.close()


@pytest.fixture(scope="module")
def env(tmp_path_factory, proxy):
    return service_env(tmp_path_factory.mktemp("server"), "postgresql",
                       RATELIMIT_STORAGE_URL=services.via(services.redis_url(), proxy.port),
                       RATE_LIMIT_ON_STORAGE_FAILURE="open", WEB_CONCURRENCY=str(WORKERS))


@pytest.fixture(scope="module")
def server(env, tmp_path_factory):
    with serving(tmp_path_factory.mktemp("server-log"), env) as server:
        yield server


@pytest.fixture
def redis_restored(proxy):
    """The proxy passes traffic again when the test ends, however it ended."""
    yield proxy
    proxy.restore()


def failopen_total(server):
    metrics = requests.get(server.base + "/metrics", timeout=10).text
    found = re.search(r"^ratelimit_storage_failopen_total ([0-9.e+]+)$", metrics, re.MULTILINE)
    return float(found[1]) if found else 0.0


def credits_left(env, key):
    with psycopg.connect(env["DATABASE_URL"]) as connection:
        return connection.execute("SELECT credits_remaining FROM api_keys WHERE display_prefix = %s",
                                  (key[:12],)).fetchone()[0]


def test_open_admits_every_keyed_request_while_redis_is_cut_and_loses_no_count(server, env, redis_restored):
    with cli_session(env) as commands:
        plain = make_key(env, commands=commands)
        paid = commands("keys", "create", "carol", "--name", "paid", "--type", "production",
                        "--credits", "100000").strip().splitlines()[-1]
    statuses = {plain: [], paid: []}
    done = threading.Event()

    def send(key):
        with requests.Session() as session:
            while not done.is_set():
                response = session.get(server.base + "/api/v1/protected/test", headers={"X-API-Key": key},
                                       timeout=30)
                statuses[key].append(response.status_code)

    before = failopen_total(server)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        senders = [pool.submit(send, key) for key in (plain, paid, plain, paid)]
        wait_for(lambda: min(map(len, statuses.values())) >= 20)
        redis_restored.cut()
        cut_at = {key: len(answered) for key, answered in statuses.items()}
        wait_for(lambda: all(len(statuses[key]) >= cut_at[key] + 40 for key in statuses))
        redis_restored.restore()
        restored_at = {key: len(answered) for key, answered in statuses.items()}
        wait_for(lambda: all(len(statuses[key]) >= restored_at[key] + 40 for key in statuses))
        done.set()
        for sender in senders:
            sender.result()

    assert {key: set(answered) for key, answered in statuses.items()} == {plain: {200}, paid: {200}}
    admitted_uncounted = failopen_total(server) - before
    assert 80 <= admitted_uncounted <= sum(map(len, statuses.values()))
    for key, answered in statuses.items():
        wait_for(lambda: stored_total(env["DATABASE_URL"], key) == len(answered))
    assert credits_left(env, paid) == 100000 - len(statuses[paid])
    # The test takes far less than a minute: at most one warning in each worker.
    assert 1 <= server.output().count(WARNING) <= WORKERS
    # No line for each request admitted.
    assert "Rate-limit storage unavailable:" not in server.output()


def test_a_key_revoked_while_redis_is_cut_is_refused_and_usage_stats_cannot_answer(server, env, redis_restored):
    with cli_session(env) as commands:
        revoked, other = make_key(env, commands=commands), make_key(env, commands=commands)
    url = server.base + "/api/v1/protected/test"
    # Each worker keeps the key: a later request would be admitted from its cache until a count confirms it.
    assert {requests.get(url, headers={"X-API-Key": revoked}, timeout=10).status_code for _ in range(8)} == {200}
    redis_restored.cut()
    # A revocation that Redis cannot be told of, as the dashboard's or the CLI's would be now.
    with psycopg.connect(env["DATABASE_URL"]) as connection:
        connection.execute("UPDATE api_keys SET revoked_at = now() WHERE display_prefix = %s", (revoked[:12],))
    assert {requests.get(url, headers={"X-API-Key": revoked}, timeout=10).status_code for _ in range(8)} == {401}
    assert requests.get(url, headers={"X-API-Key": other}, timeout=10).status_code == 200
    stats = requests.get(server.base + "/api/v1/usage/stats", headers={"X-API-Key": other}, timeout=10)
    assert (stats.status_code, stats.json()["error"]["code"], stats.headers["Retry-After"]) == (
        503, "service_unavailable", "5")
    assert requests.get(server.base + "/api/v1/demo/year", timeout=10).status_code == 200
    redis_restored.restore()
    wait_for(lambda: "X-RateLimit-Remaining" in requests.get(url, headers={"X-API-Key": other}, timeout=10).headers)
