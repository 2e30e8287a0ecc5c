"""Per-key usage counts: kept in memory by each request (lifetime, and per endpoint and HTTP
status) and written to the database (the key's total, its hours and days) once a second, each
key's rows in one transaction."""

import collections
import logging
import random
import secrets
import threading
import time

from flask import current_app, request
from peewee import DatabaseError, __exception_wrapper__

from models import DATABASE_ERRORS, db, release_connection, start_of_hour, utcnow
from ops import metrics, note as request_note, services
from store import locks
from store.kept import KeptAnswers
from store.writelock import write_transaction

# The HTTP status recorded for a time socket's accepted handshake.
SWITCHING_PROTOCOLS = 101

log = logging.getLogger(__name__)

FLUSH_INTERVAL = 1.0
# A flush writes this many keys a transaction (~7 ms on SQLite) and yields between: a worker
# serving thousands of keys a second is not stopped for all of their rows at once.
KEYS_PER_TRANSACTION = 500
# How long a graceful stop keeps trying to write what is pending while the database refuses,
# within gunicorn's graceful_timeout (20 s), which also covers the requests still running.
CLOSE_RETRY_SECONDS = 15
# Keys whose written counts are kept between two commits: two numbers each.
WRITTEN_COUNTS_KEPT = 10_000


def pause_between_transactions():
    # Under gevent's worker, patched: a pause in which the worker polls its sockets and serves
    # the requests waiting on them (sleep(0) would run only greenlets already ready).
    time.sleep(0.001)


