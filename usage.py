"""Per-key usage counts: kept in memory by each request and written to the database (lifetime
and per-hour counts) once a second, in one transaction."""

import collections
import logging
import threading
import time

from flask import current_app

import metrics
from models import db, release_connection, start_of_hour, utcnow

log = logging.getLogger(__name__)

FLUSH_INTERVAL = 1.0


class UsageCounter:
    """Counts requests per key in memory and adds them to the database (lifetime and per-hour
    counts) in one transaction at most FLUSH_INTERVAL later, so no request pays for a write."""

    def __init__(self, database, interval=FLUSH_INTERVAL):
        self.database = database
        self.interval = interval
        self.pending = collections.Counter()
        self.pending_lock = threading.Lock()
        self.flush_lock = threading.Lock()
        self.stopped = threading.Event()
        self.flusher = None

    def add(self, key_id):
        """Count one request for the key."""
        with self.pending_lock:
            self.pending[key_id] += 1
        if self.flusher is None:
            self.flusher = threading.Thread(target=self.flush_periodically, daemon=True)
            self.flusher.start()

    def total(self, key_id):
        """Return the key's lifetime count: what the database holds plus what is pending here; None
        when the key is no longer in the database."""
        with self.flush_lock:
            row = self.database.execute_sql(self.database.statements.total_requests, (key_id,)).fetchone()
            if row is None:
                return None
            with self.pending_lock:
                return row[0] + self.pending[key_id]

    def flush(self):
        """Write the pending counts in one transaction; on failure keep them for the next try."""
        with self.flush_lock:
            with self.pending_lock:
                counts, self.pending = self.pending, collections.Counter()
            if not counts:
                return
            started = time.perf_counter()
            used_at = utcnow()
            hour = start_of_hour(used_at)
            statements = self.database.statements
            try:
                with self.database.atomic():
                    for key_id, count in counts.items():
                        self.database.execute_sql(statements.add_usage, (count, used_at, key_id))
                        self.database.execute_sql(statements.add_hourly_usage, (key_id, hour, count, key_id))
            except Exception:
                with self.pending_lock:
                    self.pending.update(counts)
                raise
            finally:
                release_connection(self.database)
                metrics.usage_flushed(time.perf_counter() - started)
                with self.pending_lock:
                    waiting = sum(self.pending.values())
                metrics.usage_pending(waiting)

    def flush_periodically(self):
        while not self.stopped.wait(self.interval):
            try:
                self.flush()
            except Exception:
                log.exception("Could not write usage counts; they stay pending for the next try.")

    def close(self):
        """Stop the periodic flush and write what is pending (graceful shutdown)."""
        self.stopped.set()
        self.flush()


def init_app(app):
    app.extensions["usage"] = UsageCounter(db.obj)


def total_requests(key):
    """Return the key's exact lifetime request count, or None when the key was deleted."""
    return current_app.extensions["usage"].total(key.id)
