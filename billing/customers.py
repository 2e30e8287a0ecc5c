"""Each organisation's billing customer, what its export stands at (`billing status`, the
Organisation tab), and sending hours again (`billing resend`)."""

import collections
import datetime
import re

from peewee import IntegrityError, fn

from accounts import securitylog
from billing import closing
from billing.models import FAILED, PENDING, SENT, BillingCustomer, BillingEvent, BillingPeriod
from models import Organisation, db, start_of_hour, utcnow
from orgs import orgadmin
from store.writelock import write_transaction

# What every target takes as a customer, subscription or subject: printable ASCII, no spaces.
CUSTOMER = re.compile(r"[\x21-\x7e]{1,255}")

# until: for an organisation whose customer was removed, the end of its last hour that still goes out.
Status = collections.namedtuple("Status", "slug customer since last_sent pending failed until")


def checked_customer(text):
    customer = (text or "").strip()
    if not CUSTOMER.fullmatch(customer):
        raise ValueError("A billing customer is the billing system's id for it (such as cus_NffrFeUfNV2Hib), "
                         "1 to 255 printable characters without spaces.")
    return customer


def set_customer(org_id, text, actor=None, now=None):
    """Give the organisation its billing customer (None: stop exporting it), for actor (a User
    whose role must allow managing it; None: the command line); return the organisation's
    BillingCustomer, or None once it is exported no more.

    The first customer takes the hours from the current one on. A change or a removal takes
    effect at the end of the hour under way, which stays with the customer it began with: an hour
    is never split, skipped or moved to another customer after it was used, however the customer
    is changed, removed and given again. ValueError with a sentence for a customer refused, or one
    another organisation has."""
    now = now or utcnow()
    customer = checked_customer(text) if text is not None else None
    hour = start_of_hour(now)
    next_hour = hour + closing.HOUR
    try:
        with db.atomic():
            orgadmin.holding(org_id, actor)
            position = BillingCustomer.get_or_none(BillingCustomer.org == org_id)
            if position is None and customer is None:
                return None
            if position is None:
                position = BillingCustomer.create(org=org_id, customer=customer, since=hour, closed_through=hour,
                                                  changed_at=now)
                BillingPeriod.create(org=org_id, customer=customer, starts=hour)
            elif position.customer == customer:
                return position
            else:
                change_periods(org_id, customer, hour, next_hour)
                before = position.customer
                position.customer, position.changed_at = customer, now
                position.save()
                if customer is None:
                    securitylog.record_in(org_id, "org.billing_customer_removed",
                                          f"was {before}; its hours until {next_hour:%Y-%m-%d %H:00} UTC still go out")
                    return position
            securitylog.record_in(org_id, "org.billing_customer_set", customer)
            return position
    except IntegrityError:
        raise ValueError("Another organisation has that billing customer: each customer pays for one "
                         "organisation's usage.") from None


def change_periods(org_id, customer, hour, next_hour):
    """The periods after a change made in the hour starting at `hour`: the period under way ends
    with it, one made for the next hour gives way, and `customer` (None: none) takes the next hour
    on; with no period under way (removed in an earlier hour), it takes this hour on."""
    BillingPeriod.delete().where((BillingPeriod.org == org_id) & (BillingPeriod.starts >= next_hour)).execute()
    current = (BillingPeriod.select().where((BillingPeriod.org == org_id) & (BillingPeriod.starts <= hour)
                                            & (BillingPeriod.ends.is_null() | (BillingPeriod.ends > hour)))
               .order_by(BillingPeriod.starts.desc()).first())
    if current is not None and current.customer == customer:
        current.ends = None  # given again within the hour it was removed or changed in
        current.save()
        return
    if current is not None:
        current.ends = next_hour
        current.save()
    if customer is not None:
        BillingPeriod.create(org=org_id, customer=customer, starts=next_hour if current is not None else hour)


def first_hour_of(org_id, customer):
    """The first hour that goes to the customer in its latest period."""
    return (BillingPeriod.select().where((BillingPeriod.org == org_id) & (BillingPeriod.customer == customer))
            .order_by(BillingPeriod.starts.desc()).first().starts)


