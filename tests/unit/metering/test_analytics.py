"""Usage analytics in the app (SQLite and PostgreSQL): what is recorded per key, hour, endpoint and
status, GET /api/v1/usage/history, `usage report`, and the upgrade that keeps the old counts."""

import csv
import datetime
import io
import json

import pytest

from app import load_config
from keys import keyformat
from metering import analytics
from models import ApiKey, UsageDay, UsageHour, start_of_hour, utcnow
from orgs import keyactions

PROTECTED = "/api/v1/protected/test"
ME = "/api/v1/user/me"
HISTORY = "/api/v1/usage/history"


def get(client, path, secret):
    return client.get(path, headers={"X-API-Key": secret})


def key_of(secret):
    return ApiKey.get(ApiKey.key_hash == keyformat.hash_key(secret))


@pytest.fixture
def outcomes(app, client, user, api_key, pro_key):
    """Requests of three outcomes on three endpoints, flushed: the free key (3/minute) gets two 200s
    on protected/test, one on user/me, then a 429; a key without user:read gets a 403 and a 200."""
    _, narrow = keyactions.issue_key(user, "narrow", "production", "pro", scopes=["test:read", "usage:read"])
    statuses = [get(client, path, secret).status_code for path, secret in [
        (PROTECTED, api_key), (PROTECTED, api_key), (ME, api_key), (PROTECTED, api_key),
        (ME, narrow), (PROTECTED, narrow)]]
    assert statuses == [200, 200, 200, 429, 403, 200]
    app.extensions["usage"].flush()
    return key_of(api_key), key_of(narrow), narrow


def test_every_outcome_of_an_active_key_is_recorded_but_only_admitted_ones_counted(app, outcomes):
    free, narrow, _ = outcomes
    rows = {(row.api_key_id, row.endpoint, row.status): row.requests for row in UsageHour.select()}
    assert rows == {(free.id, PROTECTED, 200): 2, (free.id, ME, 200): 1, (free.id, PROTECTED, 429): 1,
                    (narrow.id, ME, 403): 1, (narrow.id, PROTECTED, 200): 1}
    days = {(row.api_key_id, row.endpoint, row.status, row.day): row.requests for row in UsageDay.select()}
    today = utcnow().date()
    assert days == {(kid, endpoint, status, today): n for (kid, endpoint, status), n in rows.items()}
    # total_requests keeps its meaning: the requests that passed authentication, scope and limit.
    assert [ApiKey.get_by_id(key.id).total_requests for key in (free, narrow)] == [3, 1]


def test_unknown_and_malformed_keys_record_nothing(app, client, api_key):
    get(client, PROTECTED, api_key + "x")
    get(client, PROTECTED, "sk_live_" + "a" * 40)
    assert app.extensions["usage"].pending == {}


def test_history_has_every_hour_and_day_with_status_and_endpoint(app, client, outcomes):
    _, narrow, secret = outcomes
    response = get(client, HISTORY, secret)
    assert response.status_code == 200
    body = response.get_json()
    assert list(body) == ["api_key_name", "generated_at", "hourly", "daily"]
    assert body["api_key_name"] == "narrow"
    hourly, daily = body["hourly"], body["daily"]
    assert len(hourly) == 24 and len(daily) == 30
    now = utcnow()
    assert hourly[-1]["hour"] == start_of_hour(now).strftime("%Y-%m-%dT%H:00:00Z")
    assert hourly[0]["hour"] == (start_of_hour(now) - datetime.timedelta(hours=23)).strftime("%Y-%m-%dT%H:00:00Z")
    assert daily[-1]["day"] == now.date().isoformat()
    assert daily[0]["day"] == (now.date() - datetime.timedelta(days=29)).isoformat()
    expected = {"requests": 2, "by_status": {"200": 1, "403": 1}, "by_endpoint": {PROTECTED: 1, ME: 1}}
    assert {name: hourly[-1][name] for name in expected} == expected
    assert {name: daily[-1][name] for name in expected} == expected
    # Hours and days without traffic are zeros, not missing.
    assert hourly[0] | {"hour": None} == {"hour": None, "requests": 0, "by_status": {}, "by_endpoint": {}}
    assert all(day["requests"] == 0 for day in daily[:-1])


def test_history_counts_itself_after_the_flush_and_needs_its_scope(app, client, user, pro_key):
    _, unscoped = keyactions.issue_key(user, "no usage", "production", "pro", scopes=["test:read"])
    refused = get(client, HISTORY, unscoped)
    assert refused.status_code == 403
    assert refused.get_json()["error"] == {"code": "insufficient_scope", "message": (
        "This API key lacks the scope 'usage:read', which GET /api/v1/usage/history needs.")}
    assert get(client, HISTORY, pro_key).get_json()["hourly"][-1]["requests"] == 0
    app.extensions["usage"].flush()
    assert get(client, HISTORY, pro_key).get_json()["hourly"][-1]["by_endpoint"] == {HISTORY: 1}
    assert get(client, HISTORY, "sk_live_" + "b" * 40).status_code == 401


def test_history_s_own_json_is_the_answer_it_carries_as_the_app_would_write_it(app, client, user):
    key, secret = keyactions.issue_key(user, "Café \u2615 \"quoted\"", "production", "pro")
    get(client, PROTECTED, secret)
    app.extensions["usage"].flush()
    answer = analytics.history(key)
    assert answer.json == app.json.encoder.encode(dict(answer))
    assert answer["hourly"][-1]["by_endpoint"] == {PROTECTED: 1}
    response = get(client, HISTORY, secret)
    assert response.data == (answer.json.replace(answer["generated_at"], response.get_json()["generated_at"])
                             + "\n").encode()


