"""An endpoint's message log: its kept messages newest first, a page at a time, each in one of the
states a person reads (pending, delivered, failed, paused), and one message with its attempts."""

from models import iso_seconds
from webhooks.models import DELIVERED, FAILED, PAUSED, PENDING, WebhookAttempt, WebhookMessage

PAGE = 20
STATES = (PENDING, DELIVERED, FAILED, PAUSED)


def state_of(message):
    """The message's state as the log shows it: a pending message without a next attempt waits for
    its paused endpoint."""
    if message.state == PENDING and message.next_attempt_at is None:
        return PAUSED
    return message.state


def page(endpoint_id, state=None, before=None):
    """(up to PAGE of the endpoint's messages in that state, newest first, older than the message
    whose id is before; whether there are older ones)."""
    where = WebhookMessage.endpoint == endpoint_id
    if state == PAUSED:
        where &= (WebhookMessage.state == PENDING) & WebhookMessage.next_attempt_at.is_null()
    elif state == PENDING:
        where &= (WebhookMessage.state == PENDING) & WebhookMessage.next_attempt_at.is_null(False)
    elif state is not None:
        where &= WebhookMessage.state == state
    if before is not None:
        where &= WebhookMessage.id < before
    rows = list(WebhookMessage.select(WebhookMessage.id, WebhookMessage.message_id, WebhookMessage.event,
                                      WebhookMessage.created_at, WebhookMessage.state, WebhookMessage.attempts,
                                      WebhookMessage.next_attempt_at)
                .where(where).order_by(WebhookMessage.id.desc()).limit(PAGE + 1))
    return rows[:PAGE], len(rows) > PAGE


def message_with_attempts(endpoint_id, message_id):
    """(the endpoint's kept message with this webhook-id, or None; its kept attempts, oldest first).
    Attempts outlive their message: a forgotten message's attempts are still given."""
    message = WebhookMessage.get_or_none((WebhookMessage.endpoint == endpoint_id)
                                         & (WebhookMessage.message_id == message_id))
    attempts = list(WebhookAttempt.select().where((WebhookAttempt.endpoint == endpoint_id)
                                                  & (WebhookAttempt.message_id == message_id))
                    .order_by(WebhookAttempt.id))
    return message, attempts


def line(message):
    """One tab-separated line of `webhooks messages`: webhook-id, ISO time, event, state, attempts,
    next attempt (- for none)."""
    next_at = iso_seconds(message.next_attempt_at) if message.next_attempt_at else "-"
    return "\t".join([message.message_id, iso_seconds(message.created_at), message.event, state_of(message),
                      str(message.attempts), next_at])
