"""Health, readiness, metrics, request ids and log formats with Flask's test client (the live
server with two workers is tests/live/test_operations.py)."""

import bisect
import contextvars
import json
import logging
import re
import subprocess
import sys
import time

import gevent
import pytest
from liveserver import ROOT, service_env
from peewee import OperationalError
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.parser import text_string_to_metric_families

import models
from app import load_config
from keys import keyformat
from ops import health, logs, metrics

NEW_ID = re.compile(r"[0-9a-f]{32}")


def samples(client, **kwargs):
    """Return {(name, frozenset(labels.items())): value} from GET /metrics."""
    response = client.get("/metrics", **kwargs)
    assert response.status_code == 200
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(response.get_data(as_text=True))
            for sample in family.samples}


def value(found, name, **labels):
    return found.get((name, frozenset(labels.items())), 0.0)


def test_healthz_touches_neither_database_nor_limit_storage(client, app, monkeypatch):
    def broken(*args, **kwargs):
        raise OperationalError("the database is gone")

    monkeypatch.setattr(models.db.obj, "execute_sql", broken)
    monkeypatch.setattr(app.extensions["ratelimit"].storage, "incr", broken)
    monkeypatch.setattr(app.extensions["ratelimit"], "count_hit", broken)
    for _ in range(10):  # PUBLIC_RATE_LIMIT is 5/minute here
        response = client.get("/healthz")
        assert response.status_code == 200
        assert response.get_json() == {"status": "ok"}
        assert response.headers["Cache-Control"] == "no-store"


def test_readyz_is_ready_and_not_rate_limited(client):
    for _ in range(10):
        response = client.get("/readyz")
        assert response.status_code == 200
        assert response.get_json() == {"status": "ready", "checks": {"database": "ok", "limit_storage": "ok"}}
        assert response.headers["Cache-Control"] == "no-store"


