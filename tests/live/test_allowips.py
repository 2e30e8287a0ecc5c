"""Per-key IP allow-lists on the real server (the Procfile's gunicorn, TRUSTED_PROXIES=1, so
X-Forwarded-For sets the client address): on SQLite with one worker, and on PostgreSQL with Redis
limits and two workers (the key cache kept in Redis's generation), a key allowed only from some
addresses is refused from another, on REST and the time socket's handshake, without being counted,
and works from the allowed ones."""

import itertools
import json
import time

import pytest
import requests
import services
import websocket
from liveserver import SECRET_PATTERN, Browser, cli, service_env, serving, stored_total, wait_for

from metering import usage

ALLOWED, OTHER = "203.0.113.7", "198.51.100.1"
ALLOWED_V6, OTHER_V6 = "2001:db8:1::/64", "2001:db8:2::1"
FREE_PER_HOUR = 100_000  # service_env's tier free
names = (f"key {n}" for n in itertools.count())


@pytest.fixture(scope="module", params=["sqlite", "postgresql-redis"])
def deployment(request, tmp_path_factory):
    """(server, env): one worker on SQLite, or two on PostgreSQL with limits (and the key
    generation) in Redis; user carol exists."""
    tmp_path = tmp_path_factory.mktemp("allowips")
    if request.param == "sqlite":
        env = service_env(tmp_path)
    else:
        env = service_env(tmp_path, "postgresql", RATELIMIT_STORAGE_URL=services.redis_url(), WEB_CONCURRENCY="2")
    cli(env, "users", "create", "carol", "--email", "carol@example.com", "--password-stdin", stdin="a long password\n")
    with serving(tmp_path, env) as server:
        yield server, env


def make_key(env, allow_ips=None):
    options = ["--allow-ips", allow_ips] if allow_ips is not None else []
    return cli(env, "keys", "create", "carol", "--name", next(names), "--type", "production",
               *options).strip().splitlines()[-1]


def call(server, secret, address, path="/api/v1/protected/test"):
    return requests.get(server.base + path, headers={"X-API-Key": secret, "X-Forwarded-For": address}, timeout=10)


def open_time_socket(server, secret, address):
    url = server.base.replace("http://", "ws://") + f"/api/v1/ws/time?api_key={secret}"
    return websocket.create_connection(url, timeout=10, header={"X-Forwarded-For": address})


def assert_counted(env, secret, last, count):
    """The key's allowance (shared by the workers: Redis, or one worker's memory) and its stored usage
    show `count` requests, `last` being the latest."""
    assert int(last.headers["X-RateLimit-Remaining"]) == FREE_PER_HOUR - count
    wait_for(lambda: stored_total(env["DATABASE_URL"], secret) >= count)
    time.sleep(2 * usage.FLUSH_INTERVAL)  # every worker's pending counts are flushed by now
    assert stored_total(env["DATABASE_URL"], secret) == count


def test_a_key_is_refused_from_another_address_and_works_from_the_allowed_ones(deployment):
    server, env = deployment
    secret = make_key(env, f"{ALLOWED},{ALLOWED_V6}")
    # Enough requests that both workers (on PostgreSQL) hold the key in their caches.
    for _ in range(3):
        assert call(server, secret, ALLOWED).status_code == 200
    for address in (OTHER, OTHER_V6, f"::ffff:{OTHER}") * 5:
        refused = call(server, secret, address)
        assert refused.status_code == 403
        assert refused.json()["error"]["code"] == "ip_not_allowed"
        assert address.removeprefix("::ffff:") in refused.json()["error"]["message"]
        assert "X-RateLimit-Remaining" not in refused.headers
    assert call(server, secret, "2001:db8:1::beef").status_code == 200
    allowed = call(server, secret, f"::ffff:{ALLOWED}")
    assert allowed.status_code == 200
    assert_counted(env, secret, allowed, 5)


def test_a_key_without_an_allow_list_works_from_anywhere(deployment):
    server, env = deployment
    secret = make_key(env)
    for address in (ALLOWED, OTHER, OTHER_V6):
        assert call(server, secret, address).status_code == 200


def test_the_time_socket_handshake_is_refused_from_another_address(deployment):
    server, env = deployment
    secret = make_key(env, ALLOWED)
    for _ in range(4):
        with pytest.raises(websocket.WebSocketBadStatusException) as refused:
            open_time_socket(server, secret, OTHER)
        assert refused.value.status_code == 403
        assert json.loads(refused.value.resp_body)["error"]["code"] == "ip_not_allowed"
    ws = open_time_socket(server, secret, ALLOWED)
    try:
        assert json.loads(ws.recv())["type"] == "auth_success"
        assert json.loads(ws.recv())["type"] == "time_update"
    finally:
        ws.close()
    assert_counted(env, secret, call(server, secret, ALLOWED), 2)


def test_the_web_form_makes_a_key_that_only_its_addresses_can_use(deployment):
    server, _ = deployment
    browser = Browser(server).signup()
    created = browser.post("/settings/security/keys", {"name": "Office", "type": "production",
                                                       "allow_ips": f"{ALLOWED}\r\n{ALLOWED_V6}"},
                           form_page="/settings/security")
    assert created.status_code == 302, created.text
    page = browser.get("/settings/security").text
    secret = SECRET_PATTERN.search(page)[1]
    assert f"from {ALLOWED}/32, {ALLOWED_V6}" in page
    assert call(server, secret, OTHER).json()["error"]["code"] == "ip_not_allowed"
    assert call(server, secret, ALLOWED).status_code == 200
    refused = browser.post("/settings/security/keys", {"name": "Bad", "type": "production",
                                                       "allow_ips": "203.0.113.7, 10.0.0.0/40"},
                           form_page="/settings/security")
    assert refused.status_code == 400
    assert "The IP allow-list entry &#39;10.0.0.0/40&#39; is not an IP address or CIDR network" in refused.text