class UsageCounter:
    """Counts requests per key, endpoint, status and whether they were counted against the key's
    allowance, in memory, and (once started with the app's services) adds them to the database at
    most FLUSH_INTERVAL later, so no request pays for a write.

    A count leaves `pending` only once the transaction that wrote it has committed: a failed,
    interrupted or killed flush loses nothing it had not written, and writes nothing twice, even
    when the connection is lost at COMMIT (each transaction also records its number). Every
    process writes the rows of a transaction in one order (by key, then endpoint and status), so
    two processes flushing the same keys wait at most for each other's one transaction and never
    deadlock."""

    def __init__(self, database, interval=FLUSH_INTERVAL, riders=(), open_hour=None):
        self.database = database
        self.interval = interval
        # Inside each transaction, when its counts are written: open_hour(database, time taken)
        # gives the time to write them at (billing/sealing.py keeps a read hour from growing).
        self.open_hour = open_hour
        # What each flush carries in its first transaction besides the counts: objects with take(),
        # write(taken) inside the transaction and give_back(taken) when it did not commit
        # (webhooks' deferred events, which app.py hands in).
        self.riders = tuple(riders)
        self.pending = collections.Counter()
        # Held only to swap or add to the counts, never across a wait (store/locks.py).
        self.pending_lock = locks.short_lock()
        # Held for one transaction of a flush, or for total()'s read: a reader never sees a count
        # both in the database and still pending, and waits for at most one transaction.
        self.write_lock = threading.Lock()
        # One flush at a time: two would both write the counts they found pending.
        self.flush_lock = threading.Lock()
        self.stopped = threading.Event()
        self.flusher = None
        # This process's row in usage_writers, the number of its last transaction, and the one
        # whose commit is in doubt after an error, with its counts and what its riders gave it:
        # (sequence, batch, carried) or None.
        self.writer = secrets.token_hex(16)
        self.sequence = 0
        self.in_doubt = None
        # What the database holds of a key's counts, kept while nothing is committed (a flush of
        # this process or another commits every second): a keyed GET asked many times in that
        # second reads it once. Read under write_lock, as the counts pending beside it.
        self.written_counts = KeptAnswers(database, WRITTEN_COUNTS_KEPT, request_note.data_versions)

    def add(self, key_id, endpoint, status, counted, spent=False):
        """Record one request of the key; counted: it passed the key's allowance (total_requests);
        spent: it spent one of the key's credits."""
        with self.pending_lock:
            self.pending[key_id, endpoint, status, counted, spent] += 1

    def start(self):
        """Write what is pending every interval from now on, in a thread of its own; until then (a
        process that serves no one: a command, an in-process test) it is written by flush() or close()."""
        if self.flusher is None:
            self.flusher = threading.Thread(target=self.flush_periodically, daemon=True)
            self.flusher.start()

    def total(self, key_id):
        """Return the key's lifetime count: what the database holds plus what is pending here; None
        when the key is no longer in the database."""
        self.database.connect(reuse_if_open=True)  # before the lock, as in flush_pending
        with self.write_lock:
            self.settle_doubt()
            written = self.written_counts.get(("total", key_id), lambda: (self.read_total(key_id), None))
            if written is None:
                return None
            with self.pending_lock:
                return written + sum(n for (pending_id, _, _, counted, _), n in self.pending.items()
                                     if pending_id == key_id and counted)

    def read_total(self, key_id):
        row = self.database.execute_sql(self.database.statements.total_requests, (key_id,)).fetchone()
        return None if row is None else row[0]

    def credits_spent_today(self, key_id):
        """Return the credits the key spent today (UTC): what the database holds plus what is pending here."""
        self.database.connect(reuse_if_open=True)  # before the lock, as in flush_pending
        with self.write_lock:
            self.settle_doubt()
            today = utcnow().date()
            written = self.written_counts.get(("spent", key_id, today), lambda: (self.read_spent(key_id, today), None))
            with self.pending_lock:
                return written + sum(n for (pending_id, _, _, _, spent), n in self.pending.items()
                                     if pending_id == key_id and spent)

    def read_spent(self, key_id, day):
        row = self.database.execute_sql(self.database.statements.credits_spent_on, (key_id, day))
        return row.fetchone()[0] or 0

    def flush(self):
        """Write what is pending (and what the riders hand over), KEYS_PER_TRANSACTION keys a
        transaction, letting the worker's other requests run between transactions; raise the
        database's error after keeping what was not written for the next try."""
        with self.flush_lock:
            self.flush_pending()

    def flush_pending(self):
        started = time.perf_counter()
        # Taken before write_lock: a greenlet holding the lock never waits for the pool, whose
        # connections the requests waiting on the lock (total()) hold.
        self.database.connect(reuse_if_open=True)
        counts = None
        # What the riders hand over is written in the first transaction, and given back unless it committed.
        carried = []
        try:
            with self.write_lock:
                self.settle_doubt()
            with self.pending_lock:
                counts = dict(self.pending)
            carried = [(rider, rider.take()) for rider in self.riders]
            if not counts and not any(taken for _, taken in carried):
                return
            by_key = collections.defaultdict(dict)
            for entry, count in counts.items():
                by_key[entry[0]][entry] = count
            keys = sorted(by_key)
            used_at = utcnow()
            for start in range(0, max(len(keys), 1), KEYS_PER_TRANSACTION):
                if start:
                    pause_between_transactions()
                batch = {entry: count for key_id in keys[start:start + KEYS_PER_TRANSACTION]
                         for entry, count in by_key[key_id].items()}
                with self.write_lock:
                    self.sequence += 1
                    try:
                        with write_transaction(self.database):
                            if batch:
                                self.write(batch, self.open_hour(self.database, used_at)
                                           if self.open_hour else used_at)
                            for rider, taken in carried:
                                rider.write(taken)
                            self.database.execute_sql(self.database.statements.mark_usage_written,
                                                      (self.writer, self.sequence, used_at))
                    except BaseException:
                        # Also a connection lost at COMMIT, which PostgreSQL may have carried out.
                        self.in_doubt = (self.sequence, batch, carried)
                        carried = []
                        raise
                    self.written(batch)
                    carried = []
        finally:
            # Taken, but an error came before a transaction tried them.
            give_back_carried(carried)
            release_connection(self.database)
            if counts:
                metrics.usage_flushed(time.perf_counter() - started)
            with self.pending_lock:
                waiting = sum(self.pending.values())
            metrics.usage_pending(waiting)

    def written(self, batch):
        """Take a committed batch's counts out of pending (under write_lock), and forget the totals
        kept from before them: a request that looked at the commit counter before the commit (and
        holds that look) would add them to pending that no longer holds the batch."""
        with self.pending_lock:
            self.pending.subtract(batch)
            for entry in batch:
                if self.pending[entry] <= 0:
                    del self.pending[entry]
        self.written_counts.forget()

    def settle_doubt(self):
        """After a failed transaction, learn from usage_writers whether it committed after all, and
        if so take its counts out of pending; raise the database's error when it cannot tell."""
        if self.in_doubt is None:
            return
        sequence, batch, carried = self.in_doubt
        row = self.database.execute_sql(self.database.statements.usage_written, (self.writer,)).fetchone()
        if row is not None and row[0] >= sequence:
            self.written(batch)
        else:
            give_back_carried(carried)
        self.in_doubt = None

    def write(self, batch, used_at):
        """Add a batch of counts, {(key_id, endpoint, status, counted, spent): n}, to the keys'
        totals, hours and days (with the credits they spent): one statement a table, its rows in
        the order every process uses."""
        statements = self.database.statements
        hour = start_of_hour(used_at)
        totals = collections.Counter()
        breakdown = collections.Counter()
        spent_credits = collections.Counter()
        for (key_id, endpoint, status, counted, spent), count in batch.items():
            if counted:
                totals[key_id] += count
            breakdown[key_id, endpoint, status] += count
            if spent:
                spent_credits[key_id, endpoint, status] += count
        rows = sorted(breakdown.items())
        cursor = self.database.cursor()
        # peewee's own errors (OperationalError, IntegrityError, ...) from the driver's, as execute_sql gives.
        with __exception_wrapper__:
            if statements.lock_keys:
                # Every key of the batch locked first, in id order, as an account's deletion locks
                # its keys: neither then waits for a row the other holds while holding one it wants.
                cursor.execute(statements.lock_keys, (sorted({key_id for (key_id, _, _), _ in rows}),))
            if totals:
                cursor.executemany(statements.add_usage,
                                   [(count, used_at, key_id) for key_id, count in sorted(totals.items())])
            for statement, period in ((statements.add_usage_hours, hour), (statements.add_usage_days, hour.date())):
                cursor.executemany(statement, [(key_id, period, endpoint, status, count,
                                                spent_credits[key_id, endpoint, status], key_id)
                                               for (key_id, endpoint, status), count in rows])

    def flush_periodically(self):
        # Each process's own jitter keeps several processes' flushes from staying in step.
        while not self.stopped.wait(self.interval * random.uniform(0.8, 1.0)):
            try:
                self.flush()
            except Exception:
                log.exception("Could not write usage counts; they stay pending for the next try.")

    def close(self, retry_seconds=CLOSE_RETRY_SECONDS):
        """Stop the periodic flush and write what is pending (graceful shutdown), trying again
        while the database refuses, for at most retry_seconds; raise the last error after that."""
        self.stopped.set()
        deadline = time.monotonic() + retry_seconds
        while True:
            try:
                self.flush()
                return
            except (DatabaseError, *DATABASE_ERRORS):
                # Any refusal, a deadlock or a row's key deleted meanwhile included: tried again.
                if time.monotonic() >= deadline:
                    raise
                log.warning("Could not write %d pending usage counts before stopping; trying again.",
                            sum(self.pending.values()))
                time.sleep(random.uniform(0.1, 0.3))


