"""The fast lane (serving/fastlane.py): which requests take it, that each answer is the one Flask gives, and
when the app has no lane at all. The apps here have no application context around their requests,
as under gunicorn, so a lane view that reached for current_app or g would fail here too."""

import collections
import functools
import re

import pytest
from appconfig import TEST_TIERS
from limits.errors import StorageError
from peewee import OperationalError

import api
import auth
import models
from accounts import users
from keys import keyformat
from ops import metrics
from orgs import keyactions
from serving import fastlane

ALLOWED, OTHER, BUSY_IP = "203.0.113.7", "198.51.100.1", "203.0.113.30"
# What differs between two answers to the same request made one after the other.
VARYING_HEADERS = {"X-Request-ID", "X-RateLimit-Remaining", "X-RateLimit-Reset", "RateLimit", "Retry-After"}
TIMESTAMP = re.compile(rb'"(timestamp|created_at)":"[^"]*"')


@pytest.fixture
def lane_app(make_app, database_url):
    return make_app({"DATABASE_URL": database_url, "RATELIMIT_STORAGE_URL": "memory://",
                     "RATE_LIMIT_TIERS": TEST_TIERS, "PUBLIC_RATE_LIMIT": "5/minute", "TESTING": True})


def find_lane(app):
    """The Lane in the app's WSGI stack (inside the envelope and any ProxyFix)."""
    middleware = app.wsgi_app.__self__
    while not isinstance(middleware, fastlane.Lane):
        middleware = (getattr(middleware, "wsgi_app", None) or middleware.app).__self__  # ProxyFix keeps it as .app
    return middleware


def lane_of(app):
    """The app's Lane, opened as by the app's first request."""
    lane = find_lane(app)
    if lane.views is None:
        lane.views = lane.open()
    return lane


def issue(app, name="Alice dev", **options):
    with app.app_context():
        user = models.User.get_or_none(models.User.username == "alice") or users.create_user(
            "alice", "alice@example.com", "correct horse battery")
        return keyactions.issue_key(user, name, "development", **options)


def through_flask(app, send, monkeypatch):
    """Send a request; return its response and whether the lane handed it to Flask."""
    lane, handed = lane_of(app), []
    flask_app = lane.wsgi_app
    monkeypatch.setattr(lane, "wsgi_app", lambda environ, start_response: (
        handed.append(environ["PATH_INFO"]), flask_app(environ, start_response))[1])
    try:
        return send(), bool(handed)
    finally:
        monkeypatch.setattr(lane, "wsgi_app", flask_app)


def answer(response):
    headers = [(name, value) for name, value in response.headers if name not in VARYING_HEADERS]
    return response.status, headers, TIMESTAMP.sub(b'"\\1":"-"', response.data)


def test_the_default_app_serves_its_plain_views_in_the_lane(lane_app):
    assert set(lane_of(lane_app).views) == {"/api/v1/protected/test", "/api/v1/user/me", "/api/v1/usage/stats",
                                            "/api/v1/usage/history", "/api/v1/demo/year", "/api/v1/status"}


@pytest.mark.parametrize("path", ["/api/v1/protected/test", "/api/v1/user/me", "/api/v1/usage/stats",
                                  "/api/v1/usage/history"])
def test_a_plain_keyed_get_takes_the_lane(lane_app, path, monkeypatch):
    _, secret = issue(lane_app)
    response, dispatched = through_flask(lane_app, lambda: lane_app.test_client().get(
        path, headers={"X-API-Key": secret}), monkeypatch)
    assert response.status_code == 200 and not dispatched
    assert response.headers["Content-Type"] == "application/json"
    assert response.headers["X-RateLimit-Remaining"] == "2"
    assert response.data.endswith(b"}\n") and int(response.headers["Content-Length"]) == len(response.data)


@pytest.mark.parametrize("path", ["/api/v1/demo/year", "/api/v1/status"])
def test_a_plain_public_get_takes_the_lane_and_counts_against_the_client_ip(lane_app, path, monkeypatch):
    response, dispatched = through_flask(lane_app, lambda: lane_app.test_client().get(
        path, environ_base={"REMOTE_ADDR": "192.0.2.44"}), monkeypatch)
    assert response.status_code == 200 and not dispatched
    assert response.headers["X-RateLimit-Limit"] == "5" and response.headers["X-RateLimit-Remaining"] == "4"
    assert response.data.endswith(b"}\n") and int(response.headers["Content-Length"]) == len(response.data)


