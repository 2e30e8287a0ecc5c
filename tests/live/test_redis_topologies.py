"""Limits shared through Redis as several machines run it: a real Redis Cluster (three masters,
three replicas) and a real Sentinel group (a master, a replica, three sentinels), each started for
the module (tests/support/redistopologies.py). On each, two instances of two workers on one
PostgreSQL database: a key's window and an organisation's allowance admit exactly their number of
concurrent requests, every admitted request is counted once, a revoked or narrowed key is refused
from the next request on both instances (each worker keeps its keys), a key's cap on time sockets
holds across them, the counting scripts are loaded again after a SCRIPT FLUSH, and a master killed
under load costs 503s until the failover, never a 500 or a count in the database."""

import concurrent.futures
import os
import signal
import threading
import time

import pytest
import redis
import requests
import services
import websocket
from liveserver import cli_session, make_key, service_env, serving, stored_total, wait_for
from redistopologies import cluster_nodes, kill_master_holding, masters, redis_cluster, redis_sentinel

TOPOLOGIES = {"cluster": redis_cluster, "sentinel": redis_sentinel}
ORGANISATION_ALLOWANCE = 60


@pytest.fixture(scope="module", params=list(TOPOLOGIES))
def deployment(request, tmp_path_factory):
    """(env, [instance a, instance b], the command line on them) over the topology."""
    tmp_path = tmp_path_factory.mktemp(request.param)
    with TOPOLOGIES[request.param](tmp_path / "redis") as storage_url:
        env = service_env(tmp_path, DATABASE_URL=services.postgres_url(), RATELIMIT_STORAGE_URL=storage_url,
                          WEB_CONCURRENCY="2", RATE_LIMIT_TIERS="free=100000/hour,fifty=50/minute",
                          ACCOUNT_RATE_LIMIT=f"{ORGANISATION_ALLOWANCE}/minute")
        with cli_session(env) as commands, serving(tmp_path, env) as a, serving(tmp_path, env) as b:
            yield env, [a, b], commands


def statuses(instances, secrets, count):
    """GET protected/test count times at once from 50 threads, alternating instances and secrets."""
    def get(i):
        return requests.get(instances[i % 2].base + "/api/v1/protected/test",
                            headers={"X-API-Key": secrets[i % len(secrets)]}, timeout=30)

    with concurrent.futures.ThreadPoolExecutor(50) as pool:
        return list(pool.map(get, range(count)))


def test_a_key_s_window_admits_exactly_its_allowance_and_counts_each_admitted_request(deployment):
    env, instances, commands = deployment
    key = make_key(env, tier="fifty", commands=commands, user="windows")
    answers = statuses(instances, [key], 300)
    assert sorted(answer.status_code for answer in answers) == [200] * 50 + [429] * 250
    refusals = {answer.json()["error"]["code"] for answer in answers if answer.status_code == 429}
    assert refusals == {"rate_limit_exceeded"}
    wait_for(lambda: stored_total(env["DATABASE_URL"], key) == 50)


def test_an_organisation_s_allowance_is_exact_across_its_keys_workers_and_instances(deployment):
    """Two keys of 50 a minute in an organisation of 60: each request is counted in both its windows
    or in neither, at once (on a cluster too, where they share the organisation's slot), so no
    refused request holds a place that another is refused for."""
    env, instances, commands = deployment
    keys = [make_key(env, tier="fifty", commands=commands, user="team") for _ in range(2)]
    answers = statuses(instances, keys, 300)
    assert sorted(answer.status_code for answer in answers) == [200] * ORGANISATION_ALLOWANCE + [429] * 240
    wait_for(lambda: sum(stored_total(env["DATABASE_URL"], key) for key in keys) == ORGANISATION_ALLOWANCE)
    [(key_id, org_id)] = services.rows(env["DATABASE_URL"], "SELECT k.id, k.org_id FROM api_keys k "
                                                            f"WHERE k.display_prefix = '{keys[0][:12]}'")
    named = [(host, port, name) for host, port in masters(env["RATELIMIT_STORAGE_URL"])
             for pattern in (f"*key:{key_id}/*", f"*org:{org_id}/*")
             for name in redis.Redis(host=host, port=port).keys(pattern)]
    assert len(named) == 2
    slots = {redis.Redis(host=host, port=port).execute_command("CLUSTER", "KEYSLOT", name)
             if "cluster" in env["RATELIMIT_STORAGE_URL"] else 0 for host, port, name in named}
    assert len(slots) == 1


