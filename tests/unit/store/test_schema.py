"""Schema upgrades: a database made by the first release, a fifth, a ninth or a fourteenth version
(tests/fixtures, built by that code), is brought to the latest schema in place, by the app and by
several workers starting at once, on SQLite and PostgreSQL, with every user, key and count kept and
the old keys still working; no id is given to a second row. The fourth release's:
test_release4_upgrade.py."""

import contextlib
import datetime
import json
import multiprocessing
import os
import sqlite3
import time
from pathlib import Path

import flask
import psycopg
import pytest
import requests
from appconfig import TEST_TIERS
from liveserver import cli, service_env, start_procfile
from playhouse.migrate import PostgresqlMigrator, SqliteMigrator, migrate

import auth
import models
from accounts import sessions, users
from accounts.models import Passkey, RecoveryCode, TwoFactor
from mail.models import MailMessage
from models import ApiKey, User, db
from orgs import keyactions, organisations
from store import connections, schema
from webhooks import endpoints
from webhooks.models import WebhookMarker

# Their databases start empty, to be filled with an earlier release's schema.
pytestmark = pytest.mark.empty_database
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
SECRETS = json.loads((FIXTURES / "release1.json").read_text())


def load_release1(database_url, tmp_path):
    """Fill the empty database at database_url with the first release's fixture; return its URL."""
    if database_url.startswith("sqlite"):
        # The first release's database as `sqlite3 .dump` wrote it (a .db file is local state).
        path = tmp_path / "release1.db"
        with sqlite3.connect(path) as connection:
            connection.executescript((FIXTURES / "release1.sqlite.sql").read_text())
        connection.close()
        return f"sqlite:///{path}"
    with psycopg.connect(database_url, autocommit=True) as connection:
        connection.execute((FIXTURES / "release1.sql").read_text())
        connection.execute("SET search_path TO public")
    return database_url


def schema_version(make_app, database_url):
    with make_app({"DATABASE_URL": database_url}).app_context():
        return db.execute_sql("SELECT version FROM schema_version").fetchone()[0]


def test_a_first_release_database_upgrades_in_place(database_url, tmp_path, make_app):
    url = load_release1(database_url, tmp_path)
    secrets = SECRETS["postgresql" if url.startswith("postgresql") else "sqlite"]
    app = make_app({"DATABASE_URL": url, "RATE_LIMIT_TIERS": TEST_TIERS})
    assert app.extensions["schema"] == (1, schema.LATEST)
    with app.app_context():
        live = auth.authenticate(secrets["live"])
        assert (live.name, live.key_type, live.rate_limit_tier) == ("Release 1 live", "production", "pro")
        assert auth.authenticate(secrets["test"]).name == "Release 1 test"
        with pytest.raises(auth.ApiKeyError):
            auth.authenticate(secrets["revoked"])
        assert ApiKey.get_by_id(live.id).total_requests == 7
        assert User.get().username == "carol"
        # The first release's hourly count stays, as an unrecorded endpoint's 200s, and is in its day.
        hours = [(row.hour, row.endpoint, row.status, row.requests) for row in models.UsageHour.select()]
        assert hours == [(datetime.datetime(2026, 11, 23, 14), "", 200, 7)]
        days = [(row.day, row.endpoint, row.status, row.requests) for row in models.UsageDay.select()]
        assert days == [(datetime.date(2026, 11, 23), "", 200, 7)]
        assert {column.name for column in db.get_columns("api_keys")} >= {
            "expires_at", "scopes", "previous_key_hash", "previous_display_prefix", "previous_expires_at",
            "allow_ips"}
    assert app.test_client().get("/api/v1/user/me", headers={"X-API-Key": secrets["test"]}).json["api_key_count"] == 2
    # The old one-row-per-hour index is gone: a second endpoint in the same hour is a second row.
    assert app.test_client().get("/api/v1/protected/test", headers={"X-API-Key": secrets["live"]}).status_code == 200
    app.extensions["usage"].close()
    app.extensions["lifecycle"].close()
    with app.app_context():
        assert models.UsageHour.select().count() == 3
    again = make_app({"DATABASE_URL": url})
    assert again.extensions["schema"] == (schema.LATEST, schema.LATEST)
    assert schema_version(make_app, url) == schema.LATEST


