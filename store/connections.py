"""How each process opens and reuses its database connection: a pool for PostgreSQL, one shared
connection a worker for SQLite (whose calls never yield under gevent), with the files kept private."""

import logging
import os
import sys
import time
from urllib.parse import urlparse

from peewee import OperationalError, SqliteDatabase
from playhouse.db_url import connect

from store import pgdriver

log = logging.getLogger(__name__)

POOL_SIZE = 10
POOL_WAIT_SECONDS = 10
SQLITE_PRAGMAS = {"journal_mode": "wal", "busy_timeout": 5000, "foreign_keys": 1}
STARTUP_LOCK_SECONDS = 10


def greenlets_share_thread():
    """Return True when gevent has patched threading, so every request runs in one OS thread."""
    monkey = sys.modules.get("gevent.monkey")
    return monkey is not None and monkey.is_module_patched("threading")


def open_database(url):
    """Return a peewee database for a playhouse.db_url URL, set up for this process."""
    if url.startswith(("postgres", "psycopg")):
        pgdriver.load_driver()
    if url.startswith(("postgres://", "postgresql://")):
        # A pool hands each request a warm connection and teardown returns it. Greenlets beyond
        # POOL_SIZE wait for one, so 8 workers stay within PostgreSQL's default 100 connections.
        url = url.replace("://", "+pool://", 1)
        return connect(url, max_connections=POOL_SIZE, timeout=POOL_WAIT_SECONDS, stale_timeout=300)
    if url.startswith("sqlite"):
        protect_sqlite_files(urlparse(url).path[1:])
        # Under gevent all greenlets share one connection: SQLite calls never yield, so no
        # two greenlets can interleave inside a statement or a transaction. With real
        # threads (the CLI, Flask's test client) each thread keeps its own connection.
        shared = greenlets_share_thread()
        # Every transaction takes the write lock at BEGIN, waiting on busy_timeout: a deferred one
        # that reads before it writes is refused at once ("database is locked") when another
        # process wrote in between, since its snapshot is then stale.
        return connect(
            url,
            pragmas=SQLITE_PRAGMAS,
            lock_type="IMMEDIATE",
            thread_safe=not shared,
            check_same_thread=not shared,
        )
    return connect(url)


def connect_at_start(database, seconds=STARTUP_LOCK_SECONDS):
    """Connect once, trying again while a new SQLite file is locked: workers that start together
    race to switch it to WAL, and SQLite refuses the losers at once instead of waiting."""
    if not isinstance(database, SqliteDatabase):
        return
    deadline = time.monotonic() + seconds
    while True:
        try:
            with database.connection_context():
                return
        except OperationalError as error:
            if "locked" not in str(error) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def protect_sqlite_files(path):
    """Make the database file (created here if new) and its -wal and -shm files readable by their
    owner only: they hold emails and password hashes. SQLite gives -wal and -shm the database
    file's mode."""
    if not path or path == ":memory:" or path.startswith("file:"):
        return
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        pass
    except OSError:
        return  # no such folder, or not writable: SQLite will say so in its own words
    if os.name == "nt":
        return  # no mode bits to set (chmod sets only read-only); the folder's access list rules
    for name in (path, f"{path}-wal", f"{path}-shm"):
        try:
            if os.stat(name).st_mode & 0o077:
                os.chmod(name, 0o600)
        except FileNotFoundError:
            pass
        except OSError as error:
            log.warning("%s is readable by other users and cannot be made private: %s", name, error)


def discard_connection(database):
    """Close a pooled connection rather than give it back: an interrupted query may have left it
    mid-conversation. SQLite's shared connection stays: its calls cannot be interrupted."""
    if not isinstance(database, SqliteDatabase) and not database.is_closed():
        database.manual_close()
