"""Delivery: each process's sender claims due messages from the outbox, one attempt at a time per
message across every worker and instance, sends each in a greenlet of its own within 10 s, and
records the attempt and the next one (the retry schedule), or the delivery."""

import collections
import contextlib
import datetime
import http.client
import logging
import random
import time
from urllib.parse import urlsplit

import gevent
import gevent.event
import gevent.pool
from peewee import SQL, Case, fn

import settings
from accounts import securitylog
from models import db, release_connection, utcnow
from ops import services
from store import outbox
from store.writelock import write_transaction
from webhooks import addresses, deadlines, endpoints, failures, periodic, signing
from webhooks.models import DELIVERED, FAILED, PENDING, WebhookAttempt, WebhookEndpoint, WebhookMessage

log = logging.getLogger(__name__)

# An attempt's whole time: connecting, sending, the answer's head and up to ANSWER_BYTES of its body.
DEADLINE_SECONDS = 10
ANSWER_BYTES = 1024
# A claimed message is due again after this, should its process die before recording the attempt.
LEASE_SECONDS = 30
POLL_SECONDS = 1.0
# Attempts a process makes at once, each in its own greenlet. An organisation with attempts under way in
# the process gets another only while more than SLOTS_KEPT slots are free: the kept ones go to
# organisations with nothing under way, one each, so another organisation's new message finds a slot however
# many slow receivers hold the rest.
CONCURRENCY = 50
SLOTS_KEPT = 10
# Within a turn, messages that became due this recently (within their first attempt's promise) go
# before other organisations' older backlogs.
RECENT_SECONDS = 5
# An endpoint whose every attempt has failed for this long is disabled.
DISABLE_AFTER = datetime.timedelta(days=5)
ATTEMPTS_KEPT = 50
USER_AGENT = "api-key-demo-service-webhooks/1"

Claimed = collections.namedtuple("Claimed", "pk message_id event body number endpoint_id org_id url")
# answer: the first ANSWER_BYTES of the receiver's answer, as text (None without one).
Outcome = collections.namedtuple("Outcome", "status error duration_ms answer", defaults=(None,))


class TimedOut(Exception):
    pass


def claim(database, limit, now=None, only=None, busy=(), sending=None, kept=0):
    """Claim up to limit due messages for one attempt each (only: the one with this primary key),
    the organisations taking turns (first_due); none of an endpoint in busy (those this process is
    sending to). sending counts each organisation's attempts under way in this process; the last kept
    of the limit go only to organisations with none. The claimed messages' attempt count goes up and
    they are not due again until the lease ends. On PostgreSQL the rows are locked with SKIP
    LOCKED, so processes claiming at once take different messages; on SQLite the claim holds the
    write lock. Return [Claimed]. store/outbox.py holds what this shares with the mail outbox."""
    now = now or utcnow()
    due = (WebhookMessage.state == PENDING) & (WebhookMessage.next_attempt_at <= now)
    if only is not None:
        due &= WebhookMessage.id == only
    if busy:
        due &= WebhookMessage.endpoint.not_in(list(busy))
    with outbox.claim_transaction(database):
        ids = first_due(database, due, limit, sending or {}, kept, now)
        if not ids:
            return []
        outbox.lease(WebhookMessage, ids, due, now, LEASE_SECONDS,
                     claimed_until=now + datetime.timedelta(seconds=LEASE_SECONDS))
        rows = (WebhookMessage.select(WebhookMessage.id, WebhookMessage.message_id, WebhookMessage.event,
                                      WebhookMessage.body, WebhookMessage.attempts, WebhookEndpoint.id,
                                      WebhookEndpoint.org, WebhookEndpoint.url)
                .join(WebhookEndpoint).where(WebhookMessage.id.in_(ids)).tuples())
        return [Claimed(*row) for row in rows]