def test_a_second_release_database_gets_allow_lists(database_url, tmp_path, monkeypatch, make_app):
    """Version 2 (expiry, scopes, rolls) to the latest: keys gain an empty allow-list and keep working anywhere."""
    url = load_release1(database_url, tmp_path)
    database = connections.open_database(url)
    with monkeypatch.context() as second_release:
        second_release.setattr(schema, "STEPS", schema.STEPS[:1])
        second_release.setattr(schema, "LATEST", 2)
        assert schema.upgrade(database, []) == (1, 2)
    database.close()
    app = make_app({"DATABASE_URL": url, "RATE_LIMIT_TIERS": TEST_TIERS})
    assert app.extensions["schema"] == (2, schema.LATEST)
    secret = SECRETS["postgresql" if url.startswith("postgresql") else "sqlite"]["live"]
    with app.app_context():
        assert "allow_ips" in {column.name for column in db.get_columns("api_keys")}
        assert ApiKey.get(ApiKey.name == "Release 1 live").allow_ips is None
    response = app.test_client().get("/api/v1/protected/test", headers={"X-API-Key": secret},
                                     environ_base={"REMOTE_ADDR": "198.51.100.1"})
    assert response.status_code == 200


def test_a_fifth_version_database_keeps_totp_set_ups_with_their_session(database_url, make_app):
    """Version 5 to the latest: sessions gain the set-up's columns; an authenticator turned on stays,
    and a secret never confirmed, which version 5 kept with the account for any session, is gone."""
    with make_app({"DATABASE_URL": database_url}).app_context():
        owner = users.create_user("alice", "alice@example.com", "correct horse battery")
        other = users.create_user("bob", "bob@example.com", "correct horse battery")
        TwoFactor.create(user=owner.id, sealed_secret="on", enabled_at=models.utcnow(), last_step=7)
        TwoFactor.create(user=other.id, sealed_secret="waiting")
        token = sessions.start_session(owner)
        # The sessions table as version 5 made it.
        migrator = (PostgresqlMigrator if database_url.startswith("postgresql") else SqliteMigrator)(db.obj)
        migrate(migrator.drop_column("sessions", "totp_setup"), migrator.drop_column("sessions", "totp_setup_at"))
        db.execute_sql("UPDATE schema_version SET version = 5")
    app = make_app({"DATABASE_URL": database_url})
    assert app.extensions["schema"] == (5, schema.LATEST)
    with app.app_context():
        assert {"totp_setup", "totp_setup_at"} <= {column.name for column in db.get_columns("sessions")}
        assert [(row.user_id, row.last_step) for row in TwoFactor.select()] == [(owner.id, 7)]
        session = sessions.find_session(token)
        assert session.user_id == owner.id and session.totp_setup is None


def test_a_fourteenth_version_database_gets_the_mail_caps_column_and_its_index(database_url, make_app):
    """Version 14 to the latest: the mails so far count in no address's cap (mail/addresscap.py),
    and the cap's count has its index."""
    with make_app({"DATABASE_URL": database_url}).app_context():
        MailMessage.create(recipient="bob@example.com", subject="A test mail", message_id="<1@localhost>",
                           sealed_parts="")
        # The mail table as version 14 made it.
        db.execute_sql("DROP INDEX mailmessage_capped_address_created_at")
        migrator = (PostgresqlMigrator if database_url.startswith("postgresql") else SqliteMigrator)(db.obj)
        migrate(migrator.drop_column("mail_messages", "capped_address"))
        db.execute_sql("UPDATE schema_version SET version = 14")
    app = make_app({"DATABASE_URL": database_url})
    assert app.extensions["schema"] == (14, schema.LATEST)
    with app.app_context():
        assert [(row.recipient, row.capped_address) for row in MailMessage.select()] == [("bob@example.com", None)]
        assert "mailmessage_capped_address_created_at" in {index.name for index in db.get_indexes("mail_messages")}


def test_a_new_database_starts_at_the_latest_version(app):
    assert app.extensions["schema"] == (schema.LATEST, schema.LATEST)


