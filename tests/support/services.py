"""PostgreSQL and Redis for the tests, and nothing else of any server: a database of their own on
the PostgreSQL server of TEST_DATABASE_URL, and a redis-server of their own or TEST_REDIS_URL's. Where
one is unavailable the tests that need it skip, except under CI=true, where they fail."""

import contextlib
import graphlib
import os
import socket
import sqlite3
import uuid
from urllib.parse import urlsplit

import psycopg
import pytest
from psycopg import sql

# The PostgreSQL server where each test run makes (and drops) its own database, reached through
# this URL's database.
ADMIN_URL = urlsplit(os.environ.get("TEST_DATABASE_URL") or "postgresql://postgres@127.0.0.1:5432/test")
POSTGRES = (ADMIN_URL.hostname or "127.0.0.1", ADMIN_URL.port or 5432)
# The Redis given to the tests, if any. Each pytest-xdist worker (gw0, gw1, ...) empties a database
# of its own there: the URL's for gw0, and counting down for the next (from /15: 15, 14, ...).
GIVEN_REDIS_URL = os.environ.get("TEST_REDIS_URL")
WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
# Else this process's own redis-server, started when a test first needs it (privateservers.PrivateRedis).
_private_redis = None
_session_database = f"apitest_{uuid.uuid4().hex[:12]}"
_created = False
# The schema of the session database as an app built it, while no test has changed it since: the
# next app's database is then that schema emptied of rows, not a schema built anew.
_built_schema = None
# The statements that empty that schema, and the connection that checks and empties it.
_emptying = None
_keeper = None
# One row per column, index and constraint of the public schema: what tells a schema a test
# altered (a column dropped, an index added) from the one the app built.
SCHEMA_FINGERPRINT = """
SELECT md5(string_agg(part, ';' ORDER BY part)) FROM (
    SELECT concat_ws(' ', table_name, column_name, data_type, is_nullable, column_default) AS part
    FROM information_schema.columns WHERE table_schema = 'public'
    UNION ALL SELECT indexdef FROM pg_indexes WHERE schemaname = 'public'
    UNION ALL SELECT conrelid::regclass || ' ' || pg_get_constraintdef(oid) FROM pg_constraint
    WHERE connamespace = 'public'::regnamespace) AS parts
"""
# What an app writes into a new database besides its tables: the schema's version.
BUILT_ROWS = "schema_version"


def rows(database_url, sql):
    """The rows sql selects from the database at database_url (a server's, read from outside it)."""
    if database_url.startswith("sqlite"):
        with contextlib.closing(sqlite3.connect(database_url.removeprefix("sqlite:///"))) as connection:
            return connection.execute(sql).fetchall()
    with psycopg.connect(database_url) as connection:
        return connection.execute(sql).fetchall()


def unavailable(reason):
    """Skip for want of something outside the project (a server, a browser, root); under CI=true,
    where every test must run, fail instead."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason}; CI=true requires this test to run")
    pytest.skip(reason)


def require(name, address):
    try:
        socket.create_connection(address, timeout=2).close()
    except OSError as error:
        unavailable(f"{name} is not reachable on {address[0]}:{address[1]} ({error})")


def admin_connection():
    return psycopg.connect(ADMIN_URL.geturl(), autocommit=True)


def postgres_url():
    """Return the URL of this test run's own, empty PostgreSQL database."""
    global _created, _built_schema
    require("PostgreSQL", POSTGRES)
    if not _created:
        with admin_connection() as connection:
            connection.execute(f"CREATE DATABASE {_session_database}")
            # A commit that waits for the disk cost the unit tests on PostgreSQL half their time.
            # What they test is visible once committed whether or not it reached the disk; only a
            # crash of PostgreSQL itself, which no test makes, could lose it.
            connection.execute(f"ALTER DATABASE {_session_database} SET synchronous_commit = off")
        _created = True
    url = postgres_url_of(_session_database)
    _built_schema = None
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute("DROP SCHEMA public CASCADE")
        connection.execute("CREATE SCHEMA public")
    return url


def postgres_url_as_built(build):
    """Return the URL of this test run's PostgreSQL database holding the schema that build(url)
    (an app's start) makes in an empty one, and no rows but the schema's version. The schema is
    built once and emptied for each later test (about 8 ms against 240 for building it), unless
    a test has changed it meanwhile."""
    global _built_schema, _emptying
    url = postgres_url_of(_session_database)
    if _built_schema is not None and emptied_as_built():
        return url
    url = postgres_url()
    build(url)
    with psycopg.connect(url, autocommit=True) as connection:
        # A build that wrote rows of its own would lose them to the emptying: built anew each time.
        written = [name for name in tables_but_the_version(connection)
                   if connection.execute(sql.SQL("SELECT 1 FROM {} LIMIT 1").format(sql.Identifier(name))).fetchone()]
        _built_schema = None if written else schema_of(connection)
        _emptying = emptying(connection)
    return url


def emptied_as_built():
    """Empty the session database if it still holds the schema as built; False where a test changed it.
    Through one connection kept for the process: a new one starts a server process whose catalog
    caches are cold, which tripled the time."""
    try:
        return emptied_if_as_built(keeper())
    except psycopg.OperationalError:
        # A test ended the kept connection (PostgreSQL restarted, its sessions terminated): once more
        # through a new one.
        keeper().close()
        return emptied_if_as_built(keeper())


def keeper():
    """The connection kept for emptying the session database, opened again once closed."""
    global _keeper
    if _keeper is None or _keeper.closed:
        # No statement prepared: a schema built anew reuses the names of the tables it dropped.
        _keeper = psycopg.connect(postgres_url_of(_session_database), autocommit=True, prepare_threshold=None)
    return _keeper


