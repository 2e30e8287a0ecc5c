"""The usage clock: an hour is read for billing only once no usage write can still add to it.

The usage flush takes its time before its transaction, so a transaction that began just before an
hour ended, or whose process stalled, could commit into that hour after it was read. Sealing
moves the clock forward while no flush transaction is under way (SQLite: the write lock;
PostgreSQL: an advisory lock every flush transaction shares and sealing takes alone), and each
flush transaction reads the clock: a count taken before the sealed time is written into the
oldest open hour instead. Nothing is lost, and a read hour never grows."""

import time

from peewee import PostgresqlDatabase

from billing.models import USAGE_CLOCK, BillingClock
from models import db, start_of_hour
from store.writelock import write_transaction

# Any constant of its own: apart from the schema's and the key imports' advisory locks.
SEAL_LOCK_ID = 0x62696C6C
SEAL_WAIT_SECONDS = 5
SEAL_RETRY_SECONDS = 0.05


def open_hour(database, used_at):
    """Inside a usage flush's transaction: when its counts are written, used_at or, when used_at's
    hour is sealed, the start of the oldest open hour."""
    if isinstance(database, PostgresqlDatabase):
        database.execute_sql("SELECT pg_advisory_xact_lock_shared(%s)", (SEAL_LOCK_ID,))
    clock = BillingClock.get_or_none(BillingClock.name == USAGE_CLOCK)
    if clock is not None and used_at < clock.sealed_through:
        return clock.sealed_through
    return used_at


def seal(moment):
    """Seal every hour that ended by `moment`, once the flushes under way have committed; return
    the start of the oldest open hour. The clock never goes back. On PostgreSQL the lock is tried,
    not waited for: a waiting exclusive lock would queue every flush behind one slow flush, so
    while one holds it past SEAL_WAIT_SECONDS the clock stays where it was, until the next close."""
    through = start_of_hour(moment)
    database = db.obj
    with write_transaction(database):
        if isinstance(database, PostgresqlDatabase) and not taken_soon(database):
            return sealed_through()
        BillingClock.insert(name=USAGE_CLOCK, sealed_through=through).on_conflict_ignore().execute()
        (BillingClock.update(sealed_through=through)
         .where((BillingClock.name == USAGE_CLOCK) & (BillingClock.sealed_through < through)).execute())
        return sealed_through()


def taken_soon(database):
    deadline = time.monotonic() + SEAL_WAIT_SECONDS
    while not database.execute_sql("SELECT pg_try_advisory_xact_lock(%s)", (SEAL_LOCK_ID,)).fetchone()[0]:
        if time.monotonic() >= deadline:
            return False
        time.sleep(SEAL_RETRY_SECONDS)
    return True


def sealed_through():
    """The start of the oldest hour still open to usage writes (None before the first seal)."""
    clock = BillingClock.get_or_none(BillingClock.name == USAGE_CLOCK)
    return clock and clock.sealed_through
