"""Credits and the account allowance stay exact under concurrent requests: two gunicorn workers
on Redis (SQLite), and two instances of two workers on PostgreSQL + Redis."""

import collections
import concurrent.futures
import hashlib
import itertools
import re
import threading
import time

import pytest
import requests
import services
from liveserver import cli_session, service_env, start_instances, stored_total, wait_for
from services import rows
from webhookreceiver import receiving

ACCOUNT_ALLOWANCE = 60
HAMMER_THREADS = 20


@pytest.fixture(scope="module", params=["two-workers-on-redis", "two-instances-on-postgresql"])
def deployment(request, tmp_path_factory):
    """(env, servers, a CLI session) of one deployment whose accounts share 60 requests an hour."""
    tmp_path = tmp_path_factory.mktemp(request.param)
    database = "postgresql" if request.param.endswith("postgresql") else "sqlite"
    env = service_env(tmp_path, database, RATELIMIT_STORAGE_URL=services.redis_url(), WEB_CONCURRENCY="2",
                      ACCOUNT_RATE_LIMIT=f"{ACCOUNT_ALLOWANCE}/hour", WEBHOOK_ALLOW_PRIVATE="1")
    servers = start_instances(tmp_path, env, 2 if database == "postgresql" else 1)
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


def new_key(cli, *options, username=None):
    """(KEY_ID, secret) of a key made as new_keys makes them."""
    if username is None:
        username = next(users)
        cli("users", "create", username, "--email", f"{username}@example.com", "--password-stdin",
            stdin="a long password\n")
    lines = cli("keys", "create", username, "--name", "key", "--type", "production", *options).strip().splitlines()
    return re.search(r"\(id (\d+)\)", "\n".join(lines)).group(1), lines[-1]


def credits_spent(env, secret):
    """The credits the key's usage hours, then its days, record as spent."""
    [(hours, days)] = rows(env["DATABASE_URL"], (
        "SELECT (SELECT coalesce(sum(credits), 0) FROM usage_hours WHERE api_key_id = k.id), "
        "(SELECT coalesce(sum(credits), 0) FROM usage_days WHERE api_key_id = k.id) "
        f"FROM api_keys k WHERE k.key_hash = '{hashlib.sha256(secret.encode()).hexdigest()}'"))
    return hours, days


def hammer(servers, secrets, requests_in_all=200, threads=HAMMER_THREADS, answers=None):
    """requests_in_all GETs from `threads` threads, spread over the servers and the secrets; return
    a Counter of (status, error code). answers: a list that gets each response."""
    def one(n):
        response = requests.get(f"{servers[n % len(servers)].base}/api/v1/protected/test", timeout=60,
                                headers={"X-API-Key": secrets[n % len(secrets)]})
        if answers is not None:
            answers.append(response)
        return response.status_code, response.json().get("error", {}).get("code")

    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        return collections.Counter(pool.map(one, range(requests_in_all)))


def hammer_until_exhausted(servers, secret, threads, seconds=120):
    """GETs from `threads` threads until one is told credits_exhausted (or `seconds` pass); return a
    Counter of (status, error code)."""
    outcomes, counting = collections.Counter(), threading.Lock()
    deadline = time.monotonic() + seconds
    done = threading.Event()

    def keep_asking(n):
        while not done.is_set() and time.monotonic() < deadline:
            response = requests.get(f"{servers[n % len(servers)].base}/api/v1/protected/test", timeout=60,
                                    headers={"X-API-Key": secret})
            outcome = response.status_code, response.json().get("error", {}).get("code")
            with counting:
                outcomes[outcome] += 1
            if outcome == (429, "credits_exhausted"):
                done.set()

    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        list(pool.map(keep_asking, range(threads)))
    assert done.is_set(), f"the credits were not spent in {seconds} s: {outcomes}"
    return outcomes


def test_credits_admit_exactly_their_number(deployment):
    env, servers, cli = deployment
    # A request holds a place in the account's window until it finds no credit and gives it
    # back, and a full window refuses the others meanwhile (the contract allows either code).
    # With a place left for every request in flight, each refusal is for credits alone.
    credits = ACCOUNT_ALLOWANCE - HAMMER_THREADS
    secret, = new_keys(cli, 1, "--credits", str(credits))
    outcomes = hammer(servers, [secret])
    assert outcomes == {(200, None): credits, (429, "credits_exhausted"): 200 - credits}
    wait_for(lambda: stored_total(env["DATABASE_URL"], secret) == credits)
    # The ledger: every spent credit in the key's hours and days, written by the workers' flushes.
    wait_for(lambda: credits_spent(env, secret) == (credits, credits))
    # Refused for credits, charged to no window: the account's allowance lost only the successes.
    answer = requests.get(f"{servers[0].base}/api/v1/usage/stats", headers={"X-API-Key": secret}, timeout=10)
    assert answer.status_code == 429 and answer.headers["X-Credits-Remaining"] == "0"
    assert answer.headers["X-RateLimit-Remaining"] == str(ACCOUNT_ALLOWANCE - credits)


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


def test_a_key_with_credits_refused_by_its_window_is_never_told_its_credits_are_exhausted(deployment):
    env, servers, cli = deployment
    key_id, secret = new_key(cli, "--credits", "20", "--refill", "1000/month")
    cli("keys", "limit", key_id, "1/minute")
    answers = []
    outcomes = hammer(servers, [secret], requests_in_all=200, threads=100, answers=answers)
    # One request fits the minute's window; the other 199 are refused by it, and spend nothing.
    assert outcomes == {(200, None): 1, (429, "rate_limit_exceeded"): 199}
    # What the key held when each was answered: 20 until the one success spent its credit.
    assert {answer.headers["X-Credits-Remaining"] for answer in answers} <= {"20", "19"}
    assert all(0 < int(answer.headers["Retry-After"]) <= 60 for answer in answers if answer.status_code == 429)
    assert rows(env["DATABASE_URL"], "SELECT credits_remaining FROM api_keys WHERE id = "
                f"{key_id}") == [(19,)]


def test_credit_events_are_sent_once_per_crossing_over_every_worker(deployment):
    env, servers, cli = deployment
    username = next(users)
    cli("users", "create", username, "--email", f"{username}@example.com", "--password-stdin",
        stdin="a long password\n")
    with receiving() as receiver:
        receiver.secrets["/credits"] = cli("webhooks", "add", username, f"{receiver.url}/credits", "--events",
                                           "credits.low,credits.exhausted").strip().splitlines()[-1]
        key_id, secret = new_key(cli, "--credits", "12", username=username)
        cli("keys", "limit", key_id, "5/second")
        # Requests refused by the key's window around each crossing (low at 1 left, then 0), until
        # the credits are spent: three seconds' windows at least, however fast the machine.
        outcomes = hammer_until_exhausted(servers, secret, threads=40)
        assert outcomes[200, None] == 12
        delivered = receiver.wait_for(2, "/credits", seconds=60)
        wait_for(lambda: rows(env["DATABASE_URL"], "SELECT count(*) FROM webhook_messages WHERE state != 'delivered'")
                 == [(0,)], seconds=60)
        delivered = receiver.received("/credits")
    assert sorted(delivery.payload["type"] for delivery in delivered) == ["credits.exhausted", "credits.low"]
    assert all(delivery.verified is not None for delivery in delivered)
