"""The data life cycle: hourly and daily usage rows past their retention, keys revoked or expired
long ago (with their usage rows) and expired sessions are deleted in small batches, and TOTP
set-ups past their life discarded, by one process of all workers and instances at a time, in the
background of every run mode and on demand."""

import datetime
import logging
import random
import threading
import time

from accounts import sessions, twofactor
from models import ApiKey, MaintenanceLock, Session, UsageDay, UsageHour, UsageWriter, db, release_connection, utcnow
from ops import services
from store.writelock import write_transaction

log = logging.getLogger(__name__)

# Rows deleted per transaction: each batch is a few milliseconds of SQLite's single writer, so a
# request waiting to write waits no longer than that.
BATCH = 500
# Keys deleted per transaction, each with its usage rows.
KEY_BATCH = 20
# Between batches the pruner lets requests run (under gevent, a sleep yields to them).
PAUSE_SECONDS = 0.02
# Seconds between background prunes of the whole service; each worker tries, one wins the lock.
INTERVAL_SECONDS = 3600
# The first try comes this many seconds (at random, so workers spread out) after a process starts serving.
FIRST_TRY_SECONDS = (2, 10)
LOCK_NAME = "prune"


class Pruned(dict):
    """What a prune deleted, by kind of row."""

    def sentence(self):
        return (f"Deleted {self['hourly']} hourly usage rows, {self['daily']} daily usage rows, "
                f"{self['keys']} revoked or expired keys and {self['sessions']} expired sessions.")


def prune(config, now=None, pause=0):
    """Delete what the retention settings say is past its time; return Pruned."""
    now = now or utcnow()
    pruned = Pruned(hourly=0, daily=0, keys=0, sessions=0)
    hourly_cutoff = now - datetime.timedelta(days=config["USAGE_HOURLY_RETENTION_DAYS"])
    daily_cutoff = (now - datetime.timedelta(days=config["USAGE_DAILY_RETENTION_DAYS"])).date()
    key_cutoff = now - datetime.timedelta(days=config["REVOKED_KEY_RETENTION_DAYS"])
    # Every hourly count is in its day already (metering/usage.py writes both), so old hours are only deleted.
    pruned["hourly"] += delete_in_batches(UsageHour, UsageHour.id, UsageHour.hour < hourly_cutoff, pause)
    pruned["daily"] += delete_in_batches(UsageDay, UsageDay.id, UsageDay.day < daily_cutoff, pause)
    gone = (ApiKey.revoked_at <= key_cutoff) | (ApiKey.expires_at <= key_cutoff)
    while key_ids := [key.id for key in ApiKey.select(ApiKey.id).where(gone).limit(KEY_BATCH)]:
        pruned["hourly"] += delete_in_batches(UsageHour, UsageHour.id, UsageHour.api_key.in_(key_ids), pause)
        pruned["daily"] += delete_in_batches(UsageDay, UsageDay.id, UsageDay.api_key.in_(key_ids), pause)
        with write_transaction(db.obj):
            # Checked again: a key cannot come back to life, but its expiry can be read before a change.
            pruned["keys"] += ApiKey.delete().where(ApiKey.id.in_(key_ids) & gone).execute()
        time.sleep(pause)
    idle = Session.last_seen_at < sessions.idle_cutoff()
    pruned["sessions"] += delete_in_batches(Session, Session.token_hash, idle, pause)
    # A process's last write of usage counts matters only while it runs (metering/usage.py).
    delete_in_batches(UsageWriter, UsageWriter.writer, UsageWriter.written_at < now - datetime.timedelta(days=1),
                      pause)
    with write_transaction(db.obj):
        twofactor.discard_old_setups(now)
    release_connection()
    return pruned


def delete_in_batches(model, key, condition, pause):
    """Delete the model's rows that meet condition, BATCH per transaction; return how many."""
    deleted = 0
    while True:
        with write_transaction(db.obj):
            batch = model.select(key).where(condition).limit(BATCH)
            count = model.delete().where(key.in_(batch)).execute()
        release_connection()
        deleted += count
        if count < BATCH:
            return deleted
        time.sleep(pause)


def take_lock(seconds, now=None, name=LOCK_NAME):
    """True when this process may run the periodic job `name` (pruning, unless named) for the next
    `seconds`: no other holds its lock."""
    now = now or utcnow()
    with write_transaction(db.obj):
        MaintenanceLock.insert(name=name, until=now).on_conflict_ignore().execute()
        taken = (MaintenanceLock.update(until=now + datetime.timedelta(seconds=seconds))
                 .where((MaintenanceLock.name == name) & (MaintenanceLock.until <= now)).execute())
    return taken == 1


class Pruner:
    """The background prune of one process, started with the app's services once it serves (so in
    every run mode: gunicorn's workers and the one-process server alike)."""

    def __init__(self, app, interval=INTERVAL_SECONDS, first_try=FIRST_TRY_SECONDS):
        self.app = app
        self.interval = interval
        self.first_try = first_try
        self.stopped = threading.Event()
        self.thread = None

    def start(self):
        if self.thread is None:
            self.thread = threading.Thread(target=self.run, daemon=True, name="pruner")
            self.thread.start()

    def run(self):
        wait = random.uniform(*self.first_try)
        while not self.stopped.wait(wait):
            wait = self.interval
            try:
                with self.app.app_context():
                    if take_lock(self.interval):
                        pruned = prune(self.app.config, pause=PAUSE_SECONDS)
                        log.info("Pruned: %s", pruned.sentence())
            except Exception:
                log.exception("Could not prune old rows; the next try comes in %d s.", self.interval)
            finally:
                release_connection()

    def close(self):
        """Stop the background prune after the one under way, if any."""
        self.stopped.set()


def init_app(app):
    pruner = app.extensions["lifecycle"] = Pruner(app)
    services.register(app, "lifecycle", pruner)
