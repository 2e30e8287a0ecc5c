"""Each serving process's mail sender: it claims due mails from the outbox (store/outbox.py's
lease, so each is tried by one process at a time), sends each in a greenlet of its own, and records
the attempt: sent, due again on MAIL_RETRY_SCHEDULE, or given up and logged. No request waits for
it; a stop or a crash delays a mail, never drops it."""

import datetime
import logging
import random
import time

import gevent
import gevent.event
import gevent.pool

import settings
from mail import outbox as mail_outbox, transport
from mail.models import FAILED, PENDING, SENT, MailMessage
from models import db, release_connection, utcnow
from ops import services
from store import outbox
from store.writelock import write_transaction

log = logging.getLogger(__name__)

POLL_SECONDS = 1.0
# Mails a process sends at once: an SMTP server takes a few connections, not hundreds.
CONCURRENCY = 4
# An attempt's whole time, and the lease that must outlast it.
ATTEMPT_SECONDS = 90
LEASE_SECONDS = 120
# How long a stop waits for the mails being sent before it cuts them (each is sent again later).
STOP_WAIT_SECONDS = 5
KEPT_FOR = datetime.timedelta(days=7)
PRUNE_EVERY_SECONDS = 600


def claim(limit, now=None):
    """Claim up to limit due mails for one attempt each, the longest due first; return the rows."""
    now = now or utcnow()
    due = (MailMessage.state == PENDING) & (MailMessage.next_attempt_at <= now)
    with outbox.claim_transaction(db.obj):
        ids = [pk for pk, in MailMessage.select(MailMessage.id).where(due)
               .order_by(MailMessage.next_attempt_at, MailMessage.id).limit(limit).tuples()]
        ids = outbox.lock_due(db.obj, MailMessage, ids, due)
        if not ids:
            return []
        outbox.lease(MailMessage, ids, due, now, LEASE_SECONDS)
        return list(MailMessage.select().where(MailMessage.id.in_(ids)).order_by(MailMessage.id))


def attempt(app, row):
    """Send one claimed mail and record how it went; return its state (None when it was claimed
    again after this attempt's lease ended)."""
    server = settings.mail_url(app.config["MAIL_URL"])
    parts = mail_outbox.parts_of(row)
    error = None
    if parts is None:
        error = "The mail cannot be read: SECRET_KEY changed since it was written."
    else:
        try:
            # The whole attempt, within the lease: a server that drips its answers a byte at a time
            # would otherwise hold a slot for hours, and another process would send the mail again.
            with gevent.Timeout(ATTEMPT_SECONDS,
                                transport.MailFailed(f"No end to the send within {ATTEMPT_SECONDS} s.")):
                transport.send(server, mail_outbox.message_of(row, app.config["MAIL_FROM"], parts))
        except transport.MailFailed as failure:
            error = str(failure)
        except Exception as failure:  # whatever a mail or a server does is a failed attempt, never a loop
            error = transport.described(failure)
    return record(row, error, app.extensions["mail"].schedule)


def record(row, error, schedule, now=None):
    now = now or utcnow()
    step, next_at = outbox.after_attempt(row.attempts, schedule, error is None, now)
    state = {outbox.SUCCEEDED: SENT, outbox.RETRY: PENDING, outbox.GIVEN_UP: FAILED}[step]
    changes = {"state": state, "next_attempt_at": next_at, "error": error and error[:200]}
    if state != PENDING:
        changes["sealed_parts"] = ""  # what it said is not kept once it is done with
    if state == SENT:
        changes["sent_at"] = now
    with write_transaction(db.obj):
        updated = (MailMessage.update(**changes)
                   .where((MailMessage.id == row.id) & (MailMessage.attempts == row.attempts)).execute())
    if not updated:
        return None
    if state == FAILED:
        log.warning("Gave up sending the mail %r to %s after %d attempts: %s", row.subject, row.recipient,
                    row.attempts, error)
    elif state == PENDING:
        log.info("Could not send the mail %r to %s (attempt %d): %s; trying again at %s UTC.", row.subject,
                 row.recipient, row.attempts, error, next_at.strftime("%H:%M:%S"))
    return state


