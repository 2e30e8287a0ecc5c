"""A write transaction that, on SQLite under gevent, waits for another process's write lock by
letting the worker's other greenlets run. SQLite's own busy handler sleeps in C, and with every
greenlet of a worker on one thread it stops every request meanwhile: while `db prune` deleted a
million rows in another process, each batch's lock held the worker's once-a-second usage flush,
and a request's p99 doubled."""

import contextlib
import time

from peewee import OperationalError, SqliteDatabase

from store.connections import SQLITE_PRAGMAS, greenlets_share_thread

RETRY_SECONDS = 0.005
BUSY_TIMEOUT_MS = SQLITE_PRAGMAS["busy_timeout"]


@contextlib.contextmanager
def write_transaction(database):
    """database.atomic(), its write lock taken at the start; on SQLite under gevent, without
    blocking the worker while another process holds it (for at most busy_timeout)."""
    if not isinstance(database, SqliteDatabase) or not greenlets_share_thread():
        with database.atomic():
            yield
        return
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while True:
        transaction = database.atomic("IMMEDIATE")
        # Never yields between these statements, so no other greenlet sees the connection
        # without its busy timeout.
        database.execute_sql("PRAGMA busy_timeout = 0")
        try:
            transaction.__enter__()
            break
        except OperationalError as error:
            if "locked" not in str(error) or time.monotonic() >= deadline:
                raise
        finally:
            database.execute_sql(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        time.sleep(RETRY_SECONDS)
    with contextlib.ExitStack() as taken:
        taken.push(transaction)
        yield
