"""Keys, accounts and logs at their edges, against the Procfile's server with two workers, on
SQLite (limits in each worker's memory) and on PostgreSQL + Redis (shared limits, keys cached by
every worker): rolls raced, repeated and limited; a rolled-out secret revoking only itself;
accounts deleted under a stream of requests; a forged access-log line; IPv6 clients sharing their
/64's allowance."""

import concurrent.futures
import re

import pytest
import requests
import services
from liveserver import SECRET_PATTERN, Browser, service_env


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def env(request, tmp_path_factory):
    extra = {"RATELIMIT_STORAGE_URL": services.redis_url()} if request.param == "postgresql" else {}
    return service_env(tmp_path_factory.mktemp(f"hardening-{request.param}"), request.param, WEB_CONCURRENCY="2",
                       PUBLIC_RATE_LIMIT="5/minute", **extra)


@pytest.fixture(scope="module")
def server(server, env):
    """The module's server; server.shared_limits: whether its workers count in one Redis."""
    server.shared_limits = "RATELIMIT_STORAGE_URL" in env
    return server


def new_key(browser, name="key"):
    assert browser.create_key(name).status_code == 302
    html = browser.get("/settings/security").text
    # Each test's browser is a new account with this one key.
    return re.search(r"/settings/security/keys/(\d+)/roll", html)[1], SECRET_PATTERN.search(html)[1]


def roll(browser, key_id, token, **form):
    return browser.http.post(f"{browser.base}/settings/security/keys/{key_id}/roll",
                             data={"csrf_token": token, "grace": "0", **form}, allow_redirects=False, timeout=30)


def csrf(browser):
    return re.search(r'name="csrf_token" value="([^"]+)"', browser.get("/settings/security").text)[1]


def protected(server, secret):
    return requests.get(server.base + "/api/v1/protected/test", headers={"X-API-Key": secret}, timeout=10).status_code


def test_live_rolls_raced_from_one_page_are_refused_with_a_sentence_never_a_500(server):
    browser = Browser(server).signup()
    key_id, _ = new_key(browser)
    token = csrf(browser)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        statuses = list(pool.map(lambda _: roll(browser, key_id, token).status_code, range(120)))
    assert set(statuses) <= {302, 409, 429}, statuses
    assert statuses.count(429) > 0
    if server.shared_limits:
        # One allowance of 30 for the account, whichever worker answers; refused rolls count.
        assert statuses.count(302) + statuses.count(409) == 30
    assert "Traceback" not in server.output()


def test_live_a_second_roll_keeps_the_first_grace_unless_confirmed(server):
    browser = Browser(server).signup()
    key_id, first = new_key(browser)
    assert roll(browser, key_id, csrf(browser), grace="7d", current=first[:12]).status_code == 302
    second = SECRET_PATTERN.search(browser.get("/settings/security").text)[1]
    refused = roll(browser, key_id, csrf(browser), current=second[:12])
    assert refused.status_code == 409 and f"still has a previous secret, {first[:12]}..." in refused.text
    stale = roll(browser, key_id, csrf(browser), current=first[:12], end_previous="1")
    assert stale.status_code == 409 and "it was rolled since" in stale.text
    assert protected(server, first) == protected(server, second) == 200
    assert roll(browser, key_id, csrf(browser), current=second[:12], end_previous="1").status_code == 302
    assert protected(server, first) == 401 and protected(server, second) == 401


def test_live_a_rolled_out_secret_revokes_only_itself(server):
    browser = Browser(server).signup()
    key_id, old = new_key(browser)
    assert roll(browser, key_id, csrf(browser), grace="1h", current=old[:12]).status_code == 302
    new = SECRET_PATTERN.search(browser.get("/settings/security").text)[1]
    for _ in range(4):  # both workers hold both secrets
        assert protected(server, old) == protected(server, new) == 200
    response = requests.post(server.base + "/api/v1/keys/revoke", timeout=10,
                             headers={"X-API-Key": old, "X-Forwarded-For": "192.0.2.10"})
    assert response.json() == {"revoked": True, "api_key_name": "key", "secret": "previous"}
    for _ in range(4):
        assert protected(server, old) == 401
        assert protected(server, new) == 200
    assert "key.previous_secret_revoked" in browser.get("/settings/security").text


def test_live_accounts_deleted_under_a_stream_of_requests_get_401s_never_500s(server):
    statuses = []
    for _ in range(3):
        browser = Browser(server).signup()
        _, secret = new_key(browser)
        token = re.search(r'name="csrf_token" value="([^"]+)"', browser.get("/settings/profile").text)[1]

        def hammer(path, secret=secret):
            session = requests.Session()
            seen = []
            for _ in range(150):
                seen.append(session.get(server.base + path, headers={"X-API-Key": secret}, timeout=10).status_code)
                if seen[-1] == 401:
                    break
            return seen

        with concurrent.futures.ThreadPoolExecutor(5) as pool:
            streams = [pool.submit(hammer, path) for path in ["/api/v1/user/me"] * 3 + ["/api/v1/usage/stats"] * 2]
            deleted = browser.http.post(browser.base + "/settings/profile/delete",
                                        data={"csrf_token": token, "password": "tangerine submarine 42"},
                                        allow_redirects=False, timeout=30)
            assert deleted.status_code == 302
            for stream in streams:
                statuses += stream.result()
    assert set(statuses) <= {200, 401}, sorted(set(statuses))
    assert "Traceback" not in server.output()


def test_live_a_path_cannot_forge_an_access_log_line(server):
    forged = '127.0.0.1 "GET /admin HTTP/1.1" 200 2 1ms forged'
    path = "/api/v1/nothing%0a" + requests.utils.quote(forged, safe="")
    response = requests.get(server.base + path, timeout=10)
    assert response.status_code == 404
    request_id = response.headers["X-Request-ID"]
    output = server.wait_for_output(request_id)
    lines = [line for line in output.splitlines() if "GET /admin" in line]
    assert len(lines) == 1 and request_id in lines[0] and lines[0].startswith("127.0.0.1 ")
    assert '/api/v1/nothing\\x0a127.0.0.1 \\"GET /admin HTTP/1.1\\" 200' in lines[0]


def test_live_ipv6_clients_share_their_64s_allowance(server):
    def status_from(address):
        return requests.get(server.base + "/api/v1/status", headers={"X-Forwarded-For": address}, timeout=10)

    # PUBLIC_RATE_LIMIT is 5/minute here; on SQLite each worker keeps its own windows.
    allowance = 5 if server.shared_limits else 10
    answers = [status_from(f"2001:db8:aa:{1 if server.shared_limits else 2}::{n + 1}") for n in range(allowance + 1)]
    assert [answer.status_code for answer in answers].count(429) >= 1
    assert status_from("2001:db8:bb:1::1").status_code == 200


def test_live_accounts_writing_at_once_on_two_workers_are_not_refused(server):
    # On SQLite, a transaction that read first failed at once ("database is locked", 503) when the
    # other worker had committed meanwhile; writing first, it waits its turn.
    browsers = [Browser(server).signup() for _ in range(4)]
    tokens = {browser: csrf(browser) for browser in browsers}

    def create(browser, n):
        return browser.http.post(f"{browser.base}/settings/security/keys", timeout=30, allow_redirects=False,
                                 data={"csrf_token": tokens[browser], "name": f"k{n}",
                                       "type": "production"}).status_code

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(lambda job: create(*job), [(browser, n) for browser in browsers for n in range(8)]))
    assert statuses == [302] * 32, statuses
