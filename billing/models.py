"""The billing tables: each exported organisation's customer, the clock that seals ended hours
against late usage writes, and the outbox of events for the billing system (store/outbox.py)."""

from peewee import BigIntegerField, CharField, DateTimeField, ForeignKeyField, IntegerField

from models import BaseModel, Organisation, utcnow
from store.ids import IdField

# An event's states: waiting for its next attempt (or in one), accepted by the billing system, given up.
PENDING, SENT, FAILED = "pending", "sent", "failed"
# The one row of BillingClock.
USAGE_CLOCK = "usage"


class BillingCustomer(BaseModel):
    """Who pays for an organisation's usage in the billing system: a Stripe customer id, a Lago
    external subscription id, an OpenMeter or CloudEvents subject. Its hours from `since` on are
    exported; those before `closed_through` are in the outbox already."""

    org = ForeignKeyField(Organisation, primary_key=True, on_delete="CASCADE")
    customer = CharField(max_length=255)
    since = DateTimeField()
    closed_through = DateTimeField()
    changed_at = DateTimeField(default=utcnow)

    class Meta:
        table_name = "billing_customers"


class BillingClock(BaseModel):
    """The start of the oldest hour still open to usage writes: the usage flush writes a count
    taken earlier into this hour instead (billing/sealing.py), so an hour read for billing never
    grows afterwards."""

    name = CharField(primary_key=True, max_length=16)
    sealed_through = DateTimeField()

    class Meta:
        table_name = "billing_clock"


class BillingEvent(BaseModel):
    """One event for the billing system, written when its hour is closed, with the identifier the
    system deduplicates by: a resend is harmless. Stripe's are one per organisation, meter and hour
    (api_key_id NULL), the others' one per key, meter and hour."""

    id = IdField()
    target = CharField(max_length=16)
    identifier = CharField(max_length=120)
    org = ForeignKeyField(Organisation, on_delete="CASCADE")
    api_key_id = BigIntegerField(null=True)
    customer = CharField(max_length=255)
    # The quantity (requests or credits) and the meter's name in the billing system.
    quantity = CharField(max_length=16)
    meter = CharField(max_length=100)
    hour = DateTimeField()
    value = BigIntegerField()
    created_at = DateTimeField(default=utcnow)
    state = CharField(max_length=16, default=PENDING)
    attempts = IntegerField(default=0)
    next_attempt_at = DateTimeField(null=True, index=True)
    # While an attempt is under way (its lease): Stripe takes one call at a time per customer and meter.
    sending_until = DateTimeField(null=True)
    sent_at = DateTimeField(null=True)
    # The last failed attempt's reason: the billing system's answer, or why there was none.
    error = CharField(max_length=300, null=True)

    class Meta:
        table_name = "billing_events"
        indexes = ((("target", "identifier"), True), (("org", "hour"), False), (("state", "hour"), False))


MODELS = [BillingCustomer, BillingClock, BillingEvent]
