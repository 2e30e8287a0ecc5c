"""The usage flush under the conditions of a real deployment: several processes writing the same
keys, a database that refuses for a while, a stop in the middle."""

import contextlib
import threading

import peewee
import pytest
import services
from liveserver import wait_for

from keys import keyformat
from metering import usage
from models import ApiKey, UsageHour, User, db
from orgs import keyactions, organisations
from store.connections import open_database
from store.statements import Statements

ENDPOINT = "/api/v1/protected/test"


def keys_of(user, count):
    return [keyactions.issue_key(user, f"Key {index}", "production", "pro")[0].id for index in range(count)]


def test_a_flush_writes_every_table_in_key_order_whatever_order_requests_came_in(app, user, monkeypatch):
    keys = keys_of(user, 4)
    counter = usage.UsageCounter(db.obj, interval=3600)
    for kid in reversed(keys):
        counter.add(kid, ENDPOINT, 429, False)
        counter.add(kid, ENDPOINT, 200, True)
    batches = []
    cursor = db.obj.cursor

    class RecordingCursor:
        def __init__(self, real):
            self.real = real

        def executemany(self, sql, rows):
            rows = list(rows)
            batches.append((sql.split()[0:3], rows))
            return self.real.executemany(sql, rows)

        def __getattr__(self, name):
            return getattr(self.real, name)

    monkeypatch.setattr(db.obj, "cursor", lambda *args, **kwargs: RecordingCursor(cursor(*args, **kwargs)))
    counter.flush()
    assert len(batches) == 3
    updated = [row[2] for row in batches[0][1]]
    assert updated == keys
    for _, rows in batches[1:]:
        assert [(row[0], row[3]) for row in rows] == [(kid, status) for kid in keys for status in (200, 429)]
    assert [ApiKey.get_by_id(kid).total_requests for kid in keys] == [1] * 4


def test_a_graceful_stop_tries_again_while_the_database_refuses(app, user):
    kid, = keys_of(user, 1)
    counter = usage.UsageCounter(db.obj, interval=3600)
    for _ in range(3):
        counter.add(kid, ENDPOINT, 200, True)
    write = counter.write
    refusals = []

    def refuse_twice(batch, used_at):
        if len(refusals) < 2:
            refusals.append(1)
            raise peewee.OperationalError("the database system is starting up")
        write(batch, used_at)

    counter.write = refuse_twice
    counter.close(retry_seconds=10)
    assert len(refusals) == 2
    assert ApiKey.get_by_id(kid).total_requests == 3
    assert counter.pending == {}


def test_a_graceful_stop_gives_up_after_its_time_and_says_so(app, user):
    kid, = keys_of(user, 1)
    counter = usage.UsageCounter(db.obj, interval=3600)
    counter.add(kid, ENDPOINT, 200, True)

    def refuse(batch, used_at):
        raise peewee.OperationalError("could not connect to server")

    counter.write = refuse
    with pytest.raises(peewee.OperationalError):
        counter.close(retry_seconds=0.3)
    assert sum(counter.pending.values()) == 1


def test_an_interrupted_flush_keeps_every_count_and_a_reader_never_sees_one_twice(app, user):
    kid, = keys_of(user, 1)
    counter = usage.UsageCounter(db.obj, interval=3600)
    for _ in range(5):
        counter.add(kid, ENDPOINT, 200, True)
    write = counter.write

    def written_then_killed(batch, used_at):
        write(batch, used_at)
        raise KeyboardInterrupt  # a BaseException, as a killed greenlet's GreenletExit

    counter.write = written_then_killed
    with pytest.raises(KeyboardInterrupt):
        counter.flush()
    # Rolled back with its transaction, so the five are still pending, and counted once.
    assert ApiKey.get_by_id(kid).total_requests == 0
    assert counter.total(kid) == 5
    counter.write = write
    counter.close()
    assert ApiKey.get_by_id(kid).total_requests == 5
    assert counter.total(kid) == 5


