"""Credits and the account allowance stay exact under concurrent requests: two gunicorn workers
on Redis (SQLite), and two instances of two workers on PostgreSQL + Redis."""

import collections
import concurrent.futures
import itertools

import pytest
import requests

import services
from liveserver import cli_session, service_env, start_procfile, stored_total, wait_for

ACCOUNT_ALLOWANCE = 60


@pytest.fixture(scope="module", params=["two-workers-on-redis", "two-instances-on-postgresql"])
def deployment(request, tmp_path_factory):
    """(env, servers, a CLI session) of one deployment whose accounts share 60 requests an hour."""
    tmp_path = tmp_path_factory.mktemp(request.param)
    database = "postgresql" if request.param.endswith("postgresql") else "sqlite"
    env = service_env(tmp_path, database, RATELIMIT_STORAGE_URL=services.redis_url(), WEB_CONCURRENCY="2",
                      ACCOUNT_RATE_LIMIT=f"{ACCOUNT_ALLOWANCE}/hour")
    servers = [start_procfile(tmp_path, env) for _ in range(2 if database == "postgresql" else 1)]
    try:
        with cli_session(env) as cli:
            yield env, servers, cli
    finally:
        for server in servers:
            server.stop()


users = (f"meter{n}" for n in itertools.count())


def new_keys(cli, count, *options):
    """Create a user and `count` keys of theirs with the CLI options; return the secrets."""
    username = next(users)
    cli("users", "create", username, "--email", f"{username}@example.com", "--password-stdin",
        stdin="a long password\n")
    return [cli("keys", "create", username, "--name", f"key {n}", "--type", "production",
                *options).strip().splitlines()[-1] for n in range(count)]


def hammer(servers, secrets, requests_in_all=200, threads=20):
    """requests_in_all GETs from `threads` threads, spread over the servers and the secrets; return
    a Counter of (status, error code)."""
    def one(n):
        response = requests.get(f"{servers[n % len(servers)].base}/api/v1/protected/test", timeout=30,
                                headers={"X-API-Key": secrets[n % len(secrets)]})
        return response.status_code, response.json().get("error", {}).get("code")

    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        return collections.Counter(pool.map(one, range(requests_in_all)))


def test_credits_admit_exactly_their_number(deployment):
    env, servers, cli = deployment
    secret, = new_keys(cli, 1, "--credits", "50")
    outcomes = hammer(servers, [secret])
    # Only requests holding a credit take a place in a window: the account's never fills.
    assert outcomes == {(200, None): 50, (429, "credits_exhausted"): 150}
    wait_for(lambda: stored_total(env["DATABASE_URL"], secret) == 50)
    # Refused for credits, charged to no window: the account's allowance lost only the 50.
    answer = requests.get(f"{servers[0].base}/api/v1/usage/stats", headers={"X-API-Key": secret}, timeout=10)
    assert answer.status_code == 429 and answer.headers["X-Credits-Remaining"] == "0"
    assert answer.headers["X-RateLimit-Remaining"] == str(ACCOUNT_ALLOWANCE - 50)


def test_the_account_allowance_is_exact_for_two_keys(deployment):
    env, servers, cli = deployment
    first, second = new_keys(cli, 2)
    outcomes = hammer(servers, [first, second])
    assert outcomes == {(200, None): ACCOUNT_ALLOWANCE, (429, "account_rate_limit_exceeded"): 200 - ACCOUNT_ALLOWANCE}
    wait_for(lambda: stored_total(env["DATABASE_URL"], first) + stored_total(env["DATABASE_URL"], second)
             == ACCOUNT_ALLOWANCE)


def test_credits_shared_with_the_account_allowance_stop_at_the_lower(deployment):
    env, servers, cli = deployment
    secrets = new_keys(cli, 2, "--credits", "40")
    outcomes = hammer(servers, secrets)
    assert outcomes[200, None] == ACCOUNT_ALLOWANCE
    assert sum(outcomes.values()) == 200
    assert set(outcomes) <= {(200, None), (429, "credits_exhausted"), (429, "account_rate_limit_exceeded")}