def test_db_upgrade_says_where_the_database_stands(database_url, tmp_path):
    url = load_release1(database_url, tmp_path)
    env = service_env(tmp_path, DATABASE_URL=url)
    assert cli(env, "db", "upgrade") == f"Upgraded the database from schema version 1 to {schema.LATEST}.\n"
    assert cli(env, "db", "upgrade") == f"The database is at schema version {schema.LATEST}, the latest.\n"


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_workers_starting_together_upgrade_once(database, tmp_path):
    env = service_env(tmp_path, database, WEB_CONCURRENCY="4", RATE_LIMIT_TIERS="free=1000/hour,pro=1000/hour")
    env["DATABASE_URL"] = load_release1(env["DATABASE_URL"], tmp_path)
    server = start_procfile(tmp_path, env)
    try:
        secrets = SECRETS[database]
        for secret in (secrets["live"], secrets["test"]):
            response = requests.get(server.base + "/api/v1/protected/test", headers={"X-API-Key": secret}, timeout=10)
            assert response.status_code == 200
        output = server.output()
    finally:
        server.stop()
    assert output.count(f"Upgraded the database from schema version 1 to {schema.LATEST}.") == 1
    assert "Traceback" not in output


def start_a_worker(path, start):
    """What a gunicorn worker does first with a new SQLite file; exit 0 if it could."""
    while time.time() < start:
        pass
    try:
        app = flask.Flask(__name__)
        app.config["DATABASE_URL"] = f"sqlite:///{path}"
        models.init_app(app)
    except Exception:
        os._exit(1)
    os._exit(0)


def test_workers_starting_together_on_a_new_sqlite_file_all_start(tmp_path):
    """Found by a CI run: two workers on a new file raced to switch it to WAL, and SQLite refused
    the loser at once ("database is locked"), so gunicorn gave up: "Worker failed to boot"."""
    forking = multiprocessing.get_context("fork")
    failed = 0
    for run in range(40):
        start = time.time() + 0.05
        workers = [forking.Process(target=start_a_worker, args=(tmp_path / f"{run}.db", start)) for _ in range(8)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(timeout=60)
        failed += sum(worker.exitcode != 0 for worker in workers)
    assert failed == 0


def test_no_id_is_given_to_a_second_row(database_url, make_app):
    """A deleted user's, key's, passkey's, recovery code's, webhook endpoint's, message's and
    marker's id, the newest of its table, is not given to the next row: SQLite gives max(id) + 1
    unless the id is AUTOINCREMENT."""
    app = make_app({"DATABASE_URL": database_url, "WEBHOOK_ALLOW_PRIVATE": True})
    with app.app_context():
        users.create_user("alice", "alice@example.com", "correct horse battery")
        bob = users.create_user("bob", "bob@example.com", "correct horse battery")
        gone = made_for(bob)
        endpoints.remove_endpoint(gone["webhook_endpoints"])
        organisations.delete_account(bob, "correct horse battery")
        assert [row for row in gone.values() if type(row).get_or_none(type(row).id == row.id)] == []
        new = made_for(users.create_user("carol", "carol@example.com", "correct horse battery"))
    assert set(gone) == set(schema.NEVER_REUSED_IDS)
    assert {table: (gone[table].id, new[table].id) for table in gone} == {
        table: (gone[table].id, gone[table].id + 1) for table in gone}


def made_for(user):
    """{table: row} for the user and a row of each table that names it, each its table's newest."""
    key, _ = keyactions.issue_key(user, "Key", "development")
    endpoint, _ = endpoints.add_endpoint(user, f"http://127.0.0.1:9/{user.username}")
    rows = [user, key, endpoint, endpoints.send_test(endpoint),
            Passkey.create(user=user.id, name="Laptop", credential_id=f"credential-{user.id}", public_key=b"k"),
            RecoveryCode.create(user=user.id, code_hash=f"{user.id:064d}"),
            WebhookMarker.create(api_key=key.id, event="key.expiring")]
    return {row._meta.table_name: row for row in rows}


def load_version9(tmp_path):
    """A SQLite database at schema version 9 (a `sqlite3 .dump` of one made by that version's code,
    with ids freed below each table's highest); return its path."""
    path = tmp_path / "version9.db"
    with contextlib.closing(sqlite3.connect(path)) as connection:
        connection.executescript((FIXTURES / "version9.sqlite.sql").read_text())
    return path


def tables_of(path):
    """{table: (columns, rows by rowid)} of the service's tables (not schema_version), the indexes'
    statements and the tables whose ids AUTOINCREMENT."""
    with contextlib.closing(sqlite3.connect(path)) as connection:
        names = [name for (name,) in connection.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' "
            "AND name != 'schema_version'")]
        tables = {}
        for name in names:
            columns = [row[1] for row in connection.execute(f'PRAGMA table_info("{name}")')]
            tables[name] = (columns, connection.execute(f'SELECT * FROM "{name}" ORDER BY rowid').fetchall())
        indexes = set(connection.execute("SELECT tbl_name, name, sql FROM sqlite_master WHERE type = 'index'"))
        autoincrement = {name for name, sql in connection.execute("SELECT name, sql FROM sqlite_master")
                         if "AUTOINCREMENT" in (sql or "")}
    return tables, indexes, autoincrement


