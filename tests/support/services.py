"""PostgreSQL and Redis for the tests: the machine's servers, each test run in its own database.
Where a server is unreachable the tests that need it skip, except under CI=true, where they fail."""

import contextlib
import os
import socket
import sqlite3
import uuid
from urllib.parse import urlsplit

import psycopg
import pytest

# The PostgreSQL server where each test run makes (and drops) its own database, reached through
# this URL's database; and the Redis database the tests empty.
ADMIN_URL = urlsplit(os.environ.get("TEST_DATABASE_URL") or "postgresql://postgres@127.0.0.1:5432/test")
# Each pytest-xdist worker (gw0, gw1, ...) empties a Redis database of its own: 15, 14, ...
REDIS_DB = 15 - int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0) % 16
REDIS_URL = os.environ.get("TEST_REDIS_URL") or f"redis://127.0.0.1:6379/{REDIS_DB}"
POSTGRES = (ADMIN_URL.hostname or "127.0.0.1", ADMIN_URL.port or 5432)
REDIS = (urlsplit(REDIS_URL).hostname or "127.0.0.1", urlsplit(REDIS_URL).port or 6379)
_session_database = f"apitest_{uuid.uuid4().hex[:12]}"
_created = False


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
    global _created
    require("PostgreSQL", POSTGRES)
    if not _created:
        with admin_connection() as connection:
            connection.execute(f"CREATE DATABASE {_session_database}")
        _created = True
    url = postgres_url_of(_session_database)
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute("DROP SCHEMA public CASCADE")
        connection.execute("CREATE SCHEMA public")
    return url


def postgres_url_of(database):
    return ADMIN_URL._replace(path=f"/{database}").geturl()


def session_database():
    return _session_database


def drop_session_database():
    if _created:
        with admin_connection() as connection:
            connection.execute(f"DROP DATABASE IF EXISTS {_session_database} WITH (FORCE)")


def redis_url():
    """Return the URL of a Redis database emptied for the test."""
    import redis

    require("Redis", REDIS)
    redis.Redis.from_url(REDIS_URL).flushdb()
    return REDIS_URL