def first_due(database, due, limit, sending, kept, now):
    """The ids of up to limit messages meeting due, the organisations taking turns. An endpoint has one
    at a time, its longest due: a receiver that holds its connections open holds one attempt. An
    organisation's turn is a message's place among the organisation's own here plus the organisation's attempts
    under way (sending): every organisation's first goes before anyone's second, so one organisation's
    backlog or slow receivers wait while other organisations' messages go. Within a turn, messages due
    for less than RECENT_SECONDS go first, then the longest due. The last kept of the limit go
    only to first turns: organisations with nothing under way, one message each. PostgreSQL refuses FOR
    UPDATE beside a window function, so there the rows the windows picked are locked by id."""
    organisation = WebhookEndpoint.org
    # A message written as its endpoint was being paused may still have a next attempt: it waits too.
    where = due & WebhookEndpoint.paused_at.is_null()
    if sending and limit <= kept:
        # Only first turns may have a slot: the organisations with something under way are not ranked.
        where &= organisation.not_in(list(sending))
    place = fn.ROW_NUMBER().over(partition_by=[WebhookMessage.endpoint],
                                 order_by=[WebhookMessage.next_attempt_at, WebhookMessage.id])
    firsts = (WebhookMessage.select(WebhookMessage.id, WebhookMessage.next_attempt_at,
                                    organisation.alias("organisation"), place.alias("place"))
              .join(WebhookEndpoint).where(where).alias("firsts"))
    turn = fn.ROW_NUMBER().over(partition_by=[firsts.c.organisation], order_by=[firsts.c.next_attempt_at, firsts.c.id])
    if sending:
        turn += Case(firsts.c.organisation, list(sending.items()), 0)
    older = Case(None, [(firsts.c.next_attempt_at > now - datetime.timedelta(seconds=RECENT_SECONDS), 0)], 1)
    ranked = (WebhookMessage.select(firsts.c.id, turn.alias("turn")).from_(firsts).where(firsts.c.place == 1)
              .order_by(SQL("turn"), older, firsts.c.next_attempt_at, firsts.c.id).limit(limit))
    ids = []
    for pk, turn in ranked.tuples():
        if turn > 1 and len(ids) >= limit - kept:
            break  # the rest are ranked later still
        ids.append(pk)
    return outbox.lock_due(database, WebhookMessage, ids, due)


def send(claimed, allow_private, deadline=DEADLINE_SECONDS):
    """Make one attempt of a claimed message; return its Outcome (an HTTP status, or an error)."""
    started = time.monotonic()
    status, error, answer = None, None, None
    try:
        in_force = secrets_in_force(claimed.endpoint_id)
    finally:
        # Not held through the attempt's up to DEADLINE_SECONDS: fifty attempts, fifty pooled connections.
        release_connection()
    if in_force is None:
        error = "The signing secret cannot be read: SECRET_KEY changed since the endpoint was added."
    else:
        body = claimed.body.encode()
        headers = signing.headers(in_force, claimed.message_id, int(time.time()), body)
        try:
            # The socket deadline holds in every process; the Timeout also cuts a lookup under gevent.
            with gevent.Timeout(deadline, TimedOut):
                status, answer = post(claimed.url, body, headers, allow_private, deadlines.Deadline(deadline))
        except (TimedOut, TimeoutError):
            error = f"No answer within {deadline} s."
        except Exception as failure:  # a receiver's every way of failing is a failed attempt, never a crash
            error = failures.described(failure)
    return Outcome(status, error, round((time.monotonic() - started) * 1000), answer)


def secrets_in_force(endpoint_id, now=None):
    """The endpoint's signing secrets as the attempt is signed, newest first: read now rather than
    when the message was claimed, so a rotation meanwhile signs this attempt too. The previous one
    only until its overlap ends, and only while it can be read; None when the current one cannot
    be (SECRET_KEY changed) or the endpoint is gone."""
    row = (WebhookEndpoint.select(WebhookEndpoint.sealed_secret, WebhookEndpoint.sealed_previous_secret,
                                  WebhookEndpoint.previous_until)
           .where(WebhookEndpoint.id == endpoint_id).tuples().first())
    if row is None:
        return None
    sealed, sealed_previous, previous_until = row
    current = signing.unseal(sealed)
    if current is None:
        return None
    previous = None
    if sealed_previous is not None and previous_until is not None and previous_until > (now or utcnow()):
        previous = signing.unseal(sealed_previous)
    return [current, previous] if previous else [current]


def post(url, body, headers, allow_private, deadline):
    """POST body to url through a connection made to a checked address; return the answer's status
    and at most ANSWER_BYTES of its body as text, all before the Deadline (else DeadlinePassed,
    or TimeoutError). Redirects are answers like any other."""
    scheme, host, port = addresses.parse_url(url)
    parts = urlsplit(url.strip())
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    if scheme == "https":
        connection = http.client.HTTPSConnection(host, port, context=deadline.ssl_context())
    else:
        connection = http.client.HTTPConnection(host, port)
    # http.client opens its socket with this attribute (socket.create_connection by default); the
    # TLS handshake, SNI and certificate check still use the host name. tests/unit/webhooks/test_delivery.py pins it.
    connection._create_connection = addresses.checked_connection(allow_private, deadline)
    try:
        connection.request("POST", target, body=body, headers={
            "Content-Type": "application/json", "User-Agent": USER_AGENT, **headers})
        response = connection.getresponse()
        # As text a database keeps: PostgreSQL refuses a NUL in text.
        return response.status, response.read(ANSWER_BYTES).decode("utf-8", "replace").replace("\x00", "\ufffd")
    finally:
        connection.close()


