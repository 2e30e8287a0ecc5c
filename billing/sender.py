"""Each serving process's billing sender: it closes ended hours once a minute (one process of all,
under the maintenance lock), claims due events from the outbox (store/outbox.py's lease, so each
is sent by one process at a time), sends them in calls of the target's size in greenlets of their
own, and records each call: accepted, due again on BILLING_RETRY_SCHEDULE (or after a 429's
Retry-After), or given up and logged with the system's error. A stop or crash delays an event,
never drops it; its identifier makes a second send harmless."""

import collections
import datetime
import logging
import random
import time

import gevent
import gevent.event
import gevent.pool
from peewee import PostgresqlDatabase, fn

from billing import closing, targets
from billing.models import FAILED, PENDING, SENT, BillingEvent
from metering import lifecycle
from models import db, release_connection, utcnow
from ops import metrics, services
from orgs import organisations
from settings.billing import billing_retry_schedule
from store import outbox
from store.writelock import write_transaction

log = logging.getLogger(__name__)

POLL_SECONDS = 1.0
CLOSE_EVERY_SECONDS = 60
FIRST_CLOSE_SECONDS = (2, 10)
GAUGE_EVERY_SECONDS = 15
# Calls a process makes at once.
CONCURRENCY = 4
LEASE_SECONDS = targets.TIMEOUT_SECONDS + 10
STOP_WAIT_SECONDS = 5
# Any constant of its own: claims of all processes one at a time on PostgreSQL, so that two never
# both start a call for the same Stripe customer and meter.
CLAIM_LOCK_ID = 0x62696C63


def claim(target, calls, now=None):
    """Claim the events of up to `calls` calls, the oldest hours first; return them as lists, one a
    call. Stripe's calls carry one event each, and none for a customer and meter with a call under
    way in any process."""
    now = now or utcnow()
    due = (BillingEvent.state == PENDING) & (BillingEvent.next_attempt_at <= now) & (BillingEvent.target == target)
    size = targets.batch_size(target)
    database = db.obj
    with outbox.claim_transaction(database):
        if isinstance(database, PostgresqlDatabase):
            database.execute_sql("SELECT pg_advisory_xact_lock(%s)", (CLAIM_LOCK_ID,))
        query = (BillingEvent.select(BillingEvent.id, BillingEvent.customer, BillingEvent.meter).where(due)
                 .order_by(BillingEvent.hour, BillingEvent.id))
        if target == "stripe":
            busy = set(BillingEvent.select(BillingEvent.customer, BillingEvent.meter)
                       .where((BillingEvent.state == PENDING) & (BillingEvent.sending_until > now)).tuples())
            ids = []
            for pk, customer, meter in query.limit(calls * 20).tuples():
                if (customer, meter) not in busy and len(ids) < calls:
                    busy.add((customer, meter))
                    ids.append(pk)
        else:
            ids = [pk for pk, _, _ in query.limit(calls * size).tuples()]
        if not ids:
            return []
        lease_ends = now + datetime.timedelta(seconds=LEASE_SECONDS)
        outbox.lease(BillingEvent, ids, due, now, LEASE_SECONDS, sending_until=lease_ends)
        # Only the rows this lease took: one recorded meanwhile by a process whose lease had ended is not sent again.
        rows = list(BillingEvent.select().where(BillingEvent.id.in_(ids) & (BillingEvent.state == PENDING)
                                                & (BillingEvent.sending_until == lease_ends))
                    .order_by(BillingEvent.hour, BillingEvent.id))
    return [rows[start:start + size] for start in range(0, len(rows), size)]


def record(rows, outcome, schedule, now=None):
    """Record one call's answer for each of its events, each by its own attempt's number; return
    the state the events not stored before took (None when they were claimed again after this
    attempt's lease ended)."""
    now = now or utcnow()
    stored_before = [row for index, row in enumerate(rows) if index in outcome.already]
    rows = [row for index, row in enumerate(rows) if index not in outcome.already]
    error = outcome.error and outcome.error[:targets.ERROR_CHARACTERS]
    changes = {}
    with write_transaction(db.obj):
        sent = sum(mark(row, state=SENT, next_attempt_at=None, sending_until=None, sent_at=now, error=None)
                   for row in stored_before)
        for row in rows:
            changes[row.id] = row_changes(row, outcome, schedule, now)
            changes[row.id].update(error=error)
        updated = collections.Counter(changes[row.id]["state"] for row in rows if mark(row, **changes[row.id]))
    sent += updated[SENT]
    if sent:
        metrics.billing_sent(sent)
    if updated[FAILED]:
        metrics.billing_failed(updated[FAILED])
    if not rows:
        return SENT if sent else None
    if not updated:
        return None
    first = rows[0]
    state, next_at = changes[first.id]["state"], changes[first.id]["next_attempt_at"]
    if updated[FAILED]:
        log.warning("Gave up sending %d billing events (the first %s, hour %s) after their attempts: %s",
                    updated[FAILED], first.identifier, first.hour.strftime("%Y-%m-%d %H:00"), outcome.error)
    if outcome.limited:
        log.info("The billing system refused a call for its rate (event %s); the next in %d s.", first.identifier,
                 outcome.wait)
    elif state == PENDING and outcome.wait is None:
        log.info("Could not send %d billing events (the first %s, attempt %d): %s; trying again at %s UTC.",
                 len(rows), first.identifier, first.attempts, outcome.error, next_at.strftime("%H:%M:%S"))
    return state


