"""Limits shared through Redis as several machines run it: a real Redis Cluster (three masters,
three replicas) and a real Sentinel group (a master, a replica, three sentinels), each started for
the module (tests/support/redistopologies.py). On each, two instances of two workers on one
PostgreSQL database: a key's window and an organisation's allowance admit exactly their number of
concurrent requests, every admitted request is counted once, a revoked key is refused from the
next request on both instances, a key's cap on time sockets holds across them, and the counting
scripts are loaded again after a SCRIPT FLUSH."""

import concurrent.futures

import pytest
import redis
import requests
import services
import websocket
from liveserver import cli_session, make_key, service_env, start_procfile, stored_total, wait_for
from redistopologies import masters, redis_cluster, redis_sentinel

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
        with cli_session(env) as commands:
            instances = [start_procfile(tmp_path, env) for _ in range(2)]
            try:
                yield env, instances, commands
            finally:
                for instance in instances:
                    instance.stop()
        output = "".join(instance.output() for instance in instances)
        assert "Traceback" not in output


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
    env, instances, commands = deployment
    keys = [make_key(env, commands=commands, user="team") for _ in range(2)]
    answers = statuses(instances, keys, 150)
    assert sorted(answer.status_code for answer in answers) == [200] * ORGANISATION_ALLOWANCE + [429] * 90
    wait_for(lambda: sum(stored_total(env["DATABASE_URL"], key) for key in keys) == ORGANISATION_ALLOWANCE)


def test_a_revoked_key_is_refused_from_the_next_request_on_both_instances(deployment):
    env, instances, commands = deployment
    key = make_key(env, commands=commands, user="revoked")
    assert [answer.status_code for answer in statuses(instances, [key], 8)] == [200] * 8
    revoked = requests.post(instances[0].base + "/api/v1/keys/revoke", headers={"X-API-Key": key}, timeout=10)
    assert revoked.status_code == 200
    assert [answer.status_code for answer in statuses(instances, [key], 16)] == [401] * 16


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
