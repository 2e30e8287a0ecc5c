"""CORS, opt-in with CORS_ORIGINS: the setting is checked at start; an allowed origin's scripts may
read every /api/v1/ response (errors included) and get their preflight answered; nothing else gets
an Access-Control-* header, nor does anyone without the setting; with Flask's test client (the live
server: tests/live/test_cors.py)."""

import pytest
from appconfig import TEST_TIERS
from corschecks import ALLOWED, PREFLIGHT, assert_preflight_answered, assert_readable_by, cors_headers, names

from accounts import users
from app import close_app, create_app, load_config
from orgs import keyactions
from serving import cors


@pytest.mark.parametrize("value, origins", [
    (None, ()),
    ("", ()),
    (" , ", ()),
    ("*", ("*",)),
    (" * ", ("*",)),
    ("https://app.example.com", ("https://app.example.com",)),
    ("HTTPS://App.Example.COM:443, http://localhost:3000,https://app.example.com",
     ("https://app.example.com", "http://localhost:3000")),
    ("http://127.0.0.1:80,http://[::1]:8080", ("http://127.0.0.1", "http://[::1]:8080")),
    ("capacitor://localhost", ("capacitor://localhost",)),
])
def test_the_setting_is_read_as_browsers_send_origins(value, origins):
    environ = {} if value is None else {"CORS_ORIGINS": value}
    assert load_config(environ)["CORS_ORIGINS"] == origins


@pytest.mark.parametrize("value", [
    "https://app.example.com/", "https://app.example.com/path", "app.example.com", "https://*.example.com",
    "null", "https://user@app.example.com", "https://app.example.com?x=1", "https://app.example.com:port",
    "https://", "ftp//x",
])
def test_a_malformed_origin_is_refused_at_start_with_a_sentence(value):
    with pytest.raises(ValueError, match=r"CORS_ORIGINS entry .* is not an origin like https://app\.example\.com"):
        load_config({"CORS_ORIGINS": f"http://localhost:3000,{value}"})


def test_a_wildcard_stands_alone():
    with pytest.raises(ValueError, match=r"CORS_ORIGINS is either \* alone or a list of origins, not both\."):
        load_config({"CORS_ORIGINS": "*,https://app.example.com"})


@pytest.fixture
def make_app(tmp_path):
    """Build apps on one SQLite file with a CORS_ORIGINS tuple; each yields (app, client, key)."""
    apps = []

    def make(origins):
        app = create_app({
            "DATABASE_URL": f"sqlite:///{tmp_path}/cors.db",
            "RATELIMIT_STORAGE_URL": "memory://",
            "RATE_LIMIT_TIERS": TEST_TIERS,
            "PUBLIC_RATE_LIMIT": "5/minute",
            "TESTING": True,
            "CORS_ORIGINS": origins,
        })
        apps.append(app)
        with app.app_context():
            user = users.create_user(f"user{len(apps)}", f"user{len(apps)}@example.com", "correct horse battery")
            _, key = keyactions.issue_key(user, "key", "development")
        return app, app.test_client(), key

    yield make
    for app in apps:
        close_app(app)


def test_without_the_setting_no_hook_runs_and_no_header_is_sent(make_app):
    app, client, key = make_app(())
    # The hot path pays nothing for CORS when it is off: the hook is not even registered.
    assert cors.add_cors_headers not in app.after_request_funcs[None]
    for response in (client.get("/api/v1/protected/test", headers={"X-API-Key": key, "Origin": ALLOWED}),
                     client.get("/api/v1/protected/test", headers={"Origin": ALLOWED}),
                     client.options("/api/v1/protected/test", headers={"Origin": ALLOWED, **PREFLIGHT})):
        assert cors_headers(response) == {}
        assert "Origin" not in names(response.headers.get("Vary", ""))


def test_an_allowed_origin_reads_a_success_and_its_rate_limit(make_app):
    _, client, key = make_app((ALLOWED, "http://localhost:3000"))
    response = client.get("/api/v1/usage/stats", headers={"X-API-Key": key, "Origin": ALLOWED})
    assert response.status_code == 200
    assert_readable_by(response, ALLOWED)
    assert response.headers["X-RateLimit-Remaining"] == str(response.get_json()["requests_remaining"])
    other = client.get("/api/v1/status", headers={"Origin": "http://localhost:3000"})
    assert_readable_by(other, "http://localhost:3000")


