"""Each organisation's billing customer, what its export stands at (`billing status`, the
Organisation tab), and sending hours again (`billing resend`)."""

import collections
import datetime
import re

from peewee import fn

from accounts import securitylog
from billing import closing
from billing.models import FAILED, PENDING, SENT, BillingCustomer, BillingEvent
from models import Organisation, db, start_of_hour, utcnow
from orgs import orgadmin
from store.writelock import write_transaction

# What every target takes as a customer, subscription or subject: printable ASCII, no spaces.
CUSTOMER = re.compile(r"[\x21-\x7e]{1,255}")

Status = collections.namedtuple("Status", "slug customer since last_sent pending failed")


def checked_customer(text):
    customer = (text or "").strip()
    if not CUSTOMER.fullmatch(customer):
        raise ValueError("A billing customer is the billing system's id for it (such as cus_NffrFeUfNV2Hib), "
                         "1 to 255 printable characters without spaces.")
    return customer


def set_customer(org_id, text, actor=None, now=None):
    """Give the organisation its billing customer (None: stop exporting it), for actor (a
    User whose role must allow managing it; None: the command line). Hours from the current one
    on are exported under it; those already closed keep the customer they had. Return the row, or
    None when it stopped. ValueError with a sentence for a customer refused."""
    now = now or utcnow()
    customer = checked_customer(text) if text is not None else None
    with db.atomic():
        orgadmin.holding(org_id, actor)
        row = BillingCustomer.get_or_none(BillingCustomer.org == org_id)
        if customer is None:
            if row is not None:
                row.delete_instance()
                securitylog.record_in(org_id, "org.billing_customer_removed", f"was {row.customer}")
            return None
        if row is None:
            hour = start_of_hour(now)
            row = BillingCustomer.create(org=org_id, customer=customer, since=hour, closed_through=hour, changed_at=now)
        elif row.customer != customer:
            row.customer, row.changed_at = customer, now
            row.save()
        else:
            return row
        securitylog.record_in(org_id, "org.billing_customer_set", customer)
        return row


def customer_of(org_id):
    return BillingCustomer.get_or_none(BillingCustomer.org == org_id)


def status(org_ids=None):
    """A Status for each exported organisation (or those of org_ids), by slug."""
    query = (BillingCustomer.select(BillingCustomer, Organisation.id, Organisation.slug).join(Organisation)
             .order_by(Organisation.slug))
    if org_ids is not None:
        query = query.where(BillingCustomer.org.in_(org_ids))
    customers = list(query)
    # With the organisation joined, peewee leaves org_id unset: its id is on row.org.
    ids = [row.org.id for row in customers]
    last_sent = dict(BillingEvent.select(BillingEvent.org, fn.MAX(BillingEvent.hour))
                     .where(BillingEvent.org.in_(ids) & (BillingEvent.state == SENT))
                     .group_by(BillingEvent.org).tuples())
    hours = collections.defaultdict(collections.Counter)
    for org_id, state, count in (BillingEvent.select(BillingEvent.org, BillingEvent.state,
                                                     fn.COUNT(fn.DISTINCT(BillingEvent.hour)))
                                 .where(BillingEvent.org.in_(ids) & BillingEvent.state.in_([PENDING, FAILED]))
                                 .group_by(BillingEvent.org, BillingEvent.state).tuples()):
        hours[org_id][state] = count
    return [Status(row.org.slug, row.customer, row.since,
                   last_sent.get(row.org.id) and BillingEvent.hour.python_value(last_sent[row.org.id]),
                   hours[row.org.id][PENDING], hours[row.org.id][FAILED]) for row in customers]


def resend(config, org_id, since, now=None):
    """Send the organisation's hours from `since` again: those that failed are due now with their
    schedule anew, and those never sent (before its customer was given, or forgotten) are closed
    now under its customer. Hours accepted already are left as they are: a resend of them would be
    harmless by its identifiers, but Stripe keeps identifiers only for a while. Return the number
    of events due."""
    now = now or utcnow()
    customer = customer_of(org_id)
    if customer is None:
        raise ValueError("The organisation has no billing customer: give it one first "
                         "(orgs billing SLUG --customer ID).")
    start = start_of_hour(since)
    with write_transaction(db.obj):
        failed = (BillingEvent.update(state=PENDING, attempts=0, next_attempt_at=now, error=None)
                  .where((BillingEvent.org == org_id) & (BillingEvent.state == FAILED) & (BillingEvent.hour >= start))
                  .execute())
        # The hours closed for the customer: those still open follow in their time.
        made = closing.events(config["BILLING_EXPORT"], org_id, closing.totals(org_id, start, customer.closed_through),
                              closing.meters_of(config))
        written = closing.write_events(config["BILLING_EXPORT"], org_id, customer.customer, made, now)
    return failed + written


def parse_time(text):
    """A UTC time as `billing` takes it: 2026-11-28, 2026-11-28T10, 2026-11-28T10:00 (Z optional)."""
    value = text.strip().rstrip("Zz")
    for form in ("%Y-%m-%d", "%Y-%m-%dT%H", "%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M"):
        try:
            return datetime.datetime.strptime(value, form)
        except ValueError:
            continue
    raise ValueError(f"{text!r} is not a UTC time such as 2026-11-28 or 2026-11-28T10:00.")
