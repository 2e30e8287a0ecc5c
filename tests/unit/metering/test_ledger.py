"""The credits ledger: each key's usage hours and days record the credits their requests spent,
written in the usage flush with the counts, and shown by usage/stats, `usage report` and the key's
page, on SQLite and PostgreSQL."""

import pytest
from peewee import fn

from accounts import users
from metering import analytics
from models import ApiKey, UsageDay, UsageHour
from orgs import keyactions

PROTECTED = "/api/v1/protected/test"
STATS = "/api/v1/usage/stats"


@pytest.fixture
def metered(make_app, database_url):
    app = make_app({"DATABASE_URL": database_url, "RATELIMIT_STORAGE_URL": "memory://",
                    "RATE_LIMIT_TIERS": "free=3/minute,wide=1000/minute", "PUBLIC_RATE_LIMIT": "off",
                    "TESTING": True, "WTF_CSRF_ENABLED": False})
    with app.app_context():
        yield app


@pytest.fixture
def owner(metered):
    return users.create_user("carol", "carol@example.com", "correct horse battery")


def get(app, secret, path=PROTECTED):
    return app.test_client().get(path, headers={"X-API-Key": secret})


def spent_in(model, key):
    return model.select(fn.COALESCE(fn.SUM(model.credits), 0)).where(model.api_key == key.id).scalar()


def test_each_spent_credit_is_written_with_its_request_and_a_refusal_spends_none(metered, owner):
    key, secret = keyactions.issue_key(owner, "metered", "development", "wide", scopes=["test:read", "usage:read"],
                                       credits_given=5)
    _, plain = keyactions.issue_key(owner, "plain", "development", "wide")
    answers = [get(metered, secret).status_code for _ in range(4)] + [get(metered, plain).status_code]
    assert answers == [200] * 5
    stats = get(metered, secret, STATS).get_json()
    assert (stats["credits"]["remaining"], stats["credits_spent_today"]) == (0, 5)
    assert get(metered, secret).status_code == 429
    metered.extensions["usage"].flush()
    assert spent_in(UsageHour, key) == spent_in(UsageDay, key) == 5
    assert ApiKey.get_by_id(key.id).credits_remaining == 0
    [refused] = UsageHour.select().where((UsageHour.api_key == key.id) & (UsageHour.status == 429))
    assert (refused.requests, refused.credits) == (1, 0)


def test_usage_stats_of_a_key_without_credits_has_no_credits_spent(metered, owner):
    _, secret = keyactions.issue_key(owner, "plain", "development", "wide", scopes=["usage:read"])
    assert "credits_spent_today" not in get(metered, secret, STATS).get_json()


def test_credits_spent_today_counts_what_is_written_and_what_is_pending(metered, owner):
    _, secret = keyactions.issue_key(owner, "metered", "development", "wide", scopes=["test:read", "usage:read"],
                                     credits_given=100)
    for _ in range(3):
        get(metered, secret)
    metered.extensions["usage"].flush()
    for _ in range(2):
        get(metered, secret)
    assert get(metered, secret, STATS).get_json()["credits_spent_today"] == 6


def test_the_report_and_the_key_page_show_credits_spent_beside_requests(metered, owner):
    key, secret = keyactions.issue_key(owner, "metered", "development", "wide", credits_given=10)
    for _ in range(4):
        get(metered, secret)
    metered.extensions["usage"].flush()
    [today] = analytics.daily([key.id], days=1)
    assert (today.requests, today.credits) == (4, 4)
    runner = metered.test_cli_runner()
    csv_lines = runner.invoke(args=["usage", "report", "carol", "--days", "1", "--format", "csv"]).output.splitlines()
    assert csv_lines[0] == "day,requests,credits,success,insufficient_scope,rate_limited,other"
    assert csv_lines[1].split(",")[1:4] == ["4", "4", "4"]
    table = runner.invoke(args=["usage", "report", "carol", "--days", "1"]).output.splitlines()
    assert "credits spent" in table[0]
    client = metered.test_client()
    assert client.post("/login", data={"username": "carol", "password": "correct horse battery"}).status_code == 302
    page = client.get(f"/settings/security/keys/{key.id}").text
    assert 'id="credits-spent">4 today, 4 in 7 days, 4 in\n      30 days' in page