@pytest.mark.parametrize("path, headers, status, code", [
    ("/api/v1/protected/test", {}, 401, "missing_api_key"),
    ("/api/v1/protected/test", {"X-API-Key": "sk_live_" + "A" * 38}, 401, "invalid_api_key"),
    ("/api/v1/no-such-thing", {}, 404, "not_found"),
    ("/api/v1/keys/revoke", {}, 405, "method_not_allowed"),
])
def test_an_allowed_origin_reads_errors_too(make_app, path, headers, status, code):
    _, client, _ = make_app((ALLOWED,))
    response = client.get(path, headers={**headers, "Origin": ALLOWED})
    assert (response.status_code, response.get_json()["error"]["code"]) == (status, code)
    assert_readable_by(response, ALLOWED)


def test_an_allowed_origin_reads_a_429_and_when_to_retry(make_app):
    _, client, key = make_app((ALLOWED,))
    headers = {"X-API-Key": key, "Origin": ALLOWED}
    responses = [client.get("/api/v1/protected/test", headers=headers) for _ in range(4)]
    assert [response.status_code for response in responses] == [200, 200, 200, 429]
    assert_readable_by(responses[-1], ALLOWED)
    assert int(responses[-1].headers["Retry-After"]) >= 1


@pytest.mark.parametrize("path", ["/api/v1/protected/test", "/api/v1/status", "/api/v1/keys/revoke"])
def test_a_preflight_is_answered_204_and_counts_nothing(make_app, path):
    _, client, key = make_app((ALLOWED,))
    for _ in range(5):
        assert_preflight_answered(client.options(path, headers={"Origin": ALLOWED, **PREFLIGHT}), ALLOWED)
    # free is 3/minute: the preflights above took none of it.
    assert client.get("/api/v1/protected/test", headers={"X-API-Key": key}).headers["X-RateLimit-Remaining"] == "2"


def test_a_plain_options_request_is_no_preflight(make_app):
    _, client, _ = make_app((ALLOWED,))
    response = client.options("/api/v1/status", headers={"Origin": ALLOWED})
    assert response.status_code == 204
    assert_readable_by(response, ALLOWED)
    assert "Access-Control-Allow-Methods" not in response.headers


@pytest.mark.parametrize("origin", ["https://evil.example.com", "https://app.example.com.evil.example", "null",
                                    "http://app.example.com"])
def test_another_origin_gets_no_access_control_header(make_app, origin):
    _, client, key = make_app((ALLOWED,))
    for response in (client.get("/api/v1/protected/test", headers={"X-API-Key": key, "Origin": origin}),
                     client.get("/api/v1/protected/test", headers={"Origin": origin}),
                     client.options("/api/v1/protected/test", headers={"Origin": origin, **PREFLIGHT})):
        assert cors_headers(response) == {}
        # A cache must still not hand this answer to an allowed origin.
        assert "Origin" in names(response.headers["Vary"])


def test_a_request_without_origin_gets_no_access_control_header(make_app):
    _, client, key = make_app((ALLOWED,))
    assert cors_headers(client.get("/api/v1/protected/test", headers={"X-API-Key": key})) == {}


@pytest.mark.parametrize("path", ["/", "/login", "/healthz", "/readyz", "/api/v2/nothing", "/static/style.css"])
def test_only_the_api_is_opened(make_app, path):
    _, client, _ = make_app(("*",))
    assert cors_headers(client.get(path, headers={"Origin": ALLOWED})) == {}


def test_a_wildcard_lets_any_origin_read_without_credentials(make_app):
    _, client, key = make_app(("*",))
    for origin in (ALLOWED, "https://anyone.example"):
        response = client.get("/api/v1/user/me", headers={"X-API-Key": key, "Origin": origin})
        assert response.status_code == 200
        assert_readable_by(response, origin, expected="*")
    assert_preflight_answered(client.options("/api/v1/user/me", headers={"Origin": ALLOWED, **PREFLIGHT}), "*")
