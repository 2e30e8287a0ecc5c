"""Closing hours: once an hour has ended and CLOSE_AFTER has passed, the usage clock seals it
(billing/sealing.py) and each exported organisation's totals for it become events in the outbox,
under the customer of its period, with the identifiers the billing system deduplicates by. One
process of all workers and instances does it, an hour of an organisation a transaction (a service
that was down for days catches up in short ones), under the maintenance lock "billing"
(metering/lifecycle.py's take_lock)."""

import collections
import datetime

from flask import current_app
from peewee import JOIN, Case, fn

from billing import sealing
from billing.models import BillingCustomer, BillingEvent, BillingPeriod
from models import ApiKey, Organisation, UsageHour, db, start_of_hour, utcnow
from settings.billing import billing_meters
from store.writelock import write_transaction

CLOSE_AFTER = datetime.timedelta(minutes=2)
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


def write_events(target, org, customer, made, now):
    """Add the events to the outbox, due now; an identifier already there (a resend of an hour
    that was never lost) keeps its row. Return how many rows were new."""
    rows = [{"target": target, "identifier": event.identifier, "org": org.id, "org_slug": org.slug,
             "api_key_id": event.api_key_id, "customer": customer, "quantity": event.quantity, "meter": event.meter,
             "hour": event.hour, "value": event.value, "created_at": now, "next_attempt_at": now} for event in made]
    written = 0
    for start in range(0, len(rows), 500):
        written += BillingEvent.insert_many(rows[start:start + 500]).on_conflict_ignore().as_rowcount().execute()
    return written


def meters_of(config):
    return billing_meters(config["BILLING_METERS"])


def segments(org_id, start, end):
    """[(customer, from, to)]: the parts of [start, end) the organisation's periods cover."""
    periods = (BillingPeriod.select().where((BillingPeriod.org == org_id) & (BillingPeriod.starts < end)
                                            & (BillingPeriod.ends.is_null() | (BillingPeriod.ends > start)))
               .order_by(BillingPeriod.starts))
    return [(period.customer, max(start, period.starts), min(end, period.ends or end)) for period in periods]


def write_hours(config, org, start, end, now, customer=None):
    """Write the events of the organisation's hours in [start, end), each to its period's customer
    (or all to `customer`); return how many were new."""
    written = 0
    for payer, first, last in [(customer, start, end)] if customer else segments(org.id, start, end):
        made = events(config["BILLING_EXPORT"], org.id, totals(org.id, first, last), meters_of(config))
        written += write_events(config["BILLING_EXPORT"], org, payer, made, now)
    return written


def close(config, now=None):
    """Seal the hours that ended CLOSE_AFTER ago and put every exported organisation's new hours
    in the outbox; return the number of events written."""
    now = now or utcnow()
    through = sealing.seal(now - CLOSE_AFTER)
    if through is None:
        return 0
    written = 0
    for position in BillingCustomer.select().where(BillingCustomer.closed_through < through):
        written += close_organisation(config, position, through, now)
    return written


def close_organisation(config, position, through, now):
    """Close the organisation's hours from where `position` found them to `through`, an hour a
    transaction; once its customer is removed and its last period closed, it is exported no more."""
    written = 0
    start = position.closed_through
    org = Organisation.get_by_id(position.org_id)
    while start < through:
        end = min(through, start + HOUR)
        with write_transaction(db.obj):
            # Moved only from where this run found it: another closer's hours are its own.
            moved = (BillingCustomer.update(closed_through=end)
                     .where((BillingCustomer.org == org.id) & (BillingCustomer.closed_through == start)).execute())
            if not moved:
                return written
            written += write_hours(config, org, start, end, now)
        start = end
    with write_transaction(db.obj):
        ended = ~fn.EXISTS(BillingPeriod.select().where(
            (BillingPeriod.org == org.id) & (BillingPeriod.ends.is_null() | (BillingPeriod.ends > through))))
        if BillingCustomer.delete().where((BillingCustomer.org == org.id) & BillingCustomer.customer.is_null()
                                          & (BillingCustomer.closed_through >= through) & ended).execute():
            BillingPeriod.delete().where(BillingPeriod.org == org.id).execute()
    return written


def close_deleted(org_ids, now=None):
    """An organisation being deleted (orgs/organisations.py's organisations_deleted, before its keys
    go): its hours from where they stand through the one under way are written now, as they are,
    and go out though the organisation is gone. Counts another process still holds for its keys
    (a second's at most) are lost with the keys."""
    now = now or utcnow()
    config = current_app.config
    if config["BILLING_EXPORT"] == "off":
        return
    for position in BillingCustomer.select().where(BillingCustomer.org.in_(list(org_ids))):
        write_hours(config, Organisation.get_by_id(position.org_id), position.closed_through,
                    start_of_hour(now) + HOUR, now)
