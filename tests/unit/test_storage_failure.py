"""RATE_LIMIT_ON_STORAGE_FAILURE in the app: `closed` refuses a keyed request the limit storage
cannot count with 503 and Retry-After; `open` admits it without its windows, still spending its
credit, counting it in ratelimit_storage_failopen_total and warning once a minute with how many."""

import logging

import pytest
from appconfig import APP_SETTINGS
from limits.errors import StorageError
from prometheus_client import REGISTRY

import settings
from models import ApiKey
from ops import outage
from ops.outage import StorageOutage
from orgs import keyactions

ENDPOINT = "/api/v1/protected/test"
FAILOPEN_TOTAL = "ratelimit_storage_failopen_total"


def cut_storage(app, monkeypatch):
    """Every call of the app's limit storage fails as a Redis out of reach does; return the list
    of the calls made."""
    limiter = app.extensions["ratelimit"]
    calls = []

    def fail(*args, **kwargs):
        calls.append(args)
        raise StorageError(ConnectionError("redis is down"))

    for name in ("count_hit", "admit_all"):
        monkeypatch.setattr(limiter, name, fail)
    for name in ("get", "incr", "get_expiry"):
        monkeypatch.setattr(limiter.storage, name, fail)
    return calls


@pytest.fixture
def open_app(app, make_app):
    """An app on the same database whose limiter fails open."""
    opened = make_app({**APP_SETTINGS, "DATABASE_URL": app.config["DATABASE_URL"],
                       "RATE_LIMIT_ON_STORAGE_FAILURE": "open"})
    with opened.app_context():
        yield opened


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def failopen_total():
    return REGISTRY.get_sample_value(FAILOPEN_TOTAL) or 0.0


def test_the_setting_is_closed_or_open():
    assert settings.load({})["RATE_LIMIT_ON_STORAGE_FAILURE"] == "closed"
    assert settings.load({"RATE_LIMIT_ON_STORAGE_FAILURE": " Open "})["RATE_LIMIT_ON_STORAGE_FAILURE"] == "open"


def test_closed_refuses_with_503_and_retry_after(app, client, api_key, monkeypatch, caplog):
    cut_storage(app, monkeypatch)
    response = client.get(ENDPOINT, headers={"X-API-Key": api_key})
    assert (response.status_code, response.get_json()["error"]["code"]) == (503, "service_unavailable")
    assert response.headers["Retry-After"] == "5"
    assert "Rate-limit storage unavailable: redis is down" in caplog.text


def test_open_admits_uncounted_and_counts_it_in_the_metric(open_app, user, api_key, monkeypatch, caplog):
    cut_storage(open_app, monkeypatch)
    before = failopen_total()
    with caplog.at_level(logging.WARNING, logger="ratelimit"):
        responses = [open_app.test_client().get(ENDPOINT, headers={"X-API-Key": api_key}) for _ in range(5)]
    # tier free is 3/minute in the tests: uncounted, all five pass.
    assert [response.status_code for response in responses] == [200] * 5
    assert "X-RateLimit-Remaining" not in responses[0].headers
    assert failopen_total() - before == 5
    assert [record.levelname for record in caplog.records] == ["WARNING"]
    # The request is served and goes into the key's usage as one.
    assert sum(count for (_, _, status, served, _), count in open_app.extensions["usage"].pending.items()
               if status == 200 and served) == 5


def test_open_still_spends_credits_and_refuses_a_key_without_any(open_app, user, monkeypatch):
    key, secret = keyactions.issue_key(user, "metered", "production", credits_given=2)
    cut_storage(open_app, monkeypatch)
    client = open_app.test_client()
    statuses = [client.get(ENDPOINT, headers={"X-API-Key": secret}).status_code for _ in range(3)]
    assert statuses == [200, 200, 429]
    assert ApiKey.get_by_id(key.id).credits_remaining == 0


def test_open_cannot_report_the_window_in_usage_stats(open_app, api_key, monkeypatch):
    cut_storage(open_app, monkeypatch)
    response = open_app.test_client().get("/api/v1/usage/stats", headers={"X-API-Key": api_key})
    assert (response.status_code, response.headers["Retry-After"]) == (503, "5")