def test_a_revoked_key_is_refused_from_the_next_request_on_both_instances(deployment):
    env, instances, commands = deployment
    key = make_key(env, commands=commands, user="revoked")
    assert [answer.status_code for answer in statuses(instances, [key], 8)] == [200] * 8
    revoked = requests.post(instances[0].base + "/api/v1/keys/revoke", headers={"X-API-Key": key}, timeout=10)
    assert revoked.status_code == 200
    assert [answer.status_code for answer in statuses(instances, [key], 16)] == [401] * 16


def test_a_key_narrowed_through_the_cli_is_refused_as_changed_on_both_instances_at_once(deployment):
    """Each worker keeps the key (on a cluster under its tag's generation); the change moves it."""
    env, instances, commands = deployment
    key = make_key(env, commands=commands, user="narrowed")
    assert [answer.status_code for answer in statuses(instances, [key], 16)] == [200] * 16
    [(key_id,)] = services.rows(env["DATABASE_URL"], f"SELECT id FROM api_keys WHERE display_prefix = '{key[:12]}'")
    commands("keys", "update", str(key_id), "--scopes", "usage:read")
    assert [answer.status_code for answer in statuses(instances, [key], 16)] == [403] * 16


def test_a_key_s_time_sockets_are_capped_across_workers_and_instances(deployment):
    env, instances, commands = deployment
    key = make_key(env, commands=commands, user="sockets")
    url = lambda i: instances[i % 2].base.replace("http", "ws") + f"/api/v1/ws/time?api_key={key}"  # noqa: E731
    sockets = [websocket.create_connection(url(i), timeout=10) for i in range(10)]
    try:
        with pytest.raises(websocket.WebSocketBadStatusException) as refused:
            websocket.create_connection(url(10), timeout=10)
        assert refused.value.status_code == 429 and b"too_many_connections" in refused.value.resp_body
    finally:
        for socket in sockets:
            socket.close()


def test_the_counting_scripts_are_loaded_again_after_a_script_flush(deployment):
    """Each script is sent by its hash, which a SCRIPT FLUSH (or a failover to a replica that never
    loaded it) makes unknown: the next request loads it again and is counted as any other."""
    env, instances, commands = deployment
    key = make_key(env, tier="fifty", commands=commands, user="flushed")
    assert [answer.status_code for answer in statuses(instances, [key], 20)] == [200] * 20
    for host, port in masters(env["RATELIMIT_STORAGE_URL"]):
        redis.Redis(host=host, port=port).script_flush()
    answers = statuses(instances, [key], 40)
    assert sorted(answer.status_code for answer in answers) == [200] * 30 + [429] * 10
    wait_for(lambda: stored_total(env["DATABASE_URL"], key) == 50)


