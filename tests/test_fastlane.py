"""The fast lane (fastlane.py): which requests take it, that each answer is the one Flask gives, and
when the app has no lane at all. The apps here have no application context around their requests,
as under gunicorn, so a lane view that reached for current_app or g would fail here too."""

import re

import pytest
from flask import signals

import accounts
import auth
import fastlane
import metrics
import models
from conftest import TEST_TIERS

ALLOWED, OTHER = "203.0.113.7", "198.51.100.1"
# What differs between two answers to the same request made one after the other.
VARYING_HEADERS = {"X-Request-ID", "X-RateLimit-Remaining", "X-RateLimit-Reset", "RateLimit", "Retry-After"}
TIMESTAMP = re.compile(rb'"(timestamp|created_at)":"[^"]*"')


@pytest.fixture
def lane_app(make_app, database_url):
    return make_app({"DATABASE_URL": database_url, "RATELIMIT_STORAGE_URL": "memory://",
                     "RATE_LIMIT_TIERS": TEST_TIERS, "TESTING": True})


def lane_of(app):
    """The Lane in the app's WSGI stack (inside the envelope and any ProxyFix)."""
    wsgi_app = app.wsgi_app
    while not isinstance(wsgi_app, fastlane.Lane):
        wsgi_app = wsgi_app.wsgi_app
    return wsgi_app


def issue(app, name="Alice dev", **options):
    with app.app_context():
        user = models.User.get_or_none(models.User.username == "alice") or accounts.create_user(
            "alice", "alice@example.com", "correct horse battery")
        return auth.issue_key(user, name, "development", **options)


def through_flask(app, send):
    """Send a request; return its response and whether Flask dispatched it."""
    dispatched = []
    with signals.request_started.connected_to(lambda sender, **extra: dispatched.append(sender), app):
        response = send()
    return response, bool(dispatched)


def answer(response):
    headers = [(name, value) for name, value in response.headers if name not in VARYING_HEADERS]
    return response.status, headers, TIMESTAMP.sub(b'"\\1":"-"', response.data)


def test_the_default_app_serves_its_two_plain_keyed_views_in_the_lane(lane_app):
    assert set(lane_of(lane_app).views) == {"/api/v1/protected/test", "/api/v1/user/me"}


@pytest.mark.parametrize("path", ["/api/v1/protected/test", "/api/v1/user/me"])
def test_a_plain_keyed_get_takes_the_lane(lane_app, path):
    _, secret = issue(lane_app)
    response, dispatched = through_flask(lane_app, lambda: lane_app.test_client().get(
        path, headers={"X-API-Key": secret}))
    assert response.status_code == 200 and not dispatched
    assert response.headers["Content-Type"] == "application/json"
    assert response.headers["X-RateLimit-Remaining"] == "2"
    assert response.data.endswith(b"}\n") and int(response.headers["Content-Length"]) == len(response.data)


@pytest.mark.parametrize("request_options", [
    {"method": "HEAD"},
    {"method": "OPTIONS"},
    {"method": "get"},
    {"method": "GET", "data": b"hello"},
    {"method": "GET", "headers": {"Transfer-Encoding": "chunked"}, "input_stream": None},
    {"method": "GET", "headers": {"Origin": "https://example.com"}},
    {"method": "GET", "path": "/api/v1/protected/test/"},
    {"method": "GET", "path": "//api/v1/protected/test"},
], ids=["head", "options", "lowercase", "body", "chunked", "origin", "trailing-slash", "double-slash"])
def test_anything_but_a_plain_get_of_the_exact_path_goes_through_flask(lane_app, request_options):
    _, secret = issue(lane_app)
    options = dict(request_options)
    if options.pop("input_stream", False) is None:
        options["data"] = b"0\r\n\r\n"
    path = options.pop("path", "/api/v1/protected/test")
    options["headers"] = {"X-API-Key": secret, **options.get("headers", {})}
    _, dispatched = through_flask(lane_app, lambda: lane_app.test_client().open(path, **options))
    assert dispatched