def test_the_warning_comes_at_once_then_once_a_minute_with_how_many(caplog):
    clock = Clock()
    outage = StorageOutage(clock)
    with caplog.at_level(logging.WARNING, logger="ratelimit"):
        outage.failed("redis is down")
        outage.admitted()
        for _ in range(41):
            clock.now += 1
            outage.admitted()
        clock.now += 20
        outage.admitted()
    assert [record.getMessage() for record in caplog.records] == [
        f"Rate-limit storage unavailable (redis is down): admitted {count} keyed requests without counting them "
        "since the last warning (RATE_LIMIT_ON_STORAGE_FAILURE=open)." for count in (1, 42)]


def test_for_a_second_after_a_failure_open_admits_without_asking_the_storage(open_app, api_key, monkeypatch):
    """A hung Redis costs each ask its timeout: one request pays it, not every one behind it."""
    clock = Clock()
    monkeypatch.setattr(open_app.extensions["ratelimit"], "outage", StorageOutage(clock))
    calls = cut_storage(open_app, monkeypatch)
    client = open_app.test_client()
    assert [client.get(ENDPOINT, headers={"X-API-Key": api_key}).status_code for _ in range(3)] == [200] * 3
    assert len(calls) == 1
    clock.now += 1
    assert client.get(ENDPOINT, headers={"X-API-Key": api_key}).status_code == 200
    assert len(calls) == 2


def test_an_outage_logs_its_first_failure_at_once_then_a_line_an_interval_with_the_count(app, client, api_key,
                                                                                         monkeypatch, caplog):
    """A flood of requests refused alike during an outage does not flood the log."""
    cut_storage(app, monkeypatch)
    now = [0.0]
    app.extensions["ratelimit"].failure_log = outage.FailureLog(clock=lambda: now[0])

    def lines():
        return [record.getMessage() for record in caplog.records
                if record.levelno == logging.ERROR and "Rate-limit storage unavailable" in record.getMessage()]

    for _ in range(5):
        assert client.get(ENDPOINT, headers={"X-API-Key": api_key}).status_code == 503
    assert lines() == ["Rate-limit storage unavailable: redis is down"]
    now[0] = outage.FailureLog.INTERVAL
    assert client.get(ENDPOINT, headers={"X-API-Key": api_key}).status_code == 503
    assert lines()[1:] == ["Rate-limit storage unavailable: redis is down (4 more failures since the last line)"]


def test_public_requests_pass_and_skip_a_failed_storage_for_a_second(app, client, monkeypatch):
    """Each would otherwise wait for a hung Redis's timeout, to be admitted uncounted all the same."""
    calls = cut_storage(app, monkeypatch)
    clock = Clock()
    app.extensions["ratelimit"].public_outage = StorageOutage(clock=clock)
    for _ in range(3):
        assert client.get("/api/v1/demo/year").status_code == 200
    assert len(calls) == 1
    clock.now += 1.0
    assert client.get("/api/v1/demo/year").status_code == 200
    assert len(calls) == 2


def test_after_the_interval_one_request_asks_again_for_all_and_an_answer_ends_the_outage():
    clock = Clock()
    outage = StorageOutage(clock)
    assert not outage.recent()
    outage.failed("redis is down")
    assert outage.recent()
    clock.now += 1
    # The first after the interval asks; those meanwhile do not, until it has its answer.
    assert [outage.recent() for _ in range(3)] == [False, True, True]
    clock.now += 1
    assert not outage.recent()  # an asker that never said: another one a second later
    outage.answered()
    assert [outage.recent() for _ in range(3)] == [False] * 3


def test_public_requests_count_again_once_the_storage_answers(app, client, monkeypatch):
    clock = Clock()
    limiter = app.extensions["ratelimit"]
    limiter.public_outage = StorageOutage(clock=clock)
    limiter.public_outage.failed("redis is down")
    clock.now += 1
    assert client.get("/api/v1/demo/year").headers["X-RateLimit-Remaining"] == "4"
    assert [client.get("/api/v1/demo/year").headers["X-RateLimit-Remaining"] for _ in range(2)] == ["3", "2"]


def test_a_failure_after_a_quiet_spell_is_logged_at_once_as_a_new_outage(caplog):
    now = [0.0]
    failures = outage.FailureLog(clock=lambda: now[0])
    with caplog.at_level(logging.ERROR, logger="ratelimit"):
        failures.failed("redis is down")
        now[0] += 1
        failures.failed("redis is down")
        now[0] += outage.FailureLog.QUIET
        failures.failed("redis is gone")
    assert [record.getMessage() for record in caplog.records] == [
        "Rate-limit storage unavailable: redis is down",
        "Rate-limit storage unavailable: redis is gone (1 more failures since the last line)"]