def is_delivered(outcome):
    return outcome.status is not None and 200 <= outcome.status < 300


def record(claimed, outcome, schedule, now=None):
    """Record an attempt: the message delivered, due again after the schedule's next pause, or
    failed once the schedule is spent; the endpoint disabled when every attempt has failed for
    DISABLE_AFTER. A failed attempt to an endpoint disabled meanwhile fails its message for good.
    Return the message's state, or None when the message is gone (its endpoint removed) or was
    claimed again after this attempt's lease ended."""
    now = now or utcnow()
    delivered = is_delivered(outcome)
    step, next_at = outbox.after_attempt(claimed.number, schedule, delivered, now)
    state = {outbox.SUCCEEDED: DELIVERED, outbox.RETRY: PENDING, outbox.GIVEN_UP: FAILED}[step]
    with write_transaction(db.obj):
        if state == PENDING:
            # Held, so that a pause or resume is wholly before this or wholly after.
            with contextlib.suppress(endpoints.EndpointGone):
                endpoints.lock_endpoint(claimed.endpoint_id)
            endpoint_now = WebhookEndpoint.get_or_none(WebhookEndpoint.id == claimed.endpoint_id)
            if endpoint_now is not None and endpoint_now.disabled_at is not None:
                state, next_at = FAILED, None
            elif endpoint_now is not None and endpoint_now.paused_at is not None:
                next_at = None  # paused while this attempt was under way: the message waits

        updated = (WebhookMessage.update(state=state, next_attempt_at=next_at, claimed_until=None)
                   .where((WebhookMessage.id == claimed.pk) & (WebhookMessage.attempts == claimed.number)).execute())
        if not updated:
            return None
        WebhookAttempt.create(endpoint=claimed.endpoint_id, message_id=claimed.message_id, event=claimed.event,
                              attempted_at=now, number=claimed.number, status=outcome.status,
                              error=outcome.error and outcome.error[:200], duration_ms=outcome.duration_ms,
                              answer=outcome.answer)
        forget_old_attempts(claimed.endpoint_id)
        endpoint = WebhookEndpoint.id == claimed.endpoint_id
        if delivered:
            WebhookEndpoint.update(failing_since=None, disabled_at=None).where(endpoint).execute()
        else:
            (WebhookEndpoint.update(failing_since=now)
             .where(endpoint & WebhookEndpoint.failing_since.is_null()).execute())
            if next_at is not None:
                wait_for_probe(claimed, next_at, now)
            disable_if_failing(claimed, now)
    return state


def wait_for_probe(claimed, next_at, now):
    """After a failed attempt, the endpoint's other due messages wait for this one's next attempt
    (their attempts not counted): a failing receiver gets one message at a time, a probe, instead
    of its whole backlog, each attempt of which could hold a sender's slot for 10 s."""
    (WebhookMessage.update(next_attempt_at=next_at)
     .where((WebhookMessage.endpoint == claimed.endpoint_id) & (WebhookMessage.state == PENDING)
            & (WebhookMessage.next_attempt_at <= now)).execute())


def forget_old_attempts(endpoint_id):
    """Keep the endpoint's newest ATTEMPTS_KEPT attempts: one index walk."""
    oldest_kept = (WebhookAttempt.select(WebhookAttempt.id).where(WebhookAttempt.endpoint == endpoint_id)
                   .order_by(WebhookAttempt.id.desc()).offset(ATTEMPTS_KEPT - 1).limit(1).scalar())
    if oldest_kept is not None:
        WebhookAttempt.delete().where((WebhookAttempt.endpoint == endpoint_id)
                                      & (WebhookAttempt.id < oldest_kept)).execute()


def disable_if_failing(claimed, now):
    """Disable the endpoint when every attempt since failing_since has failed for DISABLE_AFTER: its
    waiting messages fail, no new ones are written, and the security log says so."""
    disabled = (WebhookEndpoint.update(disabled_at=now)
                .where((WebhookEndpoint.id == claimed.endpoint_id) & WebhookEndpoint.disabled_at.is_null()
                       & (WebhookEndpoint.failing_since <= now - DISABLE_AFTER)).execute())
    if disabled:
        (WebhookMessage.update(state=FAILED, next_attempt_at=None)
         .where((WebhookMessage.endpoint == claimed.endpoint_id) & (WebhookMessage.state == PENDING)).execute())
        securitylog.record_in(claimed.org_id, "webhook.disabled",
                           f"{claimed.url} (id {claimed.endpoint_id}): every attempt failed for "
                           f"{DISABLE_AFTER.days} days", address="-")