def test_a_ninth_version_sqlite_database_keeps_every_row_and_gives_no_id_again(tmp_path, make_app):
    """Version 9 to the latest: the tables of schema.NEVER_REUSED_IDS are made anew with AUTOINCREMENT,
    as a new database has them, every row, id, index and foreign key kept; no id up to each table's
    highest is given again, even once every row is deleted."""
    make_app({"DATABASE_URL": f"sqlite:///{tmp_path}/new.db"})
    path = load_version9(tmp_path)
    before, indexes_before, _ = tables_of(path)
    app = make_app({"DATABASE_URL": f"sqlite:///{path}", "RATE_LIMIT_TIERS": TEST_TIERS, "WEBHOOK_ALLOW_PRIVATE": True})
    assert app.extensions["schema"] == (9, schema.LATEST)
    _, indexes_after, autoincrement = tables_of(path)
    # Later versions may add columns: the columns version 9 had keep every value, but an endpoint's
    # account, which version 13 made its account's personal organisation.
    moved = before["webhook_endpoints"][0].index("user_id")
    before["webhook_endpoints"] = ([name for name in before["webhook_endpoints"][0] if name != "user_id"],
                                   [row[:moved] + row[moved + 1:] for row in before["webhook_endpoints"][1]])
    with contextlib.closing(sqlite3.connect(path)) as connection:
        kept = {table: (columns, connection.execute(f'SELECT {", ".join(columns)} FROM "{table}" ORDER BY rowid')
                        .fetchall()) for table, (columns, _) in before.items()}
        endpoint_owners = connection.execute(
            "SELECT count(*) FROM webhook_endpoints e JOIN organisations o ON o.id = e.org_id "
            "WHERE o.personal_for_id IS NOT NULL").fetchone()
    assert kept == before
    assert endpoint_owners == (len(before["webhook_endpoints"][1]),)
    assert indexes_after >= {index for index in indexes_before if index[1] != "webhookendpoint_user_id"}
    # Tables added after version 10 are made with AUTOINCREMENT from the start.
    assert autoincrement == tables_of(tmp_path / "new.db")[2] == {*schema.NEVER_REUSED_IDS, "mail_messages",
                                                                  "organisations", "memberships", "invitations",
                                                                  "billing_events", "billing_periods"}
    highest = {table: max(row[0] for row in before[table][1]) for table in schema.NEVER_REUSED_IDS}
    with app.app_context():
        assert db.execute_sql("PRAGMA foreign_key_check").fetchall() == []
        assert db.execute_sql("PRAGMA foreign_keys").fetchone() == (1,)
        # Deleting the accounts deletes, by the foreign keys' cascades, every row that was theirs.
        for user in User.select():
            organisations.delete_account(user, "correct horse battery")
        left = {table: db.execute_sql(f'SELECT count(*) FROM "{table}"').fetchone()[0] for table in before}
        assert {table: count for table, count in left.items() if count} == {"usage_writers": 1, "maintenance_locks": 1}
        new = made_for(users.create_user("erin", "erin@example.com", "correct horse battery"))
    assert {table: row.id for table, row in new.items()} == {table: highest[table] + 1 for table in highest}
    # The step finds its work done when it runs again.
    upgraded = tables_of(path)
    with contextlib.closing(sqlite3.connect(path)) as connection, connection:
        connection.execute("UPDATE schema_version SET version = 9")
    assert make_app({"DATABASE_URL": f"sqlite:///{path}"}).extensions["schema"] == (9, schema.LATEST)
    assert tables_of(path) == upgraded and upgraded[1:] == (indexes_after, autoincrement)