def row_changes(row, outcome, schedule, now):
    """What an answer makes of one event of the call."""
    if outcome.wait is not None:
        # The system asks for time (a 429), or to send the rest again without what it had: not a
        # failed attempt, so the schedule is not spent on it. After a 429 the customer and meter
        # stay busy until then, so that Stripe's next hour for them waits too.
        next_at = now + datetime.timedelta(seconds=outcome.wait)
        return {"state": PENDING, "next_attempt_at": next_at, "attempts": BillingEvent.attempts - 1,
                "sending_until": next_at if outcome.limited else None}
    step, next_at = outbox.after_attempt(row.attempts, schedule, outcome.accepted, now)
    if outcome.final:
        step, next_at = outbox.GIVEN_UP, None
    state = {outbox.SUCCEEDED: SENT, outbox.RETRY: PENDING, outbox.GIVEN_UP: FAILED}[step]
    changes = {"state": state, "next_attempt_at": next_at, "sending_until": None}
    return {**changes, "sent_at": now} if state == SENT else changes


def mark(row, **changes):
    """Update the row if this process's claim of it still holds: 1, else 0."""
    return (BillingEvent.update(**changes)
            .where((BillingEvent.id == row.id) & (BillingEvent.attempts == row.attempts)).execute())


def attempt(system, schedule, rows, now=None):
    """Send one claimed call and record it; return the events' state."""
    now = now or utcnow()
    release_connection()  # not held through the call
    outcome = None
    # The whole call, within the lease: a system that drips its answer would otherwise hold a slot
    # past it, and another process would send the events again.
    with gevent.Timeout(targets.TIMEOUT_SECONDS, False):
        outcome = system.send(rows, now)
    if outcome is None:
        outcome = targets.Outcome(False, error=f"No answer within {targets.TIMEOUT_SECONDS} s.")
    return record(rows, outcome, schedule)


def send_due(app, calls=CONCURRENCY, rounds=2):
    """Claim and send the due events here, one call after another, until none is due or an event
    comes round a third time (given back, not sent); return [(rows, state)]. Tests use it;
    servers use Sender."""
    system = targets.BillingSystem(app.config)
    schedule = app.extensions["billing"]
    done, seen = [], collections.Counter()
    while True:
        with app.app_context():
            claimed = claim(system.target, calls)
            rows = [row for call in claimed for row in call]
            seen.update(row.id for row in rows)
            if any(seen[row.id] > rounds for row in rows):
                with write_transaction(db.obj):
                    outbox.give_back(BillingEvent, [(row.id, row.attempts) for row in rows], PENDING, utcnow(),
                                     sending_until=None)
                claimed = []
            release_connection()
        if not claimed:
            return done
        for call in claimed:
            with app.app_context():
                try:
                    done.append((call, attempt(system, schedule, call)))
                finally:
                    release_connection()


def due_exists(target, now=None):
    return (BillingEvent.select(BillingEvent.id)
            .where((BillingEvent.next_attempt_at <= (now or utcnow())) & (BillingEvent.target == target)
                   & (BillingEvent.state == PENDING)).limit(1).exists())


def oldest_pending_seconds(target, now=None):
    """Seconds since the end of the oldest hour with an event of target not yet accepted; 0 with none."""
    now = now or utcnow()
    oldest = (BillingEvent.select(fn.MIN(BillingEvent.hour))
              .where((BillingEvent.state == PENDING) & (BillingEvent.target == target)).scalar())
    if oldest is None:
        return 0
    oldest = BillingEvent.hour.python_value(oldest)
    return max(0.0, (now - oldest - closing.HOUR).total_seconds())


def forget_old(config, now=None):
    """Delete the accepted and given-up events of hours past USAGE_HOURLY_RETENTION_DAYS, in
    batches: as long as an hour's usage rows are kept, so are its events, and `billing resend`
    can never make one that was accepted again. Return how many."""
    cutoff = (now or utcnow()) - datetime.timedelta(days=config["USAGE_HOURLY_RETENTION_DAYS"])
    return lifecycle.delete_in_batches(BillingEvent, BillingEvent.id, (BillingEvent.state != PENDING)
                                       & (BillingEvent.hour < cutoff), lifecycle.PAUSE_SECONDS)


