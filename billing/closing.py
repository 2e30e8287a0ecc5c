"""Closing hours: once an hour has ended and CLOSE_AFTER has passed, the usage clock seals it
(billing/sealing.py) and each exported organisation's totals for it become events in the outbox,
with the identifiers the billing system deduplicates by. One process of all workers and instances
does it, under the maintenance lock "billing" (metering/lifecycle.py's take_lock)."""

import collections
import datetime

from peewee import JOIN, Case, fn

import settings
from billing import sealing
from billing.models import BillingCustomer, BillingEvent
from models import ApiKey, UsageHour, db, utcnow
from store.writelock import write_transaction

CLOSE_AFTER = datetime.timedelta(minutes=2)
# Hours of one organisation closed in one transaction: a service that was down for days catches
# up in short transactions.
HOURS_PER_TRANSACTION = 24
HOUR = datetime.timedelta(hours=1)
LOCK_NAME = "billing"

Total = collections.namedtuple("Total", "api_key_id hour requests credits")
Event = collections.namedtuple("Event", "identifier api_key_id quantity meter hour value")


def hour_stamp(hour):
    return hour.strftime("%Y%m%d%H")


def totals(org_id, start, end):
    """The organisation's totals per key and hour in [start, end): successful (2xx) requests and
    credits spent, from the usage rows."""
    successful = Case(None, [((UsageHour.status >= 200) & (UsageHour.status < 300), UsageHour.requests)], 0)
    query = (UsageHour.select(UsageHour.api_key, UsageHour.hour, fn.SUM(successful), fn.SUM(UsageHour.credits))
             .join(ApiKey, JOIN.INNER, on=(UsageHour.api_key == ApiKey.id))
             .where((ApiKey.org == org_id) & (UsageHour.hour >= start) & (UsageHour.hour < end))
             .group_by(UsageHour.api_key, UsageHour.hour).order_by(UsageHour.hour, UsageHour.api_key))
    return [Total(key_id, UsageHour.hour.python_value(hour), int(requests or 0), int(credits or 0))
            for key_id, hour, requests, credits in query.tuples()]


def events(target, org_id, rows, meters):
    """The events of an organisation's totals: Stripe's one per meter and hour (summed over the
    keys), the others' one per key, meter and hour; none with a zero value."""
    made = []
    if target == "stripe":
        by_hour = collections.defaultdict(collections.Counter)
        for row in rows:
            by_hour[row.hour].update(requests=row.requests, credits=row.credits)
        for hour, summed in sorted(by_hour.items()):
            for quantity, meter in meters.items():
                if summed[quantity]:
                    made.append(Event(f"{org_id}-{meter}-{hour_stamp(hour)}", None, quantity, meter, hour,
                                      summed[quantity]))
        return made
    for row in rows:
        for quantity, meter in meters.items():
            value = getattr(row, quantity)
            if value:
                made.append(Event(f"{row.api_key_id}-{meter}-{hour_stamp(row.hour)}", row.api_key_id, quantity,
                                  meter, row.hour, value))
    return made


def write_events(target, org_id, customer, made, now):
    """Add the events to the outbox, due now; an identifier already there (a resend of an hour
    that was never lost) keeps its row. Return how many rows were new."""
    rows = [{"target": target, "identifier": event.identifier, "org": org_id, "api_key_id": event.api_key_id,
             "customer": customer, "quantity": event.quantity, "meter": event.meter, "hour": event.hour,
             "value": event.value, "created_at": now, "next_attempt_at": now} for event in made]
    written = 0
    for start in range(0, len(rows), 500):
        written += BillingEvent.insert_many(rows[start:start + 500]).on_conflict_ignore().as_rowcount().execute()
    return written


def meters_of(config):
    return settings.billing_meters(config["BILLING_METERS"])


def close(config, now=None):
    """Seal the hours that ended CLOSE_AFTER ago and put every exported organisation's new hours
    in the outbox; return the number of events written."""
    now = now or utcnow()
    through = sealing.seal(now - CLOSE_AFTER)
    written = 0
    for customer in BillingCustomer.select().where(BillingCustomer.closed_through < through):
        written += close_customer(config, customer, through, now)
    return written


def close_customer(config, customer, through, now):
    meters = meters_of(config)
    written = 0
    start = customer.closed_through
    while start < through:
        end = min(through, start + HOURS_PER_TRANSACTION * HOUR)
        with write_transaction(db.obj):
            # Moved only from where this run found it: a customer changed meanwhile keeps its own.
            moved = (BillingCustomer.update(closed_through=end)
                     .where((BillingCustomer.org == customer.org_id) & (BillingCustomer.closed_through == start)
                            & (BillingCustomer.customer == customer.customer)).execute())
            if not moved:
                return written
            made = events(config["BILLING_EXPORT"], customer.org_id, totals(customer.org_id, start, end), meters)
            written += write_events(config["BILLING_EXPORT"], customer.org_id, customer.customer, made, now)
        start = end
    return written