def forget_old(now=None):
    """Delete the sent and given-up mails older than KEPT_FOR; return how many."""
    old = (MailMessage.state != PENDING) & (MailMessage.created_at < (now or utcnow()) - KEPT_FOR)
    with write_transaction(db.obj):
        return MailMessage.delete().where(old).execute()


def send_due(app, limit=CONCURRENCY):
    """Claim and send the due mails here, one after another, until none is due or one comes round
    again; return [(row, state)]. Tests use it; servers use Sender."""
    done, seen = [], set()
    while True:
        with app.app_context():
            rows = claim(limit)
            release_connection()
        if not rows or seen & {row.id for row in rows}:
            return done
        seen.update(row.id for row in rows)
        for row in rows:
            with app.app_context():
                try:
                    done.append((row, attempt(app, row)))
                finally:
                    release_connection()


class Sender:
    """A greenlet that looks at the outbox every POLL_SECONDS (one indexed query), claims what is
    due and sends each mail in a greenlet of the pool. Started and stopped with the app's services."""

    def __init__(self, app, schedule, interval=POLL_SECONDS):
        self.app = app
        self.schedule = schedule
        self.interval = interval
        self.pool = gevent.pool.Pool(CONCURRENCY)
        self.in_flight = {}
        self.stopped = False
        self.wake = gevent.event.Event()
        self.greenlet = None
        self.pruned_at = time.monotonic()

    def start(self):
        if self.greenlet is None:
            if settings.mail_url(self.app.config["MAIL_URL"]).scheme == "console":
                log.info("MAIL_URL is console: each mail, its links included, is written to this log instead of "
                         "being sent.")
            self.greenlet = gevent.spawn(self.run)

    def run(self):
        while not self.stopped:
            rows = []
            try:
                with self.app.app_context():
                    free = self.pool.free_count()
                    if free and due_exists():
                        rows = claim(free)
                    if time.monotonic() - self.pruned_at >= PRUNE_EVERY_SECONDS:
                        self.pruned_at = time.monotonic()
                        forget_old()
            except Exception:
                log.exception("Could not claim mails from the outbox; trying again in %s s.", self.interval)
            finally:
                release_connection()
            for row in rows:
                self.in_flight[row.id] = row
                self.pool.spawn(self.attempt, row)
            self.wake.wait(self.interval * random.uniform(0.8, 1.0))
            self.wake.clear()

    def attempt(self, row):
        try:
            with self.app.app_context():
                attempt(self.app, row)
        except Exception:
            log.exception("Could not record the attempt of mail %s; it is tried again after its lease.", row.id)
        finally:
            release_connection()
            self.in_flight.pop(row.id, None)

    def close(self):
        """Stop claiming; let the mails being sent finish for up to STOP_WAIT_SECONDS, then cut the
        rest, each due again at once (the next process to start sends it)."""
        self.stopped = True
        self.wake.set()
        if self.greenlet is not None:
            self.greenlet.kill(block=False)
        self.pool.join(timeout=STOP_WAIT_SECONDS)
        cut = list(self.in_flight.values())
        self.pool.kill(block=True, timeout=1)
        if cut:
            with self.app.app_context():
                try:
                    with write_transaction(db.obj):
                        outbox.give_back(MailMessage, [(row.id, row.attempts) for row in cut], PENDING, utcnow())
                except Exception:
                    log.exception("Could not give back %d mails; each is sent after its lease.", len(cut))
                finally:
                    release_connection()


def due_exists(now=None):
    return MailMessage.select(MailMessage.id).where(MailMessage.next_attempt_at <= (now or utcnow())).limit(1).exists()


def init_app(app):
    """Parse the retry schedule; the sender is made here and started with the app's services."""
    schedule = settings.mail_retry_schedule(app.config["MAIL_RETRY_SCHEDULE"])
    sender = app.extensions["mail"] = Sender(app, schedule)
    services.register(app, "mail", sender)