def attempt(app, claimed):
    """Send one claimed message and record the outcome; return (Outcome, state)."""
    with app.app_context():
        outcome = send(claimed, app.config["WEBHOOK_ALLOW_PRIVATE"])
        try:
            return outcome, record(claimed, outcome, app.extensions["webhooks"].schedule)
        finally:
            release_connection()


def deliver_due(app, limit=CONCURRENCY, only=None):
    """Claim the due messages (only: that one) and attempt each in turn, here, until none is due or
    one comes round again; return [(Claimed, Outcome, state)]. The CLI's `webhooks test` and the
    tests use it; servers use Sender."""
    done, attempted = [], set()
    while True:
        with app.app_context():
            claimed = claim(db.obj, limit, only=only)
            release_connection()
        if not claimed or attempted & {message.pk for message in claimed}:
            return done
        attempted.update(message.pk for message in claimed)
        done += [(message, *attempt(app, message)) for message in claimed]


class Sender:
    """A process's sender: a greenlet that polls the outbox every POLL_SECONDS (an indexed look at
    the due messages), claims what is due and sends each message in a greenlet of its own, never in
    a request's way. Started and stopped with the app's services (ops/services.py), once the process
    serves."""

    def __init__(self, app, schedule, interval=POLL_SECONDS, concurrency=CONCURRENCY):
        self.app = app
        self.schedule = schedule
        self.interval = interval
        self.pool = gevent.pool.Pool(concurrency)
        self.in_flight = {}
        self.stopped = False
        self.wake = gevent.event.Event()
        self.greenlet = None
        self.periodic = periodic.Periodic(app)

    def start(self):
        if self.greenlet is None:
            self.greenlet = gevent.spawn(self.run)

    def run(self):
        while not self.stopped:
            free = self.pool.free_count()
            claimed = []
            try:
                with self.app.app_context():
                    self.periodic.run_when_due()
                    if free and due_exists():
                        under_way = self.in_flight.values()
                        claimed = claim(db.obj, free, busy={message.endpoint_id for message in under_way},
                                        sending=collections.Counter(message.org_id for message in under_way),
                                        kept=SLOTS_KEPT)
            except Exception:
                log.exception("Could not claim webhook messages; trying again in %s s.", self.interval)
            finally:
                release_connection()
            for message in claimed:
                self.in_flight[message.pk] = message
                self.pool.spawn(self.attempt, message)
            if claimed and len(claimed) == free:
                self.pool.wait_available(timeout=self.interval)
            else:
                self.wake.wait(self.interval * random.uniform(0.8, 1.0))
                self.wake.clear()

    def attempt(self, message):
        try:
            outcome, state = attempt(self.app, message)
            if state is None:
                log.info("Webhook message %s: its endpoint was removed, or it was claimed again.", message.message_id)
        except Exception:
            log.exception("Could not record the attempt of webhook message %s; it is tried again after its lease.",
                          message.message_id)
        finally:
            self.in_flight.pop(message.pk, None)
            # The endpoint's next message need not wait for the next poll.
            self.wake.set()

    def close(self):
        """Stop claiming and cut the attempts under way; each cut one is due again at once, under
        the same webhook-id (the next process to start sends it)."""
        self.stopped = True
        self.wake.set()
        if self.greenlet is not None:
            self.greenlet.kill(block=False)
        self.periodic.close()
        cut = list(self.in_flight.values())
        self.pool.kill(block=True, timeout=1)
        if cut:
            with self.app.app_context():
                try:
                    release_claims(cut)
                except Exception:
                    log.exception("Could not give back %d webhook messages; each is sent after its lease.", len(cut))
                finally:
                    release_connection()


def due_exists(now=None):
    """True when some message is due: one look at the index on next_attempt_at."""
    return WebhookMessage.select(WebhookMessage.id).where(
        WebhookMessage.next_attempt_at <= (now or utcnow())).limit(1).exists()


def release_claims(claims, now=None):
    """Make messages whose attempt was cut due again at once, that attempt not counted; one whose
    attempt was recorded (delivered or failed) just before the cut is left as it is."""
    with write_transaction(db.obj):
        outbox.give_back(WebhookMessage, [(message.pk, message.number) for message in claims], PENDING,
                         now or utcnow(), claimed_until=None)


def init_app(app):
    """Parse the retry schedule; the sender is made here and started with the app's services."""
    schedule = settings.retry_schedule(app.config["WEBHOOK_RETRY_SCHEDULE"])
    sender = app.extensions["webhooks"] = Sender(app, schedule)
    services.register(app, "webhooks", sender)