def test_history_reads_older_days_from_the_daily_rows(app, client, pro_key):
    key = key_of(pro_key)
    today = utcnow().date()
    UsageDay.create(api_key=key, day=today - datetime.timedelta(days=29), endpoint=ME, status=429, requests=4)
    UsageDay.create(api_key=key, day=today - datetime.timedelta(days=30), endpoint=ME, status=200, requests=9)
    daily = get(client, HISTORY, pro_key).get_json()["daily"]
    assert daily[0]["requests"] == 4 and daily[0]["by_status"] == {"429": 4}
    assert sum(day["requests"] for day in daily) == 4


def test_the_30_day_read_is_bounded_by_the_index(app, pro_key):
    """One key's 30 days read the daily rows through the (api_key, day, ...) index, not the table."""
    key = key_of(pro_key)
    query = UsageDay.select().where((UsageDay.api_key == key.id) & (UsageDay.day >= utcnow().date()))
    sql, params = query.sql()
    plan = " ".join(str(row) for row in app.extensions["usage"].database.execute_sql(
        ("EXPLAIN QUERY PLAN " if "sqlite" in app.config["DATABASE_URL"] else "EXPLAIN ") + sql, params))
    assert "usageday_api_key_id_day_endpoint_status" in plan or "usageday_api_key_id" in plan


def test_usage_report_prints_each_day_by_outcome(app, runner, outcomes, user):
    free, narrow, _ = outcomes
    today = utcnow().date().isoformat()
    table = runner.invoke(args=["usage", "report", "alice", "--days", "2"])
    assert table.exit_code == 0, table.output
    lines = table.output.splitlines()
    assert lines[0].split() == ["day", "requests", "credits", "spent", "Success", "Refused", "for", "scope", "Rate",
                                "limited", "Other"]
    assert lines[-1].split() == [today, "6", "0", "4", "1", "1", "0"]
    assert len(lines) == 3 and lines[1].split()[1:] == ["0", "0", "0", "0", "0", "0"]
    rows = list(csv.reader(io.StringIO(runner.invoke(args=["usage", "report", "alice", "--key", str(narrow.id),
                                                           "--format", "csv"]).output)))
    assert rows[0] == ["day", "requests", "credits", "success", "insufficient_scope", "rate_limited", "other"]
    assert len(rows) == 31 and rows[-1] == [today, "2", "0", "1", "1", "0", "0"]
    days = json.loads(runner.invoke(args=["usage", "report", "alice", "--key", str(free.id), "--days", "7",
                                          "--format", "json"]).output)
    assert len(days) == 7
    assert days[-1] == {"day": today, "requests": 4, "by_status": {"200": 3, "429": 1},
                        "by_endpoint": {ME: 1, PROTECTED: 3}}


def test_usage_report_refuses_another_accounts_key_and_bad_days(app, runner, user, pro_key):
    from accounts import users

    bob = users.create_user("bob", "bob@example.com", "another long password")
    bobs, _ = keyactions.issue_key(bob, "bob's", "development")
    result = runner.invoke(args=["usage", "report", "alice", "--key", str(bobs.id)])
    assert result.exit_code == 1 and f"no API key with id {bobs.id}" in result.output
    assert runner.invoke(args=["usage", "report", "alice", "--days", "0"]).exit_code == 2
    assert "no user named" in runner.invoke(args=["usage", "report", "nobody"]).output


@pytest.mark.parametrize("name, value", [("USAGE_HOURLY_RETENTION_DAYS", "0"), ("USAGE_DAILY_RETENTION_DAYS", "x"),
                                         ("REVOKED_KEY_RETENTION_DAYS", "-1")])
def test_retention_settings_are_validated_at_start(name, value):
    with pytest.raises(ValueError, match=name):
        load_config({"SECRET_KEY": "s", name: value})


def test_retention_defaults_and_zero_for_revoked_keys():
    config = load_config({"SECRET_KEY": "s", "REVOKED_KEY_RETENTION_DAYS": "0"})
    assert (config["USAGE_HOURLY_RETENTION_DAYS"], config["USAGE_DAILY_RETENTION_DAYS"],
            config["REVOKED_KEY_RETENTION_DAYS"]) == (90, 400, 0)


def test_outcomes_group_statuses():
    assert [analytics.outcome(status) for status in (200, 101, 403, 429, 503)] == [
        "success", "success", "insufficient_scope", "rate_limited", "other"]


def test_one_process_takes_the_prune_lock_and_the_others_skip_until_it_runs_out(app):
    from metering import lifecycle

    now = utcnow()
    assert lifecycle.take_lock(3600, now=now) is True
    assert lifecycle.take_lock(3600, now=now + datetime.timedelta(minutes=59)) is False
    assert lifecycle.take_lock(3600, now=now + datetime.timedelta(minutes=61)) is True


def test_prune_deletes_old_hours_and_days_and_idle_sessions_but_not_total_requests(app, client, user, pro_key):
    from metering import lifecycle
    from models import Session

    key = key_of(pro_key)
    get(client, PROTECTED, pro_key)
    app.extensions["usage"].flush()
    old = utcnow() - datetime.timedelta(days=401)
    UsageHour.create(api_key=key, hour=start_of_hour(old), endpoint=PROTECTED, requests=5)
    UsageDay.create(api_key=key, day=old.date(), endpoint=PROTECTED, requests=5)
    Session.create(token_hash="a" * 64, user=user, last_seen_at=old)
    Session.create(token_hash="b" * 64, user=user)
    pruned = lifecycle.prune(app.config)
    assert pruned == {"hourly": 1, "daily": 1, "keys": 0, "sessions": 1}
    assert [session.token_hash for session in Session.select()] == ["b" * 64]
    assert UsageHour.select().count() == UsageDay.select().count() == 1
    assert ApiKey.get_by_id(key.id).total_requests == 1