def give_back_carried(carried):
    for rider, taken in carried:
        rider.give_back(taken)


def init_app(app, riders=(), open_hour=None):
    """The app's usage counter, carrying riders and asking open_hour (see UsageCounter);
    serving/envelope.py records each request's answer with it."""
    counter = app.extensions["usage"] = UsageCounter(db.obj, riders=riders, open_hour=open_hour)
    services.register(app, "usage", counter)


def record_handshake(key):
    """Record a time socket's accepted handshake now: its response comes only when the socket ends."""
    note = request_note.of(request.environ)
    note.usage_key_id = None
    current_app.extensions["usage"].add(key.id, request.url_rule.rule, SWITCHING_PROTOCOLS, note.counted,
                                        note.credit_spent)
    note.counted = note.credit_spent = False


def credits_spent_today(key):
    """Return the credits the key spent today (UTC), this request's included (recorded with its answer)."""
    note = request_note.current()
    return note.app.extensions["usage"].credits_spent_today(key.id) + (1 if note.credit_spent else 0)


def total_requests(key):
    """Return the key's exact lifetime request count, this request included (it is recorded with its
    answer, after the view), or None when the key was deleted."""
    note = request_note.current()
    total = note.app.extensions["usage"].total(key.id)
    if total is None:
        return None
    return total + (1 if note.counted and note.usage_key_id == key.id else 0)
