"""The REST endpoints through Flask's test client: fields, types, errors and headers."""

import datetime
import re
import time

import pytest
from contract import assert_error
from flask.json.provider import DefaultJSONProvider

from api import VERSION
from keys import keyformat
from models import ApiKey
from ops import note as request_note
from orgs import keyactions

MS_TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
SECOND_TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")
PROTECTED = ["/api/v1/protected/test", "/api/v1/user/me", "/api/v1/usage/stats"]


def parse_ms(text):
    return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=datetime.UTC)


def test_demo_year(client):
    response = client.get("/api/v1/demo/year")
    assert response.status_code == 200
    body = response.get_json()
    assert list(body) == ["year", "message", "timestamp"]
    now = datetime.datetime.now(datetime.UTC)
    assert body["year"] == now.year
    assert str(now.year) in body["message"]
    assert MS_TIMESTAMP.fullmatch(body["timestamp"])
    assert abs((parse_ms(body["timestamp"]) - now).total_seconds()) < 5


def test_status_without_key(client):
    response = client.get("/api/v1/status")
    assert response.status_code == 200
    assert response.get_json() == {"status": "operational", "version": VERSION, "authenticated": False}
    assert re.fullmatch(r"\d+\.\d+\.\d+", VERSION)


def test_status_with_valid_key(client, api_key):
    body = client.get("/api/v1/status", headers={"X-API-Key": api_key}).get_json()
    assert body["authenticated"] is True


def test_status_with_invalid_key_is_not_an_error(client):
    response = client.get("/api/v1/status", headers={"X-API-Key": "sk_test_" + "x" * 40})
    assert response.status_code == 200
    assert response.get_json()["authenticated"] is False


def test_protected_test(client, api_key):
    response = client.get("/api/v1/protected/test", headers={"X-API-Key": api_key})
    assert response.status_code == 200
    body = response.get_json()
    assert list(body) == ["success", "message", "api_key_name", "api_key_type", "rate_limit_tier", "timestamp"]
    assert body["success"] is True
    assert "valid" in body["message"]
    assert (body["api_key_name"], body["api_key_type"], body["rate_limit_tier"]) == ("Alice dev", "development", "free")
    assert MS_TIMESTAMP.fullmatch(body["timestamp"])


def test_protected_test_reports_production_type(client, pro_key):
    body = client.get("/api/v1/protected/test", headers={"X-API-Key": pro_key}).get_json()
    assert (body["api_key_type"], body["rate_limit_tier"]) == ("production", "pro")


def test_user_me(client, user, api_key):
    keyactions.issue_key(user, "second", "production")
    revoked, _ = keyactions.issue_key(user, "gone", "production")
    keyactions.revoke_key(revoked)
    response = client.get("/api/v1/user/me", headers={"X-API-Key": api_key})
    assert response.status_code == 200
    body = response.get_json()
    assert body == {
        "user_id": user.id,
        "username": "alice",
        "email": "alice@example.com",
        "created_at": user.created_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "api_key_count": 2,
    }
    assert SECOND_TIMESTAMP.fullmatch(body["created_at"])


