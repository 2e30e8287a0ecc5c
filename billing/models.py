"""The billing tables: each exported organisation's position and the customers its hours go to,
the clock that seals ended hours against late usage writes, and the outbox of events for the
billing system (store/outbox.py)."""

from peewee import BigIntegerField, CharField, DateTimeField, ForeignKeyField, IntegerField

from models import BaseModel, Organisation, utcnow
from store.ids import IdField

# An event's states: waiting for its next attempt (or in one), accepted by the billing system, given up.
PENDING, SENT, FAILED = "pending", "sent", "failed"
# The one row of BillingClock.
USAGE_CLOCK = "usage"


class BillingCustomer(BaseModel):
    """An exported organisation: who pays for its usage now (a Stripe customer id, a Lago external
    subscription id, an OpenMeter or CloudEvents subject; None once removed, until its last hour is
    closed), one organisation's at a time, and how far its hours are in the outbox
    (closed_through). Which customer each hour goes to is BillingPeriod's."""

    org = ForeignKeyField(Organisation, primary_key=True, on_delete="CASCADE")
    customer = CharField(max_length=255, null=True, unique=True)
    since = DateTimeField()
    closed_through = DateTimeField()
    changed_at = DateTimeField(default=utcnow)

    class Meta:
        table_name = "billing_customers"


class BillingPeriod(BaseModel):
    """The hours from `starts` to `ends` (None: on) of an organisation go to `customer`. A change
    or a removal takes effect at the end of the hour it is made in, so that an hour is never split,
    skipped or moved to another customer after it was used."""

    org = ForeignKeyField(Organisation, on_delete="CASCADE")
    customer = CharField(max_length=255)
    starts = DateTimeField()
    ends = DateTimeField(null=True)

    class Meta:
        table_name = "billing_periods"
        indexes = ((("org", "starts"), True),)


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
    (api_key_id NULL), the others' one per key, meter and hour. It outlives its organisation (org
    NULL, its slug kept): a deleted organisation's last hours are still sent."""

    id = IdField()
    target = CharField(max_length=16)
    identifier = CharField(max_length=120)
    org = ForeignKeyField(Organisation, null=True, on_delete="SET NULL")
    org_slug = CharField(max_length=64)
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
    next_attempt_at = DateTimeField(null=True)
    # While an attempt is under way (its lease): Stripe takes one call at a time per customer and meter.
    sending_until = DateTimeField(null=True)
    sent_at = DateTimeField(null=True)
    # The last failed attempt's reason: the billing system's answer, or why there was none.
    error = CharField(max_length=300, null=True)

    class Meta:
        table_name = "billing_events"
        # Claims and the sender's look at the outbox; Stripe's calls under way; the oldest hour
        # pending; an organisation's hours by state (its status, a resend).
        indexes = ((("target", "identifier"), True), (("state", "target", "next_attempt_at"), False),
                   (("state", "sending_until"), False), (("state", "hour"), False), (("org", "state", "hour"), False))


MODELS = [BillingCustomer, BillingPeriod, BillingClock, BillingEvent]
