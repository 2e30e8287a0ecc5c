"""The webhook tables: each account's endpoints, the outbox of messages to deliver, and the attempts."""

from peewee import AutoField, BigIntegerField, CharField, DateTimeField, ForeignKeyField, IntegerField, TextField

from models import ApiKey, BaseModel, Organisation, utcnow

# A message's states: waiting for its next attempt (or in one), delivered, failed for good. A
# pending message of a paused endpoint has no next attempt: the pages call it paused.
PENDING, DELIVERED, FAILED, PAUSED = "pending", "delivered", "failed", "paused"
# The events of an endpoint subscribed to every event, those of later releases included.
ALL_EVENTS = "*"


class WebhookEndpoint(BaseModel):
    org = ForeignKeyField(Organisation, on_delete="CASCADE", index=True)
    url = CharField(max_length=2000)
    # ALL_EVENTS, or the comma-separated names of the events the endpoint is subscribed to.
    events = CharField(max_length=300)
    # The signing secret (whsec_...), sealed by store/sealing.py.
    sealed_secret = TextField()
    # After a rotation with an overlap, the secret it replaced, which also signs until previous_until.
    sealed_previous_secret = TextField(null=True)
    previous_until = DateTimeField(null=True)
    created_at = DateTimeField(default=utcnow)
    # Since when every attempt has failed (None after a success or before any attempt).
    failing_since = DateTimeField(null=True)
    disabled_at = DateTimeField(null=True)
    # What the owner says the endpoint is for.
    description = CharField(null=True, max_length=200)
    # Paused by its owner: its messages wait (next_attempt_at NULL) until it is resumed. paused_by is
    # the username of who paused it in the web application; NULL for the command line.
    paused_at = DateTimeField(null=True)
    paused_by = CharField(null=True, max_length=40)

    class Meta:
        table_name = "webhook_endpoints"

    def event_list(self):
        return self.events.split(",")


def subscribes(events, event):
    """True when an endpoint whose events column holds `events` is subscribed to the event."""
    return events == ALL_EVENTS or event in events.split(",")


class WebhookMessage(BaseModel):
    """One event for one endpoint: the body is made once, so every attempt sends the same bytes
    under the same webhook-id. next_attempt_at is when it is due; a process that claims it moves
    it to the end of its lease, so a message whose process died is due again after the lease."""

    endpoint = ForeignKeyField(WebhookEndpoint, on_delete="CASCADE", index=True)
    message_id = CharField(max_length=40, unique=True)
    event = CharField(max_length=32)
    body = TextField()
    created_at = DateTimeField(default=utcnow)
    state = CharField(max_length=16, default=PENDING)
    attempts = IntegerField(default=0)
    next_attempt_at = DateTimeField(null=True, index=True)
    # The end of the lease of an attempt under way (None or past: none is): a resend or recovery
    # leaves such a message alone, whatever its state, so that it never has two attempts at once.
    claimed_until = DateTimeField(null=True)

    class Meta:
        table_name = "webhook_messages"


class WebhookAttempt(BaseModel):
    """One attempt of a message, as the Security tab lists it (each endpoint keeps its newest)."""

    id = AutoField()  # a plain id: models.BaseModel says why
    endpoint = ForeignKeyField(WebhookEndpoint, on_delete="CASCADE")
    # The message's webhook-id; the attempt outlives the message, which is forgotten after a while.
    message_id = CharField(max_length=40)
    attempted_at = DateTimeField(default=utcnow)
    event = CharField(max_length=32)
    number = IntegerField()
    # The HTTP status, or None when there was no answer (then error says why).
    status = IntegerField(null=True)
    error = CharField(max_length=200, null=True)
    duration_ms = BigIntegerField()
    # The first KiB of the receiver's answer, as text (None without an answer).
    answer = TextField(null=True)

    class Meta:
        table_name = "webhook_attempts"
        indexes = ((("endpoint", "id"), False),)


class WebhookResend(BaseModel):
    """One resend of a message to the endpoint, kept for a minute: they are counted against the
    endpoint's allowance of resends."""

    id = AutoField()
    endpoint = ForeignKeyField(WebhookEndpoint, on_delete="CASCADE", index=True)
    resent_at = DateTimeField(default=utcnow)

    class Meta:
        table_name = "webhook_resends"


class WebhookMarker(BaseModel):
    """An event about a key that is sent once (key.expiring, key.expired): its row says it was."""

    api_key = ForeignKeyField(ApiKey, on_delete="CASCADE")
    event = CharField(max_length=32)

    class Meta:
        table_name = "webhook_markers"
        indexes = ((("api_key", "event"), True),)


MODELS = [WebhookEndpoint, WebhookMessage, WebhookAttempt, WebhookResend, WebhookMarker]