@pytest.mark.parametrize("request_options", [
    {"method": "HEAD"},
    {"method": "OPTIONS"},
    {"method": "get"},
    {"method": "GET", "data": b"hello"},
    {"method": "GET", "headers": {"Transfer-Encoding": "chunked"}},
    {"method": "GET", "headers": {"Origin": "https://example.com"}},
    {"method": "GET", "headers": {"Connection": "Upgrade", "Upgrade": "websocket"}, "status": 400},
    {"method": "GET", "headers": {"Host": "a..b"}, "status": 400},
    {"method": "GET", "headers": {"Host": "x" * 64 + ".example.com"}, "status": 400},
    {"method": "GET", "path": "/api/v1/protected/test/"},
    {"method": "GET", "path": "//api/v1/protected/test"},
], ids=["head", "options", "lowercase", "body", "chunked", "origin", "upgrade", "empty-label", "long-label",
        "trailing-slash", "double-slash"])
def test_anything_but_a_plain_get_of_the_exact_path_goes_through_flask(lane_app, request_options, monkeypatch):
    _, secret = issue(lane_app)
    options = dict(request_options)
    path, status = options.pop("path", "/api/v1/protected/test"), options.pop("status", None)
    options["headers"] = {"X-API-Key": secret, **options.get("headers", {})}
    response, dispatched = through_flask(lane_app, lambda: lane_app.test_client().open(path, **options), monkeypatch)
    assert dispatched
    if status is not None:  # refused by Flask, and not counted
        assert response.status_code == status and "X-RateLimit-Remaining" not in response.headers


def cases(app):
    """(name, path, headers, client address) of requests the lane serves or refuses: each refusal
    of the guard, and the errors of the storage and the database."""
    _, secret = issue(app)
    _, second = issue(app, "Alice second")
    _, narrow = issue(app, "Narrow", scopes=["user:read"])
    _, office = issue(app, "Office", allow_ips=ALLOWED)
    revoked, revoked_secret = issue(app, "Revoked")
    gold, gold_secret = issue(app, "Gold")
    with app.app_context():
        keyactions.revoke_key(revoked)
        models.ApiKey.update(rate_limit_tier="gold").where(models.ApiKey.id == gold.id).execute()
    _, busy = issue(app, "Busy")
    for _ in range(3):  # the free tier's allowance: 3 a minute
        assert app.test_client().get("/api/v1/protected/test", headers={"X-API-Key": busy}).status_code == 200
    for _ in range(5):  # the public allowance: 5 a minute
        assert app.test_client().get("/api/v1/demo/year", environ_base={"REMOTE_ADDR": BUSY_IP}).status_code == 200
    return [
        ("public", "/api/v1/demo/year", {}, "203.0.113.20"),
        ("public", "/api/v1/status", {"X-API-Key": secret}, "203.0.113.21"),
        ("public", "/api/v1/status", {"X-API-Key": "not a key"}, "203.0.113.22"),
        ("public, over the limit", "/api/v1/demo/year", {}, BUSY_IP),
        ("public, over the limit", "/api/v1/status", {}, BUSY_IP),
        ("missing", "/api/v1/protected/test", {}, ALLOWED),
        ("blank", "/api/v1/protected/test", {"X-API-Key": "  "}, ALLOWED),
        ("malformed", "/api/v1/protected/test", {"X-API-Key": "not a key"}, ALLOWED),
        ("unknown", "/api/v1/protected/test", {"X-API-Key": keyformat.generate_secret("development")}, ALLOWED),
        ("revoked", "/api/v1/user/me", {"X-API-Key": revoked_secret}, ALLOWED),
        ("scope", "/api/v1/protected/test", {"X-API-Key": narrow}, ALLOWED),
        ("allow-list", "/api/v1/user/me", {"X-API-Key": office}, OTHER),
        ("tier not configured", "/api/v1/protected/test", {"X-API-Key": gold_secret}, ALLOWED),
        ("served", "/api/v1/protected/test", {"X-API-Key": secret}, ALLOWED),
        ("served", "/api/v1/user/me", {"X-API-Key": second}, ALLOWED),
        ("over the limit", "/api/v1/protected/test", {"X-API-Key": busy}, ALLOWED),
    ]