def customer_of(org_id):
    return BillingCustomer.get_or_none(BillingCustomer.org == org_id)


def status(target, org_ids=None):
    """A Status for each exported organisation (or those of org_ids), by slug, counting the events
    of `target` (BILLING_EXPORT's) alone."""
    query = (BillingCustomer.select(BillingCustomer, Organisation.id, Organisation.slug).join(Organisation)
             .order_by(Organisation.slug))
    if org_ids is not None:
        query = query.where(BillingCustomer.org.in_(org_ids))
    positions = list(query)
    # With the organisation joined, peewee leaves org_id unset: its id is on row.org.
    ids = [row.org.id for row in positions]
    of_target = BillingEvent.org.in_(ids) & (BillingEvent.target == target)
    last_sent = dict(BillingEvent.select(BillingEvent.org, fn.MAX(BillingEvent.hour))
                     .where(of_target & (BillingEvent.state == SENT)).group_by(BillingEvent.org).tuples())
    hours = collections.defaultdict(collections.Counter)
    for org_id, state, count in (BillingEvent.select(BillingEvent.org, BillingEvent.state,
                                                     fn.COUNT(fn.DISTINCT(BillingEvent.hour)))
                                 .where(of_target & BillingEvent.state.in_([PENDING, FAILED]))
                                 .group_by(BillingEvent.org, BillingEvent.state).tuples()):
        hours[org_id][state] = count
    last_ends = dict(BillingPeriod.select(BillingPeriod.org, fn.MAX(BillingPeriod.ends))
                     .where(BillingPeriod.org.in_(ids)).group_by(BillingPeriod.org).tuples())
    return [Status(row.org.slug, row.customer, row.since,
                   last_sent.get(row.org.id) and BillingEvent.hour.python_value(last_sent[row.org.id]),
                   hours[row.org.id][PENDING], hours[row.org.id][FAILED],
                   None if row.customer else BillingPeriod.ends.python_value(last_ends.get(row.org.id)))
            for row in positions]


def resend(config, org_id, since, now=None):
    """Send the organisation's hours from `since` again, an hour a transaction: the events that
    failed are due now with their schedule anew, and the hours with no event (before its first
    customer, which takes them, or within its periods) are closed now. Events accepted already are
    left as they are (a resend would be harmless by their identifiers, but Stripe keeps
    identifiers only for a while), and they are kept as long as the hourly usage rows: an hour
    whose usage is still here cannot be sent twice. Return the number of events due."""
    now = now or utcnow()
    position = customer_of(org_id)
    if position is None:
        raise ValueError("The organisation has no billing customer: give it one first "
                         "(orgs billing SLUG --customer ID).")
    org = Organisation.get_by_id(org_id)
    start = start_of_hour(since)
    first = BillingPeriod.select(fn.MIN(BillingPeriod.starts)).where(BillingPeriod.org == org_id).scalar()
    first = BillingPeriod.starts.python_value(first) if first is not None else position.closed_through
    due = 0
    with write_transaction(db.obj):
        due += (BillingEvent.update(state=PENDING, attempts=0, next_attempt_at=now, error=None)
                .where((BillingEvent.org == org_id) & (BillingEvent.state == FAILED) & (BillingEvent.hour >= start)
                       & (BillingEvent.target == config["BILLING_EXPORT"])).execute())
    hour = start
    while hour < position.closed_through:
        with write_transaction(db.obj):
            if hour >= first or position.customer:
                due += closing.write_hours(config, org, hour, hour + closing.HOUR, now,
                                           customer=position.customer if hour < first else None)
        hour += closing.HOUR
    return due


def parse_time(text):
    """A UTC time as `billing` takes it: 2026-11-28, 2026-11-28T10, 2026-11-28T10:00 (Z optional)."""
    value = text.strip().rstrip("Zz")
    for form in ("%Y-%m-%d", "%Y-%m-%dT%H", "%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M"):
        try:
            return datetime.datetime.strptime(value, form)
        except ValueError:
            continue
    raise ValueError(f"{text!r} is not a UTC time such as 2026-11-28 or 2026-11-28T10:00.")
