"""What each serving process's sender does once a minute: key.expiring (7 days before a key's
expiry) and key.expired, each sent once per key (a marker row says it was), and delivered or
failed messages, and those a paused endpoint held, forgotten after a week."""

import datetime
import logging
import random
import time

import gevent
from peewee import IntegrityError

from keys import events as key_events
from models import ApiKey, db, iso_seconds, release_connection, utcnow
from store.writelock import write_transaction
from webhooks.models import PENDING, WebhookMarker, WebhookMessage

log = logging.getLogger(__name__)

INTERVAL_SECONDS = 60
FIRST_RUN_SECONDS = (2, 10)
EXPIRING_AHEAD = datetime.timedelta(days=7)
# A key that expired longer ago than this (before the service ran, say) gets no key.expired.
EXPIRED_WITHIN = datetime.timedelta(days=1)
MESSAGES_KEPT_FOR = datetime.timedelta(days=7)
BATCH = 500
PAUSE_SECONDS = 0.05


def run(now=None):
    """Send what is due of key.expiring and key.expired, and forget old messages; return the
    number of key events sent."""
    now = now or utcnow()
    unrevoked = ApiKey.revoked_at.is_null()
    expiring = unrevoked & (ApiKey.expires_at > now) & (ApiKey.expires_at <= now + EXPIRING_AHEAD)
    expired = unrevoked & (ApiKey.expires_at <= now) & (ApiKey.expires_at > now - EXPIRED_WITHIN)
    sent = send_once("key.expiring", expiring, now) + send_once("key.expired", expired, now)
    forget_old_messages(now)
    return sent


def forget_old_messages(now):
    """Delete the delivered and failed messages older than MESSAGES_KEPT_FOR, and those a paused
    endpoint held that long, BATCH a transaction
    with a pause between (the write lock is never held long), until fewer than BATCH were left;
    return how many."""
    forgotten = 0
    # Delivered, failed, or waiting for its paused endpoint (pending without a next attempt).
    ended = (WebhookMessage.state != PENDING) | WebhookMessage.next_attempt_at.is_null()
    while True:
        with write_transaction(db.obj):
            old = (WebhookMessage.select(WebhookMessage.id)
                   .where(ended & (WebhookMessage.created_at < now - MESSAGES_KEPT_FOR))
                   .limit(BATCH))
            # Asked again: a resend or a resume between the two reads makes a message waiting again.
            deleted = WebhookMessage.delete().where(WebhookMessage.id.in_(old) & ended).execute()
        forgotten += deleted
        if deleted < BATCH:
            return forgotten
        time.sleep(PAUSE_SECONDS)


def send_once(event, condition, now):
    """Emit the event for each key that meets condition and has no marker for it yet, the marker
    written in the same transaction: once per key, whichever process gets there first."""
    marked = WebhookMarker.select(WebhookMarker.api_key).where(WebhookMarker.event == event)
    keys = list(ApiKey.select(ApiKey.id, ApiKey.org, ApiKey.user, ApiKey.name, ApiKey.display_prefix, ApiKey.expires_at)
                .where(condition & ApiKey.id.not_in(marked)).limit(BATCH))
    sent = 0
    for key in keys:
        try:
            with write_transaction(db.obj):
                WebhookMarker.create(api_key=key.id, event=event)
                key_events.key_changed.send(event, key=key,
                                            data=key_events.key_data(key, expires_at=iso_seconds(key.expires_at)))
            sent += 1
        except IntegrityError:
            pass  # another process sent it
    return sent


class Periodic:
    """When run() runs next: once a minute, the first a few seconds after start; each run in a
    greenlet of its own, so that a long prune never holds up the sender's claims."""

    def __init__(self, app, interval=INTERVAL_SECONDS):
        self.app = app
        self.interval = interval
        self.next_run = time.monotonic() + random.uniform(*FIRST_RUN_SECONDS)
        self.greenlet = None

    def run_when_due(self):
        if time.monotonic() < self.next_run or (self.greenlet is not None and not self.greenlet.dead):
            return
        self.next_run = time.monotonic() + self.interval
        self.greenlet = gevent.spawn(self.run)

    def run(self):
        with self.app.app_context():
            try:
                run()
            except Exception:
                log.exception("Could not send the key expiry webhooks or forget old messages; trying again in %d s.",
                              self.interval)
            finally:
                release_connection()

    def close(self):
        if self.greenlet is not None:
            self.greenlet.kill(block=False)