def side_effects(app):
    """The metrics' request counts and the usage counter's pending counts, to subtract."""
    return (collections.Counter({labels: counts[0] for labels, counts in metrics.tally.requests.items()}),
            collections.Counter(app.extensions["usage"].pending))


def both_ways(app, monkeypatch, send, lane_declines=False):
    """Send a request through the lane, then the same through Flask; return both answers, each with
    the metrics and usage counts it added. lane_declines: the lane must hand the request to Flask."""
    lane = lane_of(app)
    views, answers = lane.views, []
    for lane_views in (views, {}):
        monkeypatch.setattr(lane, "views", lane_views)
        before = side_effects(app)
        response, dispatched = through_flask(app, send, monkeypatch)
        # In the lane, a refusal is rendered by Flask's handlers, but never dispatched by Flask.
        assert dispatched == (lane_declines or not lane_views)
        after = side_effects(app)
        answers.append(answer(response) + (after[0] - before[0], after[1] - before[1]))
    return answers


def test_every_answer_of_the_lane_is_the_one_flask_gives(lane_app, monkeypatch):
    for name, path, headers, address in cases(lane_app):
        through_lane, through_flask_alone = both_ways(lane_app, monkeypatch, lambda: lane_app.test_client().get(
            path, headers=headers, environ_base={"REMOTE_ADDR": address}))
        assert through_lane == through_flask_alone, name
        assert through_lane[3], name  # the metrics counted it
        status = {"served": "200 OK", "public": "200 OK", "over the limit": "429 TOO MANY REQUESTS",
                  "public, over the limit": "429 TOO MANY REQUESTS", "tier not configured": "500 INTERNAL SERVER ERROR"}
        assert through_lane[0] == status.get(name, through_lane[0]), name


def test_the_storage_s_and_the_database_s_errors_are_flask_s(lane_app, monkeypatch):
    _, secret = issue(lane_app)

    def send(path):
        return lambda: lane_app.test_client().get(path, headers={"X-API-Key": secret})

    def storage_down(*args):
        raise StorageError(ConnectionError("storage down"))

    def database_down(*args, **kwargs):
        raise OperationalError("database down")

    monkeypatch.setattr(lane_app.extensions["ratelimit"], "count_hit", storage_down)
    through_lane, through_flask_alone = both_ways(lane_app, monkeypatch, send("/api/v1/protected/test"))
    assert through_lane == through_flask_alone and through_lane[0] == "503 SERVICE UNAVAILABLE"
    # Public views stay up without the limit storage.
    through_lane, through_flask_alone = both_ways(lane_app, monkeypatch, send("/api/v1/demo/year"))
    assert through_lane == through_flask_alone and through_lane[0] == "200 OK"
    monkeypatch.undo()
    monkeypatch.setattr(models.ApiKey, "select", database_down)
    through_lane, through_flask_alone = both_ways(lane_app, monkeypatch, send("/api/v1/user/me"))
    assert through_lane == through_flask_alone and through_lane[0] == "503 SERVICE UNAVAILABLE"
    monkeypatch.undo()
    _, secret = issue(lane_app, "Alice history")  # three requests a minute each
    monkeypatch.setattr(models.UsageHour, "select", database_down)
    through_lane, through_flask_alone = both_ways(lane_app, monkeypatch, send("/api/v1/usage/history"))
    assert through_lane == through_flask_alone and through_lane[0] == "503 SERVICE UNAVAILABLE"