def refusal_cases(app):
    """(name, path, headers, client address) of requests the lane refuses, each refusal of the guard."""
    _, secret = issue(app)
    _, second = issue(app, "Alice second")
    _, narrow = issue(app, "Narrow", scopes=["user:read"])
    _, office = issue(app, "Office", allow_ips=ALLOWED)
    revoked, revoked_secret = issue(app, "Revoked")
    with app.app_context():
        auth.revoke_key(revoked)
    _, busy = issue(app, "Busy")
    for _ in range(3):  # the free tier's allowance: 3 a minute
        assert app.test_client().get("/api/v1/protected/test", headers={"X-API-Key": busy}).status_code == 200
    return [
        ("missing", "/api/v1/protected/test", {}, ALLOWED),
        ("blank", "/api/v1/protected/test", {"X-API-Key": "  "}, ALLOWED),
        ("malformed", "/api/v1/protected/test", {"X-API-Key": "not a key"}, ALLOWED),
        ("unknown", "/api/v1/protected/test", {"X-API-Key": auth.generate_secret("development")}, ALLOWED),
        ("revoked", "/api/v1/user/me", {"X-API-Key": revoked_secret}, ALLOWED),
        ("scope", "/api/v1/protected/test", {"X-API-Key": narrow}, ALLOWED),
        ("allow-list", "/api/v1/user/me", {"X-API-Key": office}, OTHER),
        ("served", "/api/v1/protected/test", {"X-API-Key": secret}, ALLOWED),
        ("served", "/api/v1/user/me", {"X-API-Key": second}, ALLOWED),
        ("over the limit", "/api/v1/protected/test", {"X-API-Key": busy}, ALLOWED),
    ]


def test_every_answer_of_the_lane_is_the_one_flask_gives(lane_app, monkeypatch):
    lane = lane_of(lane_app)
    views = lane.views
    for name, path, headers, address in refusal_cases(lane_app):
        answers = []
        for lane_views in (views, {}):
            monkeypatch.setattr(lane, "views", lane_views)
            response, dispatched = through_flask(lane_app, lambda: lane_app.test_client().get(
                path, headers=headers, environ_base={"REMOTE_ADDR": address}))
            # In the lane, a refusal is rendered by Flask's handlers, but never dispatched by Flask.
            assert dispatched == (not lane_views), name
            answers.append(answer(response))
        assert answers[0] == answers[1], name
        if name == "over the limit":
            assert answers[0][0] == "429 TOO MANY REQUESTS"


def test_the_lane_counts_and_records_each_request_under_its_route(lane_app):
    key, secret = issue(lane_app)
    client = lane_app.test_client()
    before = {labels: counts[0] for labels, counts in metrics.tally.requests.items()}
    for _ in range(4):
        client.get("/api/v1/protected/test", headers={"X-API-Key": secret})
    counted = metrics.tally.requests
    route = ("/api/v1/protected/test", "GET")
    assert counted[route + (200,)][0] - before.get(route + (200,), 0) == 3
    assert counted[route + (429,)][0] - before.get(route + (429,), 0) == 1
    usage = lane_app.extensions["usage"]
    usage.flush()
    assert usage.total(key.id) == 3
    with lane_app.app_context():
        rows = models.UsageHour.select().where(models.UsageHour.api_key == key.id)
        assert {(row.endpoint, row.status) for row in rows} == {
            ("/api/v1/protected/test", 200), ("/api/v1/protected/test", 429)}


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_the_lane_gives_back_its_pooled_connection(lane_app):
    _, secret = issue(lane_app)
    response = lane_app.test_client().get("/api/v1/user/me", headers={"X-API-Key": secret})
    assert response.status_code == 200
    assert models.db.obj.is_closed()


@pytest.mark.parametrize("overrides", [
    {"CORS_ORIGINS": ("https://app.example.com",)},
    {"DEBUG": True},
    {"TRUSTED_HOSTS": ["api.example.com"]},
], ids=["cors", "debug", "trusted-hosts"])
def test_an_app_whose_flask_would_do_more_has_no_lane(make_app, tmp_path, overrides):
    app = make_app({"DATABASE_URL": f"sqlite:///{tmp_path}/lane.db", "RATE_LIMIT_TIERS": TEST_TIERS, **overrides})
    assert lane_of(app).views == {}


def test_a_hook_the_lane_does_not_know_turns_it_off(lane_app):
    assert fastlane.flask_would_only_call_the_view(lane_app)
    lane_app.before_request(lambda: None)
    assert not fastlane.flask_would_only_call_the_view(lane_app)
