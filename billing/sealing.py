"""The usage clock: an hour is read for billing only once no usage write can still add to it.

The usage flush takes its time before its transaction, so a transaction that began just before an
hour ended, or whose process stalled, could commit into that hour after it was read. Sealing
moves the clock forward while no flush transaction is under way (SQLite: the write lock;
PostgreSQL: an advisory lock every flush transaction shares and sealing takes alone), and each
flush transaction reads the clock: a count taken before the sealed time is written into the
oldest open hour instead. Nothing is lost, and a read hour never grows."""

from peewee import PostgresqlDatabase

from billing.models import USAGE_CLOCK, BillingClock
from models import db, start_of_hour
from store.writelock import write_transaction

# Any constant of its own: apart from the schema's and the key imports' advisory locks.
SEAL_LOCK_ID = 0x62696C6C


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
    the start of the oldest open hour. The clock never goes back."""
    through = start_of_hour(moment)
    database = db.obj
    with write_transaction(database):
        if isinstance(database, PostgresqlDatabase):
            database.execute_sql("SELECT pg_advisory_xact_lock(%s)", (SEAL_LOCK_ID,))
        BillingClock.insert(name=USAGE_CLOCK, sealed_through=through).on_conflict_ignore().execute()
        (BillingClock.update(sealed_through=through)
         .where((BillingClock.name == USAGE_CLOCK) & (BillingClock.sealed_through < through)).execute())
        return BillingClock.get(BillingClock.name == USAGE_CLOCK).sealed_through