def test_behind_trusted_proxies_the_lane_sees_the_forwarded_address(make_app, tmp_path, monkeypatch):
    app = make_app({"DATABASE_URL": f"sqlite:///{tmp_path}/lane.db", "RATE_LIMIT_TIERS": TEST_TIERS,
                    "RATELIMIT_STORAGE_URL": "memory://", "TRUSTED_PROXIES": 1, "TESTING": True})
    _, office = issue(app, "Office", allow_ips=ALLOWED)
    for forwarded, status in ((ALLOWED, "200 OK"), (OTHER, "403 FORBIDDEN")):
        through_lane, through_flask_alone = both_ways(app, monkeypatch, lambda: app.test_client().get(
            "/api/v1/user/me", headers={"X-API-Key": office, "X-Forwarded-For": forwarded},
            environ_base={"REMOTE_ADDR": "10.0.0.1"}))
        assert through_lane == through_flask_alone and through_lane[0] == status


@pytest.mark.parametrize("scheme", ["ws", "wss"])
def test_behind_trusted_proxies_a_forwarded_websocket_scheme_gets_flask_s_426_uncounted(
        make_app, tmp_path, monkeypatch, scheme):
    """Attacker's review: the lane answered 200 and counted the request where Flask, routing a ws or
    wss scheme to WebSocket rules only, answers 426 and counts nothing."""
    app = make_app({"DATABASE_URL": f"sqlite:///{tmp_path}/lane.db", "RATE_LIMIT_TIERS": TEST_TIERS,
                    "RATELIMIT_STORAGE_URL": "memory://", "TRUSTED_PROXIES": 1, "TESTING": True})
    _, secret = issue(app)
    through_lane, through_flask_alone = both_ways(app, monkeypatch, lambda: app.test_client().get(
        "/api/v1/protected/test", headers={"X-API-Key": secret, "X-Forwarded-Proto": scheme}),
        lane_declines=True)
    assert through_lane == through_flask_alone and through_lane[0] == "426 UPGRADE REQUIRED"
    assert not through_lane[4]  # no usage counted
    # The schemes the lane declines are those Werkzeug routes to WebSocket rules only.
    assert all(app.url_map.bind("localhost", url_scheme=other).websocket == (other in fastlane.WEBSOCKET_SCHEMES)
               for other in ("http", "https", "ws", "wss", "WS"))


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


def test_a_hook_the_lane_does_not_know_turns_it_off(lane_app, monkeypatch):
    ran = []
    lane_app.before_request(lambda: ran.append(True))
    _, secret = issue(lane_app)
    response, dispatched = through_flask(lane_app, lambda: lane_app.test_client().get(
        "/api/v1/protected/test", headers={"X-API-Key": secret}), monkeypatch)
    assert response.status_code == 200 and dispatched and ran
    assert lane_of(lane_app).views == {}


def test_once_the_lane_has_served_flask_refuses_new_hooks(lane_app, monkeypatch):
    """The lane sets Flask's own first-request flag: this fails if Flask moves it."""
    _, secret = issue(lane_app)
    lane, handed = find_lane(lane_app), []
    flask_app = lane.wsgi_app
    monkeypatch.setattr(lane, "wsgi_app", lambda environ, start_response: handed.append(environ))
    # The app's first request, and the lane serves it: Flask never sees a request.
    response = lane_app.test_client().get("/api/v1/protected/test", headers={"X-API-Key": secret})
    assert response.status_code == 200 and not handed
    monkeypatch.setattr(lane, "wsgi_app", flask_app)
    with pytest.raises(AssertionError, match="can no longer be called"):
        lane_app.before_request(lambda: None)


@pytest.mark.parametrize("guard", [auth.require_api_key("test:read"), api.ip_rate_limited],
                         ids=["key", "client-ip"])
def test_without_flask_goes_right_above_a_guard(guard):
    with pytest.raises(TypeError, match="right above require_api_key or ip_rate_limited"):
        fastlane.without_flask(lambda: {})
    guarded = guard(lambda **kwargs: {})
    # A decorator between them copies the guard's attributes, its mark included.
    with pytest.raises(TypeError, match="right above require_api_key or ip_rate_limited"):
        fastlane.without_flask(functools.wraps(guarded)(lambda: guarded()))
    try:
        assert fastlane.without_flask(guarded) is guarded
    finally:
        fastlane.declared.discard(guarded)