def test_a_master_killed_under_load_gives_503s_never_a_500_and_exact_windows_after_the_failover(deployment):
    """The master holding a key's window SIGKILLed while 8 clients use 8 keys (of 8 organisations,
    each within its allowance): each answer is a 200 or a 503 until a replica takes over (the
    cluster's or the sentinels' own failover time), then 200s again; every 200 is counted in the
    database; a new key's window is exact again. The topology is left serving, its new master
    without a replica: the module's other tests pass after this one too."""
    env, instances, commands = deployment
    keys = [make_key(env, commands=commands, user=f"failover{client}") for client in range(8)]
    [(key_id,)] = services.rows(env["DATABASE_URL"],
                                f"SELECT id FROM api_keys WHERE display_prefix = '{keys[0][:12]}'")
    answers, stop = [], threading.Event()

    def load(client):
        while not stop.is_set():
            status = requests.get(instances[client % 2].base + "/api/v1/protected/test",
                                  headers={"X-API-Key": keys[client]}, timeout=30).status_code
            answers.append((time.monotonic(), client, status))
            time.sleep(0.5)  # 2 a second a client: 30 s before its organisation's 60 a minute

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        clients = [pool.submit(load, client) for client in range(8)]
        try:
            wait_for(lambda: len(answers) >= 24)
            killed_at = time.monotonic()
            kill_master_holding(env["RATELIMIT_STORAGE_URL"], f"*key:{key_id}/*")
            # Back once the first client's last 6 answers, after its first 503, are 200s.
            first = lambda: [status for _, client, status in answers if client == 0]  # noqa: E731
            wait_for(lambda: 503 in first() and first()[-6:] == [200] * 6)
        finally:
            stop.set()
            for client in clients:
                client.result()
    assert {status for _, _, status in answers} == {200, 503}
    first_503 = min(at for at, client, status in answers if client == 0 and status == 503)
    # Redis replicates after it answers: the window may lose what the last moments counted in it.
    served = sum(status == 200 for _, client, status in answers if client == 0)
    lately = sum(status == 200 for at, client, status in answers if client == 0 and killed_at - 1 <= at <= first_503)
    in_window = sum(int(redis.Redis(host=host, port=port).get(name) or 0)
                    for host, port in masters(env["RATELIMIT_STORAGE_URL"])
                    for name in redis.Redis(host=host, port=port).keys(f"*key:{key_id}/*"))
    print(f"503s until {max(at for at, _, status in answers if status == 503) - killed_at:.1f} s after the kill; "
          f"the window lost {served - in_window} of {served} counts ({lately} served in the second before)")
    assert served - in_window <= lately
    for client, key in enumerate(keys):
        served = sum(status == 200 for _, of, status in answers if of == client)
        wait_for(lambda: stored_total(env["DATABASE_URL"], key) == served)
    fresh = make_key(env, tier="fifty", commands=commands, user="afterfailover")
    assert sorted(answer.status_code for answer in statuses(instances, [fresh], 100)) == [200] * 50 + [429] * 50


def test_a_cluster_with_every_node_gone_is_a_503_never_a_500(tmp_path):
    """redis-py raises its own RedisClusterException, no RedisError, when no node of a cluster
    answers: it is the limit storage's failure like any other, for a keyed request and for a time
    socket's handshake."""
    with redis_cluster(tmp_path / "redis") as storage_url:
        # SQLite: the module's deployment may still be serving on this test process's PostgreSQL database.
        env = service_env(tmp_path, RATELIMIT_STORAGE_URL=storage_url)
        key = make_key(env)
        with serving(tmp_path, env) as server:
            url = server.base + "/api/v1/protected/test"
            assert requests.get(url, headers={"X-API-Key": key}, timeout=10).status_code == 200
            for host, port in cluster_nodes(storage_url):
                os.kill(redis.Redis(host=host, port=port).info("server")["process_id"], signal.SIGKILL)
            answers = [requests.get(url, headers={"X-API-Key": key}, timeout=10) for _ in range(3)]
            assert [(answer.status_code, answer.json()["error"]["code"]) for answer in answers] == [
                (503, "service_unavailable")] * 3
            # The time socket's per-key cap lives there too.
            with pytest.raises(websocket.WebSocketBadStatusException) as refused:
                websocket.create_connection(server.base.replace("http", "ws") + f"/api/v1/ws/time?api_key={key}",
                                            timeout=10)
            assert refused.value.status_code == 503 and b"service_unavailable" in refused.value.resp_body