def test_readyz_names_a_database_that_fails_without_its_error(client, monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise OperationalError('connection to server at "10.1.2.3", port 5432 failed')

    monkeypatch.setattr(models.db.obj, "execute_sql", broken)
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.get_json() == {"status": "unavailable", "checks": {
        "database": "The database cannot be reached.", "limit_storage": "ok"}}
    assert "10.1.2.3" not in response.get_data(as_text=True)
    assert "10.1.2.3" in caplog.text


def test_readyz_names_a_limit_storage_that_fails(client, app, monkeypatch):
    monkeypatch.setattr(app.extensions["ratelimit"].storage, "check", lambda: False)
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.get_json()["checks"] == {"database": "ok",
                                             "limit_storage": "The rate-limit storage does not answer."}


def test_readyz_gives_up_on_checks_that_hang(client, app, monkeypatch):
    monkeypatch.setattr(health, "CHECK_SECONDS", 1.5)
    monkeypatch.setattr(app.extensions["ratelimit"].storage, "check", lambda: gevent.sleep(30))
    monkeypatch.setattr(health, "check_database", lambda: gevent.sleep(30))
    started = time.monotonic()
    response = client.get("/readyz")
    # Both checks run at once: the answer comes after one deadline, not two (the second deadline's
    # length is the margin a loaded machine gets).
    assert time.monotonic() - started < 2 * 1.5
    assert response.status_code == 503
    assert response.get_json()["checks"] == {
        "database": "The database did not answer within 1.5 seconds.",
        "limit_storage": "The rate-limit storage did not answer within 1.5 seconds."}


def test_metrics_count_by_route_never_by_path_or_key(client, api_key):
    before = samples(client)
    client.get("/api/v1/no-such/thing-3f9a")
    secret = api_key
    client.get("/api/v1/protected/test", headers={"X-API-Key": secret})
    for _ in range(6):  # one over PUBLIC_RATE_LIMIT
        client.get("/api/v1/demo/year")
    response = client.get("/metrics")
    text = response.get_data(as_text=True)
    after = samples(client)
    assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert "thing-3f9a" not in text and secret not in text and secret[:12] not in text
    assert value(after, "http_requests_total", endpoint="unmatched", method="GET", status="404") == \
        value(before, "http_requests_total", endpoint="unmatched", method="GET", status="404") + 1
    assert value(after, "http_requests_total", endpoint="/api/v1/protected/test", method="GET", status="200") == \
        value(before, "http_requests_total", endpoint="/api/v1/protected/test", method="GET", status="200") + 1
    assert value(after, "rate_limited_total", policy="public") == \
        value(before, "rate_limited_total", policy="public") + 1
    assert value(after, "http_request_duration_seconds_count", endpoint="/api/v1/demo/year") == \
        value(before, "http_request_duration_seconds_count", endpoint="/api/v1/demo/year") + 6


def test_many_observations_added_at_once_read_as_if_observed_one_by_one():
    # metrics.add_observations writes prometheus_client's own histogram values: this fails if a new
    # version of the library moves them.
    registry = CollectorRegistry()
    one_by_one = Histogram("one_by_one", "", registry=registry)
    at_once = Histogram("at_once", "", registry=registry)
    durations = [0.0001, 0.004, 0.005, 0.0051, 0.3, 0.3, 2.4, 11.0, 1e6]
    for seconds in durations:
        one_by_one.observe(seconds)
    per_bucket = [0] * len(metrics.BUCKET_BOUNDS)
    for seconds in durations:
        per_bucket[bisect.bisect_left(metrics.BUCKET_BOUNDS, seconds)] += 1
    metrics.add_observations(at_once, sum(durations), per_bucket)

    def read(name):
        return {(sample.name.removeprefix(name), tuple(sample.labels.items())): sample.value
                for family in registry.collect() if family.name == name for sample in family.samples
                if not sample.name.endswith("_created")}

    assert read("at_once") == read("one_by_one")
    assert read("at_once")[("_bucket", (("le", "0.005"),))] == 3


def test_a_tally_folds_each_count_once():
    tally = metrics.Tally()
    labels = ("/tally-test", "GET", 200)
    counter, histogram = metrics.series_for(labels)
    before = counter._value.get(), histogram._sum.get()
    tally.count(labels, 0.25)
    tally.fold()
    tally.count(labels, 0.5)
    tally.count(labels, None)
    tally.fold()
    tally.fold()
    assert (counter._value.get(), histogram._sum.get()) == (before[0] + 3, before[1] + 0.75)


def test_the_scrape_shows_every_request_answered_before_it(client):
    for _ in range(3):
        client.get("/healthz")
    first = value(samples(client), "http_requests_total", endpoint="/healthz", method="GET", status="200")
    client.get("/healthz")
    assert value(samples(client), "http_requests_total", endpoint="/healthz", method="GET", status="200") == first + 1


def test_unusual_methods_share_one_label(client):
    for method in ("BREW", "X" * 1000):
        client.open("/api/v1/demo/year", method=method)
    assert value(samples(client), "http_requests_total", endpoint="unmatched", method="OTHER",
                 status="405") >= 1


def test_usage_flush_is_timed_and_what_waits_is_shown(client, app, api_key):
    before = samples(client)
    client.get("/api/v1/protected/test", headers={"X-API-Key": api_key})
    app.extensions["usage"].flush()
    after = samples(client)
    assert value(after, "usage_flush_duration_seconds_count") == value(before, "usage_flush_duration_seconds_count") + 1
    assert value(after, "usage_counts_pending") == 0


def test_a_failed_flush_shows_its_counts_as_pending(client, app, api_key, monkeypatch):
    client.get("/api/v1/protected/test", headers={"X-API-Key": api_key})
    client.get("/api/v1/protected/test", headers={"X-API-Key": api_key})

    def broken(*args, **kwargs):
        raise OperationalError("disk I/O error")

    with monkeypatch.context() as patch:
        patch.setattr(app.extensions["usage"].database, "atomic", broken)
        with pytest.raises(OperationalError):
            app.extensions["usage"].flush()
    assert value(samples(client), "usage_counts_pending") == 2


def test_gunicorns_master_reads_its_configuration_without_loading_the_metrics(tmp_path):
    """ops.metrics picks prometheus_client's mode by PROMETHEUS_MULTIPROC_DIR when it is imported:
    loaded with gunicorn.conf.py, before the master sets the folder, every worker would count in
    its own memory and /metrics would show only the worker that answers it."""
    program = ("import runpy, sys; runpy.run_path('gunicorn.conf.py'); "
               "print(sorted(name for name in sys.modules if name.startswith(('ops.metrics', 'prometheus_client'))))")
    result = subprocess.run([sys.executable, "-c", program], cwd=ROOT, env=service_env(tmp_path),
                            capture_output=True, text=True, timeout=60)
    assert result.stdout.split() == ["[]"], result.stderr


@pytest.mark.parametrize("remote, authorization, token, status", [
    ("127.0.0.1", None, "", 200),
    ("::1", None, "", 200),
    ("203.0.113.9", None, "", 404),
    ("203.0.113.9", "Bearer ", "", 404),
    ("203.0.113.9", None, "a-metrics-token-0123", 404),
    ("203.0.113.9", "Bearer wrong-token-0123456789", "a-metrics-token-0123", 404),
    ("203.0.113.9", "a-metrics-token-0123", "a-metrics-token-0123", 404),
    ("203.0.113.9", "Bearer a-metrics-token-0123", "a-metrics-token-0123", 200),
    ("203.0.113.9", "bearer a-metrics-token-0123", "a-metrics-token-0123", 200),
])
def test_metrics_are_for_loopback_or_the_token(app, client, remote, authorization, token, status):
    app.config["METRICS_TOKEN"] = token
    headers = {"Authorization": authorization} if authorization is not None else {}
    response = client.get("/metrics", headers=headers, environ_base={"REMOTE_ADDR": remote})
    assert response.status_code == status
    if status == 404:
        assert response.get_json()["error"]["code"] == "not_found"


def test_a_forwarded_loopback_address_needs_a_loopback_peer(database_url, make_app):
    app = make_app({"DATABASE_URL": database_url, "TRUSTED_PROXIES": 1, "TESTING": True})
    client = app.test_client()
    forged = client.get("/metrics", headers={"X-Forwarded-For": "127.0.0.1"},
                        environ_base={"REMOTE_ADDR": "203.0.113.9"})
    assert forged.status_code == 404
    # A proxy on this host, passing on a local scraper's request.
    assert client.get("/metrics", headers={"X-Forwarded-For": "127.0.0.1"}).status_code == 200
    assert client.get("/metrics", headers={"X-Forwarded-For": "203.0.113.9"}).status_code == 404


def test_an_ipv4_mapped_loopback_address_is_loopback():
    assert metrics.is_loopback("::ffff:127.0.0.1") and metrics.is_loopback("127.0.0.2")
    assert not metrics.is_loopback("::ffff:203.0.113.9") and not metrics.is_loopback("") \
        and not metrics.is_loopback(None)


def test_a_malformed_accept_header_gets_the_text_format(client):
    response = client.get("/metrics", headers={"Accept": "application/openmetrics-text; version=abc"})
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    openmetrics = client.get("/metrics", headers={"Accept": "application/openmetrics-text"})
    assert openmetrics.headers["Content-Type"].startswith("application/openmetrics-text")
    assert openmetrics.get_data(as_text=True).endswith("# EOF\n")


def test_readiness_is_checked_at_most_once_a_second(client, app, monkeypatch):
    calls = []
    monkeypatch.setattr(health, "check_database", lambda: calls.append(1))
    for _ in range(5):
        assert client.get("/readyz").status_code == 200
    assert len(calls) == 1
    app.extensions["readiness"].answered_at -= health.Readiness.REUSE_SECONDS
    client.get("/readyz")
    assert len(calls) == 2


@pytest.mark.parametrize("token", ["short", "a token with spaces in it", "tab\tseparated-0123456789"])
def test_a_weak_metrics_token_is_refused_at_start(token):
    with pytest.raises(ValueError, match="METRICS_TOKEN must be at least 16 visible ASCII characters"):
        load_config({"METRICS_TOKEN": token})


def test_log_format_is_text_or_json():
    assert load_config({})["LOG_FORMAT"] == "text"
    assert load_config({"LOG_FORMAT": "JSON"})["LOG_FORMAT"] == "json"
    with pytest.raises(ValueError, match="LOG_FORMAT must be text or json, not 'xml'"):
        load_config({"LOG_FORMAT": "xml"})


@pytest.mark.parametrize("header", ["abc-123", "A.b_c-9", ("ab-" * 22)[:64], "0123456789abcdef" * 2,
                                    "3f1c8a2e-5b4d-4c7a-9e21-0d6b8f4a2c10", "deadbeef" * 8])
def test_a_sane_request_id_is_kept(client, header):
    assert client.get("/healthz", headers={"X-Request-ID": header}).headers["X-Request-ID"] == header


@pytest.mark.parametrize("header", ["", "x" * 65, "has space", "slash/inside", "ünïcode", "a,b",
                                    "sk_live_" + "A" * 10, "Q" * 40])
def test_any_other_request_id_is_replaced(client, header):
    assert NEW_ID.fullmatch(client.get("/healthz", headers={"X-Request-ID": header}).headers["X-Request-ID"])


def test_a_key_sent_as_the_request_id_is_not_kept(client):
    secret = keyformat.generate_secret("production")
    body = secret.removeprefix("sk_live_")
    for header in (secret, body):
        assert client.get("/healthz", headers={"X-Request-ID": header}).headers["X-Request-ID"] != header


def test_every_response_gets_a_request_id(client):
    for path in ("/", "/api/v1/demo/year", "/no-such-page", "/api/v1/ws/echo", "/static/style.css", "/metrics"):
        response = client.get(path)
        assert NEW_ID.fullmatch(response.headers["X-Request-ID"]), path


def test_hex_runs_stay_readable_in_the_logs_but_key_bodies_do_not():
    secret = keyformat.generate_secret("production")
    trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    line = logs.redact(f"trace {trace} key {secret.removeprefix('sk_live_')} other {secret}")
    assert trace in line
    assert secret.removeprefix("sk_live_") not in line and line.count("[redacted]") == 2


def test_a_reset_links_token_is_redacted_from_a_requests_path_but_not_from_a_mail_written_to_the_log():
    token = "Ab3-" + "x" * 20 + "_" + "y" * 18
    for line in (f'10.0.0.1 "GET /password/reset/{token} HTTP/1.1" 200 512 3ms -', f"/password/reset/{token}",
                 f"POST /password/reset/{token} 410", f"Unhandled error on POST /password/reset/{token}"):
        assert token not in logs.redact(line) and "/password/reset/[redacted]" in logs.redact(line)
    # MAIL_URL=console writes each mail to the log, its link whole (the contract's console).
    mailed = f"Mail to bob@example.com | http://127.0.0.1:8000/password/reset/{token}"
    assert logs.redact(mailed) == mailed


class Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records = []

    def emit(self, record):
        self.records.append(record)


def test_a_requests_log_lines_carry_its_id(client, monkeypatch):
    def broken(*args, **kwargs):
        raise OperationalError("the database is gone")

    handler = Records()
    handler.addFilter(logs.AddRequestId())
    logging.getLogger("ops.health").addHandler(handler)
    monkeypatch.setattr(models.db.obj, "execute_sql", broken)
    try:
        client.get("/readyz", headers={"X-Request-ID": "ready-check-1"})
        logging.getLogger("ops.health").warning("outside any request")
    finally:
        logging.getLogger("ops.health").removeHandler(handler)
    # The check ran in a greenlet of its own, and still logged with the request's id.
    assert [getattr(record, "request_id", None) for record in handler.records] == ["ready-check-1", None]


def test_a_request_leaves_its_context_as_it_found_it(client, api_key):
    # Its id lives in its note, which the one context variable the envelope sets and resets leads
    # to: each write to a context costs a keyed request ~500 instructions, more as it fills.
    before = dict(contextvars.copy_context())
    for path, headers in (("/api/v1/protected/test", {"X-API-Key": api_key}), ("/readyz", {})):
        response = client.get(path, headers={**headers, "X-Request-ID": "left-behind-1"})
        assert response.headers["X-Request-ID"] == "left-behind-1"
        assert dict(contextvars.copy_context()) == before
        assert logs.request_id_now() is None


def test_json_lines_carry_time_level_message_and_extras():
    formatter = logs.JsonLines()
    record = logging.LogRecord("app", logging.WARNING, __file__, 1, "hello %s", ("world",), None)
    record.request_id = "abc-123"
    line = json.loads(formatter.format(record))
    assert line["level"] == "WARNING" and line["message"] == "hello world" and line["request_id"] == "abc-123"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", line["time"])
    assert line["logger"] == "app" and isinstance(line["pid"], int)


def test_text_lines_show_the_request_id_or_a_dash():
    formatter = logs.text_formatter()
    record = logging.LogRecord("app", logging.INFO, __file__, 1, "hello", (), None)
    assert formatter.format(record).endswith("app [-] hello")
    record.request_id = "abc-123"
    assert formatter.format(record).endswith("app [abc-123] hello")


def test_metrics_names_of_the_contract_exist():
    names = {metric.describe()[0].name for metric in (
        metrics.REQUESTS, metrics.REQUEST_DURATION, metrics.RATE_LIMITED, metrics.SOCKETS,
        metrics.SOCKET_MESSAGES, metrics.USAGE_PENDING, metrics.USAGE_FLUSH)}
    assert names == {"http_requests", "http_request_duration_seconds", "rate_limited", "websocket_connections",
                     "websocket_messages_sent", "usage_counts_pending", "usage_flush_duration_seconds"}