def deadlocks(database_name):
    with services.admin_connection() as connection:
        return connection.execute("SELECT deadlocks FROM pg_stat_database WHERE datname = %s",
                                  (database_name,)).fetchone()[0]


def waiting_on_locks(database_name):
    """How many sessions of the database wait for a lock another holds."""
    with services.admin_connection() as connection:
        return connection.execute("SELECT count(*) FROM pg_stat_activity "
                                  "WHERE datname = %s AND wait_event_type = 'Lock'",
                                  (database_name,)).fetchone()[0]


def test_processes_flushing_the_same_keys_in_opposite_orders_never_deadlock_on_postgresql(make_app):
    url = services.postgres_url()
    app = make_app({"DATABASE_URL": url, "RATELIMIT_STORAGE_URL": "memory://", "TESTING": True,
                    "RATE_LIMIT_TIERS": "free=3/minute,pro=100/minute", "MAX_KEYS_PER_USER": 100})
    from accounts import users

    with app.app_context():
        user = users.create_user("alice", "alice@example.com", "correct horse battery")
        keys = keys_of(user, 60)
    before = deadlocks(services.session_database())
    rounds = 15
    # Two processes' connections: each counter writes through its own database object.
    counters = []
    for _ in range(2):
        database = open_database(url)
        database.statements = Statements(database)
        counters.append(usage.UsageCounter(database, interval=3600))
    orders = [keys, list(reversed(keys))]
    barrier = threading.Barrier(2)
    errors = []

    def flush_rounds(counter, order):
        try:
            for _ in range(rounds):
                for kid in order:
                    counter.add(kid, ENDPOINT, 200, True)
                barrier.wait(timeout=30)
                counter.flush()
        except Exception as error:  # noqa: BLE001  reported below with the deadlock count
            errors.append(error)
            barrier.abort()

    threads = [threading.Thread(target=flush_rounds, args=pair) for pair in zip(counters, orders)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for counter in counters:
        counter.close()
        counter.database.close_all()
    assert errors == []
    assert deadlocks(services.session_database()) == before
    with app.app_context():
        assert {ApiKey.get_by_id(kid).total_requests for kid in keys} == {2 * rounds}


def test_a_request_that_passed_the_limit_but_failed_on_the_database_is_not_counted(app, client, api_key,
                                                                                   monkeypatch):
    def database_gone(self, key_id):
        raise peewee.OperationalError("the database system is shutting down")

    with monkeypatch.context() as outage:
        outage.setattr(usage.UsageCounter, "total", database_gone)
        refused = client.get("/api/v1/usage/stats", headers={"X-API-Key": api_key})
    assert refused.status_code == 503
    app.extensions["usage"].flush()
    key = ApiKey.get(ApiKey.key_hash == keyformat.hash_key(api_key))
    assert key.total_requests == 0
    assert [(row.status, row.requests) for row in UsageHour.select()] == [(503, 1)]
    served = client.get("/api/v1/usage/stats", headers={"X-API-Key": api_key})
    assert served.json["total_requests"] == 1


def test_counts_whose_commit_went_through_unseen_are_not_written_twice(app, user, monkeypatch):
    kid, = keys_of(user, 1)
    counter = usage.UsageCounter(db.obj, interval=3600)
    for _ in range(5):
        counter.add(kid, ENDPOINT, 200, True)
    committing = usage.write_transaction

    @contextlib.contextmanager
    def committed_then_connection_lost(database):
        with committing(database):
            yield
        raise peewee.OperationalError("server closed the connection unexpectedly")

    with monkeypatch.context() as lost:
        lost.setattr(usage, "write_transaction", committed_then_connection_lost)
        with pytest.raises(peewee.OperationalError):
            counter.flush()
    assert ApiKey.get_by_id(kid).total_requests == 5
    assert counter.total(kid) == 5
    counter.add(kid, ENDPOINT, 200, True)
    counter.close()
    assert ApiKey.get_by_id(kid).total_requests == 6
    assert sum(row.requests for row in UsageHour.select()) == 6


def test_a_graceful_stop_tries_again_after_the_driver_s_own_deadlock_error(app, user, monkeypatch):
    import sqlite3

    import psycopg

    kid, = keys_of(user, 1)
    counter = usage.UsageCounter(db.obj, interval=3600)
    counter.add(kid, ENDPOINT, 200, True)
    # What a raw cursor raises, which peewee had not wrapped: the last flush then gave up at once.
    error = psycopg.errors.DeadlockDetected if "postgres" in app.config["DATABASE_URL"] else sqlite3.OperationalError
    cursor = db.obj.cursor
    refusals = []

    class DeadlockingOnce:
        def __init__(self, real):
            self.real = real

        def executemany(self, sql, rows):
            if not refusals:
                refusals.append(sql)
                raise error("deadlock detected")
            return self.real.executemany(sql, rows)

        def __getattr__(self, name):
            return getattr(self.real, name)

    monkeypatch.setattr(db.obj, "cursor", lambda *args, **kwargs: DeadlockingOnce(cursor(*args, **kwargs)))
    counter.close(retry_seconds=10)
    assert len(refusals) == 1
    assert ApiKey.get_by_id(kid).total_requests == 1


def test_an_account_deleted_while_a_flush_waits_on_its_keys_deadlocks_neither(make_app):
    import psycopg

    from accounts import users

    url = services.postgres_url()
    app = make_app({"DATABASE_URL": url, "RATELIMIT_STORAGE_URL": "memory://", "TESTING": True,
                    "RATE_LIMIT_TIERS": "free=3/minute,pro=100/minute"})
    with app.app_context():
        owner = users.create_user("ursula", "ursula@example.com", "correct horse battery")
        other = users.create_user("walter", "walter@example.com", "correct horse battery")
        first, = keys_of(owner, 1)
        blocking, = keys_of(other, 1)
        last, = keys_of(owner, 1)
        # A roll rewrites the row elsewhere: the account's keys are now stored last before first.
        ApiKey.update(key_hash="rolled", previous_key_hash=ApiKey.key_hash).where(ApiKey.id == first).execute()
    before = deadlocks(services.session_database())
    database = open_database(url)
    database.statements = Statements(database)
    counter = usage.UsageCounter(database, interval=3600)
    for kid in (first, blocking, last):
        counter.add(kid, ENDPOINT, 200, True)
    errors = []
    # Another writer holds the other account's key, so the flush stops halfway through its keys.
    holder = psycopg.connect(url)
    holder.execute("UPDATE api_keys SET last_used_at = now() WHERE id = %s", (blocking,))

    def flush():
        try:
            counter.flush()
        except Exception as error:  # noqa: BLE001  asserted below
            errors.append(error)

    def delete_account():
        wait_for(lambda: waiting_on_locks(services.session_database()) >= 1)  # the flush waits on the holder
        try:
            with app.app_context():
                organisations.delete_account(User.get(User.username == "ursula"), "correct horse battery")
        except Exception as error:  # noqa: BLE001  asserted below
            errors.append(error)

    threads = [threading.Thread(target=flush), threading.Thread(target=delete_account)]
    for thread in threads:
        thread.start()
    # The deletion waits on the flush too (or, should it not need to, is done) before the holder lets go.
    wait_for(lambda: waiting_on_locks(services.session_database()) >= 2 or not threads[1].is_alive())
    holder.commit()
    holder.close()
    for thread in threads:
        thread.join(timeout=30)
    counter.close()
    database.close_all()
    assert errors == []
    assert deadlocks(services.session_database()) == before
    with app.app_context():
        assert ApiKey.get_by_id(blocking).total_requests == 1
        assert ApiKey.get_or_none(ApiKey.id == first) is None
