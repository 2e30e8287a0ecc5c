"""A database made by the fourth release (tests/fixtures, built by that code) brought to the latest
schema, on SQLite and PostgreSQL: each account moved into its personal organisation, its keys
working with their usage and credits, no old id given again, and an account deleted after the
upgrade taking everything of its own."""

import datetime

import pytest
from releases import RELEASE4, RELEASE4_ANSWERS, load_release4
from services import rows

from accounts import users
from metering import credits
from models import User, db
from orgs import keyactions, organisations
from store import schema
from webhooks import endpoints

# Their databases start empty, to be filled with the fourth release's schema.
pytestmark = pytest.mark.empty_database
# Tables whose rows a start or a flush may change (the schema's own, the key generation, the locks).
RESTLESS = {"schema_version", "key_generation", "maintenance_locks", "usage_writers", "sqlite_sequence"}


def columns_of(url, table):
    if url.startswith("sqlite"):
        return [row[1] for row in rows(url, f'PRAGMA table_info("{table}")')]
    return [name for (name,) in rows(url, "SELECT column_name FROM information_schema.columns WHERE table_schema = "
                                          f"'public' AND table_name = '{table}' ORDER BY ordinal_position")]


def tables_at(url):
    """{table: columns} of the service's tables in the database at url."""
    if url.startswith("sqlite"):
        names = rows(url, "SELECT name FROM sqlite_master WHERE type = 'table'")
    else:
        names = rows(url, "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
    return {name: columns_of(url, name) for (name,) in names if name not in RESTLESS}


def contents(url, tables):
    """{table: rows in the order of their first column} of the given {table: columns}."""
    return {table: rows(url, f'SELECT {", ".join(columns)} FROM "{table}" ORDER BY 1')
            for table, columns in tables.items()}


def index_names(url):
    if url.startswith("sqlite"):
        return {name for (name,) in rows(url, "SELECT name FROM sqlite_master "
                                              "WHERE type = 'index' AND sql IS NOT NULL")}
    return {name for (name,) in rows(url, "SELECT indexname FROM pg_indexes WHERE schemaname = 'public'")}


def release4_app(make_app, url, **settings):
    # Retention far beyond the fixture's age: nothing of it is pruned however long after it was made the test runs.
    return make_app({"DATABASE_URL": url, "RATE_LIMIT_TIERS": RELEASE4["tiers"], "WEBHOOK_ALLOW_PRIVATE": True,
                     "REVOKED_KEY_RETENTION_DAYS": 36500, "USAGE_HOURLY_RETENTION_DAYS": 36500,
                     "USAGE_DAILY_RETENTION_DAYS": 36500, **settings})


def personal_organisations(url):
    """{username: (org id, name, slug)} of the personal organisations."""
    return {username: (org_id, name, slug) for org_id, name, slug, username in rows(
        url, "SELECT o.id, o.name, o.slug, u.username FROM organisations o JOIN users u ON u.id = o.personal_for_id")}


def test_a_fourth_release_database_moves_each_account_into_its_personal_organisation(database_url, tmp_path,
                                                                                       make_app):
    """Version 12 to the latest: every row the fourth release wrote keeps every value (but an
    endpoint's account, now its personal organisation's); each account owns one personal
    organisation named after it, holding its keys, endpoints and their security events; `audit`,
    `keys list` and `webhooks list` print what the fourth release printed."""
    make_app({"DATABASE_URL": f"sqlite:///{tmp_path}/new.db"})
    new_indexes = index_names(f"sqlite:///{tmp_path}/new.db")
    assert {"apikey_org_id", "webhookendpoint_org_id", "membership_org_id_user_id"} <= new_indexes
    url, made = load_release4(database_url, tmp_path)
    old_tables = tables_at(url)
    old_tables["webhook_endpoints"].remove("user_id")
    before = contents(url, old_tables)
    app = release4_app(make_app, url)
    assert app.extensions["schema"] == (12, schema.LATEST)
    assert contents(url, old_tables) == before
    usernames = ["alice", "bob", "carol", "dave"]
    assert sorted(row[1] for row in before["users"]) == usernames
    personal = personal_organisations(url)
    assert {username: org[1:] for username, org in personal.items()} == {name: (name, name) for name in usernames}
    assert rows(url, "SELECT count(*) FROM organisations") == [(len(usernames),)]
    assert sorted(rows(url, "SELECT o.slug, u.username, m.role FROM memberships m JOIN organisations o "
                            "ON o.id = m.org_id JOIN users u ON u.id = m.user_id")) == [
        (name, name, "owner") for name in usernames]
    # Each key in its creator's personal organisation, its creator the account it was made for.
    keys = rows(url, "SELECT k.name, u.username, k.org_id FROM api_keys k JOIN users u ON u.id = k.user_id "
                     "ORDER BY k.id")
    assert len(keys) == len(before["api_keys"]) == 7
    assert [(name, org_id) for name, _, org_id in keys] == [(name, personal[username][0]) for name, username, _ in keys]
    assert [name for name, _, _ in keys] == [name for name in made["secrets"] if name not in (
        "bob endpoint", "carol previous", "erin gone")]
    assert rows(url, "SELECT id, org_id, url FROM webhook_endpoints") == [(1, personal["bob"][0], "http://127.0.0.1:9/bob")]
    # The key and webhook events moved to the organisation; the account's own stay the account's.
    events = rows(url, "SELECT e.event, u.username, e.org_id FROM security_events e JOIN users u ON u.id = e.user_id")
    assert len(events) == len(before["security_events"])
    moved = [(event, personal[username][0]) for event, username, _ in events if event.startswith(("key.", "webhook."))]
    assert {event for event, _ in moved} == {"key.created", "key.credits_changed", "key.limit_changed", "key.rolled",
                                             "key.revoked", "webhook.added", "webhook.removed"}
    assert [(event, org_id) for event, _, org_id in events if event.startswith(("key.", "webhook."))] == moved
    assert {org_id for event, _, org_id in events if event.startswith("user.")} == {None}
    # Every index that a new database has, those of the new columns among them.
    assert index_names(url) >= new_indexes
    with app.app_context():
        if url.startswith("sqlite"):
            assert db.execute_sql("PRAGMA foreign_key_check").fetchall() == []
        runner = app.test_cli_runner()
        for username in usernames:
            for command, printed in (("audit", made["audit"]), ("keys list", made["keys_list"]),
                                     ("webhooks list", made["webhooks_list"])):
                result = runner.invoke(args=[*command.split(), username])
                assert (result.exit_code, result.output.splitlines()) == (0, printed[username]), (command, username)


def test_a_fourth_release_database_keeps_its_keys_working_with_their_usage_and_credits(database_url, tmp_path,
                                                                                        make_app):
    """Every secret the fourth release gave answers as it did there: the active keys (a rolled
    key's previous secret in its grace period among them) are admitted, the revoked, expired and
    deleted account's are not; totals, credits, refills and a key's own windows carry on, and the
    account allowance counts each account's keys together, apart from every other account's."""
    url, made = load_release4(database_url, tmp_path)
    app = release4_app(make_app, url, ACCOUNT_RATE_LIMIT="12/hour")
    secrets = made["secrets"]
    client = app.test_client()

    def get(name, path="/api/v1/protected/test"):
        return client.get(path, headers={"X-API-Key": secrets[name]})

    for name, status in RELEASE4_ANSWERS.items():
        response = get(name)
        if status == 200:
            assert (response.status_code, response.json["api_key_name"]) == (200, name.replace("previous", "rolled"))
        else:
            assert (response.status_code, response.json) == (401, {"error": {
                "code": "invalid_api_key", "message": "The API key is malformed, unknown or revoked."}})
    # The totals made there and this test's requests since; alice's credits go on from 114, her windows her own.
    stats = {name: get(name, "/api/v1/usage/stats") for name in ("alice live", "alice refill", "bob expiring",
                                                                  "carol rolled")}
    assert {name: (response.status_code, response.json["total_requests"]) for name, response in stats.items()} == {
        "alice live": (200, 6 + 2), "alice refill": (200, 3 + 2), "bob expiring": (200, 4 + 2),
        "carol rolled": (200, 5 + 3)}
    assert stats["alice live"].json["credits"] == {"remaining": 114 - 2, "refill": None}
    assert stats["alice live"].headers["RateLimit-Policy"] == (
        '"key-second";q=10;w=1, "key-hour";q=600;w=3600, "account";q=12;w=3600')
    refill = stats["alice refill"].json["credits"]
    # Refilled to 500 on the first request of a month after the one it was made in (November 2026).
    refilled = credits.period_start("month") > datetime.datetime(2026, 11, 1)
    assert refill["remaining"] == (500 if refilled else 497) - 2
    assert (refill["refill"]["amount"], refill["refill"]["interval"]) == (500, "month")
    me = get("dave live", "/api/v1/user/me").json
    assert (me["username"], me["email"], me["api_key_count"]) == ("dave", "dave@example.com", 1)
    # Alice's organisation has 4 of its 12 spent; the others' requests spent none of them.
    assert [get(name).status_code for name in ("alice live", "alice refill") * 6] == [200] * 8 + [429] * 4
    refused = get("alice refill")
    assert (refused.json["error"]["code"], refused.headers["X-RateLimit-Limit"]) == (
        "account_rate_limit_exceeded", "12")
    assert [get(name).status_code for name in ("bob expiring", "carol rolled", "dave live")] == [200] * 3


def test_a_fourth_release_database_gives_no_old_id_again(database_url, tmp_path, make_app):
    """The newest account (erin), key (erin's) and endpoint (bob's second) were deleted there: a new
    account, key, endpoint and webhook message get ids above the highest ever given."""
    url, _ = load_release4(database_url, tmp_path)
    app = release4_app(make_app, url)
    with app.app_context():
        frank = users.create_user("frank", "frank@example.com", "correct horse battery")
        key, _ = keyactions.issue_key(frank, "Key", "development")
        endpoint, _ = endpoints.add_endpoint(frank, "http://127.0.0.1:9/frank")
        message = endpoints.send_test(endpoint)
        assert (frank.id, key.id, endpoint.id, message.id) == (6, 9, 3, 4)
        assert key.org_id == endpoint.org_id == personal_organisations(url)["frank"][0]


def test_a_fourth_release_account_deleted_after_the_upgrade_takes_everything_of_its_own(database_url, tmp_path,
                                                                                      make_app):
    """SQLite cannot give the upgraded tables their organisation's foreign key: the service deletes
    what a deleted account's personal organisation held itself, as the cascades do on PostgreSQL."""
    url, _ = load_release4(database_url, tmp_path)
    app = release4_app(make_app, url)
    with app.app_context():
        for user in User.select():
            organisations.delete_account(user, RELEASE4["password"])
    left = {table: count for table in tables_at(url)
            if (count := rows(url, f'SELECT count(*) FROM "{table}"')[0][0])}
    assert left == {}