def emptied_if_as_built(connection):
    if schema_of(connection) != _built_schema:
        return False
    connection.execute(_emptying)
    return True


def emptying(connection):
    """The statements, sent as one, that delete every row but the schema's version and start the ids
    again from 1. DELETE rather than TRUNCATE, which makes each table's files anew and has every
    other connection to the database read its catalog again: 9 ms against 340 for the 23 tables,
    on a machine running the suite. One message of several statements is one transaction."""
    # A table's rows go before those of the tables they refer to (the foreign keys hold throughout).
    deletes = [sql.SQL("DELETE FROM {}").format(sql.Identifier(name))
               for name in graphlib.TopologicalSorter(referrers(connection)).static_order()]
    restart = sql.SQL("SELECT setval(oid, 1, false) FROM pg_class "
                      "WHERE relkind = 'S' AND relnamespace = 'public'::regnamespace")
    return sql.SQL("; ").join([*deletes, restart]).as_string(connection)


def saved_rows(connection):
    """Every row but the schema's version, and where each id sequence stands, to put back with
    restore_rows into the same schema emptied (`empty`)."""
    tables = {name: connection.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(name))).fetchone()[0]
              for name in tables_but_the_version(connection)}
    rows = {}
    for name, count in tables.items():
        if count:
            with connection.cursor().copy(sql.SQL("COPY {} TO STDOUT (FORMAT BINARY)").format(
                    sql.Identifier(name))) as copy:
                rows[name] = b"".join(copy)
    sequences = connection.execute("SELECT sequencename, last_value FROM pg_sequences "
                                   "WHERE schemaname = 'public' AND last_value IS NOT NULL").fetchall()
    return rows, sequences


def restore_rows(connection, saved):
    """Put back what saved_rows saved, into the schema it came from, emptied."""
    rows, sequences = saved
    with connection.transaction():
        # A table's rows go in after those of the tables they refer to.
        for name in reversed(list(graphlib.TopologicalSorter(referrers(connection)).static_order())):
            if name in rows:
                with connection.cursor().copy(sql.SQL("COPY {} FROM STDIN (FORMAT BINARY)").format(
                        sql.Identifier(name))) as copy:
                    copy.write(rows[name])
        for name, last_value in sequences:
            connection.execute("SELECT setval(%s, %s)", (sql.Identifier(name).as_string(connection), last_value))


def referrers(connection):
    """{table: the other tables whose foreign keys refer to it}, for every table but the version's."""
    found = {name: set() for name in tables_but_the_version(connection)}
    for referrer, referred in connection.execute(
            "SELECT referrer.relname, referred.relname FROM pg_constraint "
            "JOIN pg_class referrer ON referrer.oid = conrelid JOIN pg_class referred ON referred.oid = confrelid "
            "WHERE contype = 'f' AND connamespace = 'public'::regnamespace AND conrelid <> confrelid"):
        if referrer in found and referred in found:
            found[referred].add(referrer)
    return found


def schema_of(connection):
    """The schema's fingerprint and its version's rows, or None where a test dropped the version."""
    fingerprint = connection.execute(SCHEMA_FINGERPRINT).fetchone()[0]
    if connection.execute("SELECT to_regclass(%s)", (f"public.{BUILT_ROWS}",)).fetchone()[0] is None:
        return None
    return fingerprint, connection.execute(f"SELECT array_agg(version) FROM {BUILT_ROWS}").fetchone()[0]


def tables_but_the_version(connection):
    return [name for name, in connection.execute(
        "SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND tablename <> %s", (BUILT_ROWS,))]


def postgres_url_of(database):
    return ADMIN_URL._replace(path=f"/{database}").geturl()


def session_database():
    return _session_database


def drop_session_database():
    if _keeper is not None:
        _keeper.close()
    if _created:
        with admin_connection() as connection:
            connection.execute(f"DROP DATABASE IF EXISTS {_session_database} WITH (FORCE)")


def redis_database():
    """Return the URL of this process's Redis database as it is: the worker's database on the Redis of
    TEST_REDIS_URL, or else database 0 of a redis-server this process starts the first time (stopped
    by stop_redis, or by the kernel when the process ends first)."""
    global _private_redis
    if GIVEN_REDIS_URL:
        given = urlsplit(GIVEN_REDIS_URL)
        first = int(given.path.strip("/") or 0)
        if WORKER > first:
            workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", WORKER + 1))
            pytest.fail(f"TEST_REDIS_URL names database {first}, and each pytest-xdist worker takes one, counting "
                        f"down from it: gw{WORKER} has none. Name database {workers - 1} or higher.")
        require("Redis", redis_address(GIVEN_REDIS_URL))
        return given._replace(path=f"/{first - WORKER}").geturl()
    if _private_redis is None:
        # Imported here: privateservers imports this module.
        from privateservers import PrivateRedis

        _private_redis = PrivateRedis()
    return _private_redis.url


def redis_url():
    """Return the URL of this process's Redis database, emptied for the test."""
    import redis

    url = redis_database()
    redis.Redis.from_url(url).flushdb()
    return url


def stop_redis():
    """Stop this process's own redis-server, if it started one."""
    global _private_redis
    if _private_redis is not None:
        _private_redis.close()
        _private_redis = None


def redis_address(url):
    """(host, port) of the Redis server a URL names."""
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 6379


def via(url, port):
    """The URL reached through 127.0.0.1:port (a TcpProxy in front of its server): the same user,
    password and database."""
    parts = urlsplit(url)
    credentials, _, _ = parts.netloc.rpartition("@")
    return parts._replace(netloc=f"{credentials}@127.0.0.1:{port}" if credentials else f"127.0.0.1:{port}").geturl()