def test_usage_stats_counts_itself_and_matches_headers(client, pro_key):
    headers = {"X-API-Key": pro_key}
    client.get("/api/v1/protected/test", headers=headers)
    client.get("/api/v1/user/me", headers=headers)
    response = client.get("/api/v1/usage/stats", headers=headers)
    assert response.status_code == 200
    body = response.get_json()
    assert list(body) == ["api_key_name", "total_requests", "rate_limit_tier", "requests_remaining", "reset_time"]
    assert body["api_key_name"] == "Alice live"
    assert body["total_requests"] == 3
    assert body["rate_limit_tier"] == "pro"
    assert body["requests_remaining"] == 97 == int(response.headers["X-RateLimit-Remaining"])
    assert SECOND_TIMESTAMP.fullmatch(body["reset_time"])
    reset = datetime.datetime.strptime(body["reset_time"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)
    assert int(reset.timestamp()) == int(response.headers["X-RateLimit-Reset"])
    assert 0 < reset.timestamp() - time.time() <= 61


def test_total_requests_survive_a_flush_and_exclude_rejections(app, client, api_key):
    headers = {"X-API-Key": api_key}
    for _ in range(3):
        assert client.get("/api/v1/protected/test", headers=headers).status_code == 200
    assert_error(client.get("/api/v1/protected/test", headers=headers), 429, "rate_limit_exceeded")
    assert_error(client.get("/api/v1/protected/test", headers={"X-API-Key": api_key[:-1] + "_"}), 401,
                 "invalid_api_key")
    app.extensions["usage"].flush()
    stored = ApiKey.get(ApiKey.key_hash == keyformat.hash_key(api_key))
    assert stored.total_requests == 3
    assert stored.last_used_at is not None


@pytest.mark.parametrize("path", PROTECTED)
def test_protected_headers(client, api_key, path):
    response = client.get(path, headers={"X-API-Key": api_key})
    assert response.status_code == 200
    h = response.headers
    assert h["X-RateLimit-Limit"] == "3"
    assert h["X-RateLimit-Remaining"] == "2"
    reset = int(h["X-RateLimit-Reset"])
    assert 0 < reset - time.time() <= 61
    assert h["RateLimit-Policy"] == '"free";q=3;w=60'
    match = re.fullmatch(r'"free";r=2;t=(\d+)', h["RateLimit"])
    assert match and 0 < int(match[1]) <= 60


@pytest.mark.parametrize("path", PROTECTED)
@pytest.mark.parametrize("headers, code", [
    ({}, "missing_api_key"),
    ({"X-API-Key": ""}, "missing_api_key"),
    ({"X-API-Key": "nonsense"}, "invalid_api_key"),
    ({"X-API-Key": "sk_live_" + "A" * 40}, "invalid_api_key"),
    ({"Authorization": "Bearer sk_live_" + "A" * 40}, "missing_api_key"),
])
def test_protected_rejections(client, path, headers, code):
    response = client.get(path, headers=headers)
    assert_error(response, 401, code)
    assert response.headers["WWW-Authenticate"].startswith("ApiKey")
    assert "X-RateLimit-Limit" not in response.headers


def test_key_in_query_string_counts_as_missing(client, api_key):
    assert_error(client.get(f"/api/v1/protected/test?api_key={api_key}"), 401, "missing_api_key")


def test_revoked_key_fails_on_the_next_request(client, api_key):
    headers = {"X-API-Key": api_key}
    assert client.get("/api/v1/protected/test", headers=headers).status_code == 200
    keyactions.revoke_key(ApiKey.get(ApiKey.key_hash == keyformat.hash_key(api_key)))
    assert_error(client.get("/api/v1/protected/test", headers=headers), 401, "invalid_api_key")


def test_rate_limit_exceeded(client, api_key):
    headers = {"X-API-Key": api_key}
    remaining = [client.get("/api/v1/protected/test", headers=headers).headers["X-RateLimit-Remaining"]
                 for _ in range(3)]
    assert remaining == ["2", "1", "0"]
    response = client.get("/api/v1/usage/stats", headers=headers)
    assert_error(response, 429, "rate_limit_exceeded")
    retry_after = int(response.headers["Retry-After"])
    assert 1 <= retry_after <= 60
    assert response.headers["X-RateLimit-Remaining"] == "0"
    assert response.headers["RateLimit"].startswith('"free";r=0;t=')


def test_limits_are_per_key(client, user, api_key):
    _, other = keyactions.issue_key(user, "other", "development")
    for _ in range(3):
        client.get("/api/v1/protected/test", headers={"X-API-Key": api_key})
    assert_error(client.get("/api/v1/protected/test", headers={"X-API-Key": api_key}), 429, "rate_limit_exceeded")
    assert client.get("/api/v1/protected/test", headers={"X-API-Key": other}).status_code == 200


def test_public_endpoints_are_limited_per_ip(client):
    statuses = [client.get("/api/v1/demo/year").status_code for _ in range(5)]
    assert statuses == [200] * 5
    response = client.get("/api/v1/status")
    assert_error(response, 429, "rate_limit_exceeded")
    assert response.headers["RateLimit-Policy"] == '"public";q=5;w=60'
    other_ip = client.get("/api/v1/status", environ_base={"REMOTE_ADDR": "10.0.0.9"})
    assert other_ip.status_code == 200


def test_public_limit_can_be_turned_off(tmp_path, make_app):
    app = make_app({"DATABASE_URL": f"sqlite:///{tmp_path}/off.db", "PUBLIC_RATE_LIMIT": "off"})
    client = app.test_client()
    responses = [client.get("/api/v1/demo/year") for _ in range(700)]
    assert {r.status_code for r in responses} == {200}
    assert "X-RateLimit-Limit" not in responses[0].headers


def test_forwarded_for_is_ignored_without_trusted_proxies(client):
    for i in range(5):
        client.get("/api/v1/demo/year", headers={"X-Forwarded-For": f"10.1.1.{i}"})
    assert_error(client.get("/api/v1/demo/year", headers={"X-Forwarded-For": "10.9.9.9"}), 429, "rate_limit_exceeded")


def test_forwarded_for_is_honoured_with_one_trusted_proxy(tmp_path, make_app):
    app = make_app({"DATABASE_URL": f"sqlite:///{tmp_path}/proxy.db", "PUBLIC_RATE_LIMIT": "2/minute",
                      "TRUSTED_PROXIES": 1})
    client = app.test_client()
    for _ in range(2):
        client.get("/api/v1/demo/year", headers={"X-Forwarded-For": "10.1.1.1"})
    assert_error(client.get("/api/v1/demo/year", headers={"X-Forwarded-For": "10.1.1.1"}), 429, "rate_limit_exceeded")
    assert client.get("/api/v1/demo/year", headers={"X-Forwarded-For": "10.1.1.2"}).status_code == 200


def test_unknown_tier_is_a_clear_error_not_a_pass(app, client, user):
    key, secret = keyactions.issue_key(user, "k", "development", "pro")
    ApiKey.update(rate_limit_tier="platinum").where(ApiKey.id == key.id).execute()
    response = client.get("/api/v1/protected/test", headers={"X-API-Key": secret})
    body = assert_error(response, 500, "internal_error")
    assert "tier" in body["error"]["message"]


@pytest.mark.parametrize("tiers", ["free", "free=10", "free=10/fortnight", "free=0/hour", "=5/hour",
                                   "free=1/hour,free=2/hour"])
def test_bad_tier_configuration_fails_at_start(tmp_path, tiers):
    from app import create_app

    with pytest.raises(ValueError, match="RATE_LIMIT_TIERS|not a rate"):
        create_app({"DATABASE_URL": f"sqlite:///{tmp_path}/bad.db", "RATE_LIMIT_TIERS": tiers})


def test_unknown_path_is_json_404(client):
    assert_error(client.get("/api/v1/nothing-here"), 404, "not_found")
    assert_error(client.get("/nothing-here"), 404, "not_found")


@pytest.mark.parametrize("method", ["post", "put", "delete", "patch"])
def test_wrong_method_is_json_405_with_allow(client, method):
    response = getattr(client, method)("/api/v1/status")
    assert_error(response, 405, "method_not_allowed")
    assert "GET" in response.headers["Allow"]


def test_unexpected_error_is_json_500_without_detail(app, client, api_key, monkeypatch, caplog):
    import models

    def explode():
        raise RuntimeError("secret internal detail")

    monkeypatch.setattr(models, "now_strings", explode)
    response = client.get("/api/v1/protected/test", headers={"X-API-Key": api_key})
    body = assert_error(response, 500, "internal_error")
    assert "secret internal detail" not in response.get_data(as_text=True)
    assert "Traceback" not in response.get_data(as_text=True)
    assert "RuntimeError: secret internal detail" in caplog.text
    assert body["error"]["message"]


def test_database_down_is_json_503(app, client, api_key, monkeypatch):
    import peewee

    import models

    def refuse(*args, **kwargs):
        raise peewee.OperationalError("unable to open database file")

    monkeypatch.setattr(models.db.obj, "execute_sql", refuse)
    assert_error(client.get("/api/v1/protected/test", headers={"X-API-Key": api_key}), 503, "service_unavailable")


@pytest.mark.parametrize("value", [
    "sk_test_" + "a" * 100_000,
    "sk_test_\x01\x02\x7f" + "a" * 40,
    "sk_test_ключ" + "a" * 40,
    "sk_test_" + "a" * 40 + ", sk_test_" + "b" * 40,
])
def test_absurd_key_headers_get_401(client, value):
    response = client.get("/api/v1/protected/test", headers={"X-API-Key": value})
    assert_error(response, 401, "invalid_api_key")
    assert value not in response.get_data(as_text=True)


def test_secret_never_echoed_in_errors(client, api_key):
    for headers in ({"X-API-Key": api_key + "x"}, {"X-API-Key": api_key.upper()}):
        response = client.get("/api/v1/protected/test", headers=headers)
        assert headers["X-API-Key"] not in response.get_data(as_text=True)


def test_the_request_the_envelope_serves_is_held_only_while_it_is_served(client, api_key):
    assert client.get("/api/v1/protected/test", headers={"X-API-Key": api_key}).status_code == 200
    # Held for the guard while the app ran; forgotten after, so no later code reads a stale one.
    with pytest.raises(LookupError):
        request_note.current_environ.get()


@pytest.mark.parametrize("debug", [False, True])
def test_json_bodies_are_written_as_flasks_own_provider_writes_them(app, debug):
    flasks_own = DefaultJSONProvider(app)
    flasks_own.sort_keys = False
    body = {"z": "caf\u00e9 \u2028 \U0001f600", "a": [1, 2.5, None, True], "at": datetime.datetime(2026, 1, 2, 3, 4, 5)}
    app.debug = debug
    for args, kwargs in [((body,), {}), ((1, 2), {}), ((), {"b": 1, "a": 2}), ((), {})]:
        ours, theirs = app.json.response(*args, **kwargs), flasks_own.response(*args, **kwargs)
        assert ours.get_data() == theirs.get_data() and ours.mimetype == theirs.mimetype == "application/json"
    assert app.json.response(body).get_data().startswith(b'{"z":"caf\\u00e9') != debug
