"""What the service's two outboxes (webhook messages, mails) share: rows written in the transaction
of their cause, each claimed for one attempt at a time across every worker and instance by a
lease, tried again on a schedule, and given back when a stop cuts an attempt short."""

import datetime

from peewee import PostgresqlDatabase, SqliteDatabase

from store.connections import greenlets_share_thread
from store.writelock import write_transaction

# What an attempt leads to: done, due again after the schedule's next pause, or given up.
SUCCEEDED, RETRY, GIVEN_UP = "succeeded", "retry", "given_up"


def claim_transaction(database):
    """A write transaction that takes SQLite's write lock at its start, in a gevent worker or not
    (the CLI): two processes never read the same due rows and both claim them."""
    if isinstance(database, SqliteDatabase) and not greenlets_share_thread():
        return database.atomic("IMMEDIATE")
    return write_transaction(database)


def lock_due(database, model, ids, due):
    """Of ids, those still due, locked on PostgreSQL with SKIP LOCKED (processes claiming at once
    take different rows); on SQLite the claim's transaction already holds the write lock."""
    if ids and isinstance(database, PostgresqlDatabase):
        return [pk for pk, in model.select(model.id).where(model.id.in_(ids) & due)
                .for_update(skip_locked=True).tuples()]
    return ids


def lease(model, ids, due, now, seconds, **marks):
    """Count an attempt of each row and make it due again only after the lease, should its process
    die before recording the attempt; marks: other columns to set with it."""
    (model.update(next_attempt_at=now + datetime.timedelta(seconds=seconds), attempts=model.attempts + 1, **marks)
     .where(model.id.in_(ids) & due).execute())


def after_attempt(number, schedule, succeeded, now):
    """(SUCCEEDED, None), (RETRY, when the next attempt is due) or (GIVEN_UP, None) once attempt
    number `number` (from 1) has ended and the schedule of pauses is spent."""
    if succeeded:
        return SUCCEEDED, None
    if number <= len(schedule):
        return RETRY, now + datetime.timedelta(seconds=schedule[number - 1])
    return GIVEN_UP, None


def give_back(model, claims, pending, now, **marks):
    """Make rows whose attempt a stop cut short due again at once, that attempt not counted;
    claims: (primary key, attempt number) pairs; marks: other columns to set with it. A row whose
    attempt was recorded just before the cut is left as it is."""
    for pk, number in claims:
        (model.update(next_attempt_at=now, attempts=model.attempts - 1, **marks)
         .where((model.id == pk) & (model.attempts == number) & (model.state == pending)).execute())
