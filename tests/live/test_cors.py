"""CORS on the live server (the Procfile's gunicorn): with CORS_ORIGINS, an allowed origin reads
successes, errors and 429s and gets its preflight answered, and another origin nothing; without it,
no Access-Control-* header at all. The setting's rules in-process: tests/unit/serving/test_cors.py."""

import pytest
import requests
from corschecks import ALLOWED, PREFLIGHT, assert_preflight_answered, assert_readable_by, cors_headers
from liveserver import make_key, service_env, serving


@pytest.fixture(scope="module")
def cors_live(tmp_path_factory):
    """(server, keys): the Procfile's gunicorn with CORS_ORIGINS set; a free and a tiny key."""
    tmp_path = tmp_path_factory.mktemp("cors")
    env = service_env(tmp_path, CORS_ORIGINS=f"{ALLOWED},http://localhost:3000")
    keys = {"free": make_key(env), "tiny": make_key(env, "tiny")}
    with serving(tmp_path, env) as server:
        yield server, keys


def test_live_server_with_cors_origins(cors_live):
    server, keys = cors_live
    base = server.base + "/api/v1"

    preflight = requests.options(base + "/protected/test", headers={"Origin": ALLOWED, **PREFLIGHT}, timeout=10)
    assert_preflight_answered(preflight, ALLOWED)

    success = requests.get(base + "/protected/test", headers={"Origin": ALLOWED, "X-API-Key": keys["free"]},
                           timeout=10)
    assert success.status_code == 200
    assert_readable_by(success, ALLOWED)
    assert success.headers["X-Request-ID"] and success.headers["X-RateLimit-Limit"] == "100000"

    unauthorized = requests.get(base + "/user/me", headers={"Origin": ALLOWED}, timeout=10)
    assert unauthorized.status_code == 401
    assert_readable_by(unauthorized, ALLOWED)

    tiny = {"Origin": ALLOWED, "X-API-Key": keys["tiny"]}
    statuses = [requests.get(base + "/usage/stats", headers=tiny, timeout=10) for _ in range(3)]
    assert [response.status_code for response in statuses] == [200, 200, 429]
    assert_readable_by(statuses[-1], ALLOWED)
    assert statuses[-1].json()["error"]["code"] == "rate_limit_exceeded"

    refused = requests.options(base + "/protected/test", headers={"Origin": "https://evil.example", **PREFLIGHT},
                               timeout=10)
    assert refused.status_code == 204
    assert cors_headers(refused) == {}
    assert cors_headers(requests.get(base + "/status", headers={"Origin": "https://evil.example"}, timeout=10)) == {}


def test_live_server_without_cors_origins(live):
    server, secret = live
    base = server.base + "/api/v1"
    responses = [
        requests.options(base + "/protected/test", headers={"Origin": ALLOWED, **PREFLIGHT}, timeout=10),
        requests.get(base + "/protected/test", headers={"Origin": ALLOWED, "X-API-Key": secret}, timeout=10),
        requests.get(base + "/protected/test", headers={"Origin": ALLOWED}, timeout=10),
    ]
    assert [response.status_code for response in responses] == [204, 200, 401]
    for response in responses:
        assert cors_headers(response) == {}
