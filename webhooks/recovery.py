"""Sending messages again: one message now (a resend, at most RESENDS_PER_MINUTE per endpoint), or
every message that failed since a moment (a recovery, each from the start of the retry schedule).
Either keeps each message's webhook-id and body, so a receiver that has seen it knows it again."""

import datetime
import re

from models import db, iso_seconds, utcnow
from orgs.keyactions import parse_duration
from store.writelock import write_transaction
from webhooks import endpoints
from webhooks.models import FAILED, PENDING, WebhookEndpoint, WebhookMessage, WebhookResend

RESENDS_PER_MINUTE = 10
# outbox.new_message_id's form.
MESSAGE_ID = re.compile(r"msg_[A-Za-z0-9_-]{1,36}")
RESEND_WINDOW = datetime.timedelta(minutes=1)


class ResendRefused(ValueError):
    """A resend that cannot be made now; its sentence says why."""


def find_message(message_id, endpoint_id=None):
    """The kept message with this webhook-id (of that endpoint, when one is given), or None; nothing
    that is not a webhook-id's form reaches the database."""
    if not MESSAGE_ID.fullmatch(message_id):
        return None
    where = WebhookMessage.message_id == message_id
    if endpoint_id is not None:
        where &= WebhookMessage.endpoint == endpoint_id
    return WebhookMessage.get_or_none(where)


def resend(message, now=None):
    """Make the message due now for one more attempt, whatever its state: same webhook-id, same body.
    Should that attempt fail, the message goes on with the retry schedule from where its attempts
    stand (failed again when the schedule is spent). ResendRefused while an attempt of it is under
    way (one attempt at a time per message) or past the endpoint's RESENDS_PER_MINUTE."""
    now = now or utcnow()
    with write_transaction(db.obj):
        endpoints.lock_endpoint(message.endpoint_id)
        if endpoints.is_paused(message.endpoint_id):
            raise ResendRefused("The endpoint is paused: resume it to send its messages.")
        recent = (WebhookResend.select().where((WebhookResend.endpoint == message.endpoint_id)
                                               & (WebhookResend.resent_at > now - RESEND_WINDOW)))
        if recent.count() >= RESENDS_PER_MINUTE:
            oldest = recent.order_by(WebhookResend.resent_at).first().resent_at
            wait = max(1, int((oldest + RESEND_WINDOW - now).total_seconds()) + 1)
            raise ResendRefused(f"This endpoint has had {RESENDS_PER_MINUTE} resends in the last minute, the most "
                                f"it may; try again in {wait} s.")
        changed = (WebhookMessage.update(state=PENDING, next_attempt_at=now)
                   .where((WebhookMessage.id == message.id) & not_claimed(now)).execute())
        if not changed:
            if WebhookMessage.get_or_none(WebhookMessage.id == message.id) is None:
                raise ResendRefused(f"{message.message_id} is no longer kept.")
            raise ResendRefused(f"{message.message_id} is being sent right now; see its attempt in a moment.")
        WebhookResend.create(endpoint=message.endpoint_id, resent_at=now)
        WebhookResend.delete().where((WebhookResend.endpoint == message.endpoint_id)
                                     & (WebhookResend.resent_at <= now - RESEND_WINDOW)).execute()


def recover(endpoint, since, now=None):
    """Try every message of the endpoint that was made at or after since and ended failed again,
    from the start of the retry schedule, each due now; return how many. A disabled endpoint is
    enabled again, its days of failing counted afresh: else each recovered message would fail for
    good at its first attempt, and the sender would hold none back for a failing receiver."""
    now = now or utcnow()
    with write_transaction(db.obj):
        endpoints.lock_endpoint(endpoint.id)
        # A paused endpoint's recovered messages wait with its others, for its resume.
        due = None if endpoints.is_paused(endpoint.id) else now
        recovered = (WebhookMessage.update(state=PENDING, attempts=0, next_attempt_at=due)
                     .where((WebhookMessage.endpoint == endpoint.id) & (WebhookMessage.state == FAILED)
                            & (WebhookMessage.created_at >= since) & not_claimed(now)).execute())
        if recovered:
            (WebhookEndpoint.update(disabled_at=None, failing_since=None)
             .where((WebhookEndpoint.id == endpoint.id) & WebhookEndpoint.disabled_at.is_null(False)).execute())
        return recovered


def not_claimed(now):
    """No attempt of the message is under way: its last claim's lease ended or was given back. A
    message failed while in an attempt (its endpoint disabled meanwhile) is left to that attempt."""
    return WebhookMessage.claimed_until.is_null() | (WebhookMessage.claimed_until <= now)


def attempt_line(attempt):
    """An attempt as `webhooks attempts` prints it: webhook-id, ISO time, event, result, attempt number."""
    result = f"HTTP {attempt.status}" if attempt.status is not None else attempt.error
    return "\t".join([attempt.message_id, iso_seconds(attempt.attempted_at), attempt.event, result,
                      str(attempt.number)])


def since_moment(text, now=None):
    """The moment `--since` names: ISO 8601 (UTC when it says no zone), or a duration back from now
    such as 24h; ValueError with a sentence otherwise."""
    now = now or utcnow()
    text = text.strip()
    try:
        return now - datetime.timedelta(seconds=parse_duration(text, allow_never=False))
    except (ValueError, OverflowError):
        pass
    try:
        moment = datetime.datetime.fromisoformat(text)
        if moment.tzinfo is not None:
            moment = moment.astimezone(datetime.timezone.utc).replace(tzinfo=None)
    except (ValueError, OverflowError):
        raise ValueError(f"--since takes an ISO 8601 time (2026-11-25T09:00:00Z) or a duration back from now "
                         f"(24h, 90m, 7d), not {text!r}.") from None
    return moment