def test_an_account_deleted_with_the_foreign_keys_off_leaves_its_keys_to_no_new_account(tmp_path, make_app):
    """The newest account of a version 9 database deleted in the sqlite3 shell (foreign keys off):
    its keys and endpoints still name its id, and the upgrade gives that id to no one."""
    path = load_version9(tmp_path)
    with contextlib.closing(sqlite3.connect(path)) as connection, connection:
        (newest,) = connection.execute("SELECT max(id) FROM users").fetchone()
        connection.execute("DELETE FROM users WHERE id = ?", (newest,))
        orphans = connection.execute("SELECT count(*) FROM api_keys WHERE user_id = ?", (newest,)).fetchone()[0]
    assert orphans
    app = make_app({"DATABASE_URL": f"sqlite:///{path}", "RATE_LIMIT_TIERS": TEST_TIERS})
    with app.app_context():
        # The upgrade deletes what belonged to no one, and what named it (a pending message of a
        # deleted endpoint would keep every sender claiming in vain).
        assert {row[0] for row in db.execute_sql("PRAGMA foreign_key_check").fetchall()} == set()
        user = users.create_user("frank", "frank@example.com", "correct horse battery")
        assert user.id > newest
        assert ApiKey.select().where(ApiKey.user == user.id).count() == 0


def test_db_upgrade_brings_a_ninth_version_sqlite_database_to_the_latest(tmp_path):
    env = service_env(tmp_path, DATABASE_URL=f"sqlite:///{load_version9(tmp_path)}")
    assert cli(env, "db", "upgrade") == f"Upgraded the database from schema version 9 to {schema.LATEST}.\n"
    assert cli(env, "db", "upgrade") == f"The database is at schema version {schema.LATEST}, the latest.\n"


def key_generation_of(path):
    with contextlib.closing(sqlite3.connect(path)) as connection:
        triggers = {name for (name,) in connection.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")}
        return connection.execute("SELECT generation FROM key_generation").fetchall(), triggers


@pytest.mark.parametrize("start", ["new", "version 9"])
def test_a_sqlite_database_keeps_a_key_generation_that_only_key_changes_move(tmp_path, make_app, start):
    """keys/keycache.py keeps keys while it stands still: a key's name or revocation moves it, a
    usage flush's total and last use do not."""
    path = tmp_path / "new.db" if start == "new" else load_version9(tmp_path)
    make_app({"DATABASE_URL": f"sqlite:///{path}"})
    assert key_generation_of(path) == ([(1,)], {"api_key_changed", "api_key_deleted", "imported_key_added"})
    if start == "new":
        with contextlib.closing(sqlite3.connect(path)) as connection, connection:
            connection.execute("INSERT INTO users (username, email, password_hash, created_at) "
                               "VALUES ('kim', 'kim@example.com', 'x', '2026-01-01')")
            connection.execute("INSERT INTO organisations (name, slug, created_at) VALUES ('kim', 'kim', '2026-01-01')")
            connection.execute("INSERT INTO api_keys (org_id, user_id, name, key_type, rate_limit_tier, "
                               "display_prefix, key_hash, created_at, total_requests) "
                               "VALUES (1, 1, 'k', 'development', 'free', 'sk_test_abcd', 'h', '2026-01-01', 0)")
    with contextlib.closing(sqlite3.connect(path)) as connection, connection:
        connection.execute("UPDATE api_keys SET total_requests = total_requests + 1, last_used_at = '2026-02-01'")
    assert key_generation_of(path)[0] == [(1,)]
    with contextlib.closing(sqlite3.connect(path)) as connection, connection:
        keys = connection.execute("SELECT count(*) FROM api_keys").fetchone()[0]
        connection.execute("UPDATE api_keys SET revoked_at = '2026-02-01'")
        connection.execute("DELETE FROM api_keys")
    # Once a row: each key revoked, then each deleted.
    assert key_generation_of(path)[0] == [(1 + 2 * keys,)]