class Sender:
    """A greenlet that looks at the outbox every POLL_SECONDS, closes hours once a minute when it
    wins the lock, and sends each claimed call in a greenlet of the pool. Started and stopped with
    the app's services."""

    def __init__(self, app, schedule, interval=POLL_SECONDS):
        self.app = app
        self.schedule = schedule
        self.interval = interval
        self.system = targets.BillingSystem(app.config)
        self.pool = gevent.pool.Pool(CONCURRENCY)
        self.in_flight = {}
        self.stopped = False
        self.wake = gevent.event.Event()
        self.greenlet = None
        self.closer = None
        self.close_at = time.monotonic() + random.uniform(*FIRST_CLOSE_SECONDS)
        self.gauge_at = time.monotonic()

    def start(self):
        if self.greenlet is None:
            self.greenlet = gevent.spawn(self.run)

    def run(self):
        while not self.stopped:
            claimed = []
            try:
                self.close_when_due()
                with self.app.app_context():
                    if time.monotonic() >= self.gauge_at:
                        self.gauge_at = time.monotonic() + GAUGE_EVERY_SECONDS
                        metrics.billing_oldest_pending(oldest_pending_seconds(self.system.target))
                    free = self.pool.free_count()
                    if free and not self.system.paused() and due_exists(self.system.target):
                        claimed = claim(self.system.target, free)
            except Exception:
                log.exception("Could not claim billing events from the outbox; trying again in %s s.", self.interval)
            finally:
                release_connection()
            for rows in claimed:
                self.in_flight[rows[0].id] = rows
                self.pool.spawn(self.attempt, rows)
            self.wake.wait(self.interval * random.uniform(0.8, 1.0))
            self.wake.clear()

    def close_when_due(self):
        """Close hours in a greenlet of its own once a minute, so that a long catch-up never holds up the sends."""
        if time.monotonic() < self.close_at or (self.closer is not None and not self.closer.dead):
            return
        self.close_at = time.monotonic() + CLOSE_EVERY_SECONDS
        self.closer = gevent.spawn(self.close_hours)

    def close_hours(self):
        with self.app.app_context():
            try:
                if lifecycle.take_lock(CLOSE_EVERY_SECONDS - 5, name=closing.LOCK_NAME):
                    closing.close(self.app.config)
                    forget_old(self.app.config)
            except Exception:
                log.exception("Could not close the ended hours for billing; trying again in %d s.",
                              CLOSE_EVERY_SECONDS)
            finally:
                release_connection()

    def attempt(self, rows):
        try:
            with self.app.app_context():
                attempt(self.system, self.schedule, rows)
        except Exception:
            log.exception("Could not record a call of %d billing events; they are sent again after their lease.",
                          len(rows))
        finally:
            release_connection()
            self.in_flight.pop(rows[0].id, None)
            # A slot is free: the next call goes now, not at the next poll (Stripe's calls carry
            # one event each, and a poll a second would cap a process at 4 of them a second).
            self.wake.set()

    def close(self):
        """Stop claiming; let the calls under way finish for up to STOP_WAIT_SECONDS, then cut the
        rest, each due again at once (the next process to start sends it)."""
        self.stopped = True
        self.wake.set()
        for greenlet in (self.greenlet, self.closer):
            if greenlet is not None:
                greenlet.kill(block=False)
        self.pool.join(timeout=STOP_WAIT_SECONDS)
        cut = [row for rows in self.in_flight.values() for row in rows]
        self.pool.kill(block=True, timeout=1)
        if cut:
            with self.app.app_context():
                try:
                    with write_transaction(db.obj):
                        outbox.give_back(BillingEvent, [(row.id, row.attempts) for row in cut], PENDING, utcnow(),
                                         sending_until=None)
                except Exception:
                    log.exception("Could not give back %d billing events; each is sent after its lease.", len(cut))
                finally:
                    release_connection()


def init_app(app):
    """When BILLING_EXPORT is on: the sender, started with the app's services, and the usage
    flush's clock check (app.py hands billing/sealing.py's open_hour to metering/usage.py). A
    deleted organisation's last hours are written before its keys go."""
    schedule = billing_retry_schedule(app.config["BILLING_RETRY_SCHEDULE"])
    app.extensions["billing"] = schedule
    organisations.organisations_deleted.connect(closing.close_deleted)
    if app.config["BILLING_EXPORT"] != "off":
        services.register(app, "billing", Sender(app, schedule))
