"""Closing hours: an ended hour, 2 minutes after its end, becomes events in the outbox with the
identifiers the contract fixes, summing exactly its successful requests and spent credits; the
usage clock keeps a closed hour from growing. On SQLite and PostgreSQL."""

import datetime

import pytest

from billing import closing, customers, sealing
from billing.models import PENDING, BillingEvent, BillingPeriod
from metering.usage import UsageCounter
from models import UsageHour, db, start_of_hour, utcnow
from orgs import keyactions, members, orgadmin
from tests.unit.billing.conftest import HOUR, exported_since, write_usage

ONE_HOUR = datetime.timedelta(hours=1)


def outbox():
    return {(row.identifier, row.quantity, row.meter, row.value, row.api_key_id, row.customer)
            for row in BillingEvent.select()}


def test_a_closed_hour_becomes_one_event_per_key_meter_and_hour(billing_app, org, two_keys):
    one, two = two_keys
    exported_since(org, HOUR)
    write_usage(one, HOUR, requests=7, credits=3)
    write_usage(one, HOUR, status=429, requests=5)
    write_usage(one, HOUR, endpoint="usage_stats", status=201, requests=2)
    write_usage(two, HOUR, status=403, requests=4)
    write_usage(two, HOUR + ONE_HOUR, requests=1, credits=1)
    stamp = HOUR.strftime("%Y%m%d%H")
    later = (HOUR + ONE_HOUR).strftime("%Y%m%d%H")

    assert closing.close(billing_app.config, now=HOUR + ONE_HOUR + datetime.timedelta(minutes=2)) == 2
    assert outbox() == {(f"{one.id}-api_requests-{stamp}", "requests", "api_requests", 9, one.id, "cus_test"),
                        (f"{one.id}-api_credits-{stamp}", "credits", "api_credits", 3, one.id, "cus_test")}
    assert closing.close(billing_app.config, now=HOUR + 2 * ONE_HOUR + datetime.timedelta(minutes=5)) == 2
    assert {row.identifier for row in BillingEvent.select().where(BillingEvent.hour == HOUR + ONE_HOUR)} == {
        f"{two.id}-api_requests-{later}", f"{two.id}-api_credits-{later}"}
    assert all(row.state == PENDING for row in BillingEvent.select())


def test_an_hour_is_not_closed_until_2_minutes_after_its_end(billing_app, org, two_keys):
    exported_since(org, HOUR)
    write_usage(two_keys[0], HOUR, requests=3)
    assert closing.close(billing_app.config, now=HOUR + ONE_HOUR + datetime.timedelta(seconds=119)) == 0
    assert closing.close(billing_app.config, now=HOUR + ONE_HOUR + datetime.timedelta(seconds=120)) == 1


@pytest.mark.parametrize("billing_app", ["stripe"], indirect=True)
def test_stripe_gets_one_event_per_organisation_meter_and_hour(billing_app, org, two_keys):
    one, two = two_keys
    exported_since(org, HOUR)
    write_usage(one, HOUR, requests=7, credits=2)
    write_usage(two, HOUR, requests=5)
    closing.close(billing_app.config, now=HOUR + 2 * ONE_HOUR)
    stamp = HOUR.strftime("%Y%m%d%H")
    assert outbox() == {(f"{org.id}-api_requests-{stamp}", "requests", "api_requests", 12, None, "cus_test"),
                        (f"{org.id}-api_credits-{stamp}", "credits", "api_credits", 2, None, "cus_test")}


def test_only_the_hours_from_its_customer_on_go_out_and_only_the_meters_named(billing_app, org, two_keys):
    billing_app.config["BILLING_METERS"] = "requests=calls"
    write_usage(two_keys[0], HOUR - ONE_HOUR, requests=4, credits=4)
    exported_since(org, HOUR)
    write_usage(two_keys[0], HOUR, requests=2, credits=2)
    closing.close(billing_app.config, now=HOUR + 2 * ONE_HOUR)
    assert [(row.meter, row.value) for row in BillingEvent.select()] == [("calls", 2)]


def test_an_organisation_without_a_customer_sends_nothing(billing_app, org, two_keys):
    write_usage(two_keys[0], HOUR, requests=4)
    assert closing.close(billing_app.config, now=HOUR + 2 * ONE_HOUR) == 0
    assert BillingEvent.select().count() == 0


def test_a_removed_customer_keeps_the_hour_under_way_and_then_the_organisation_is_exported_no_more(
        billing_app, org, two_keys):
    exported_since(org, HOUR)
    for offset in range(3):
        write_usage(two_keys[0], HOUR + offset * ONE_HOUR, requests=1 + offset)
    customers.set_customer(org.id, None, now=HOUR + datetime.timedelta(minutes=59))
    assert closing.close(billing_app.config, now=HOUR + 3 * ONE_HOUR + datetime.timedelta(minutes=2)) == 1
    assert [(row.hour, row.value) for row in BillingEvent.select()] == [(HOUR, 1)]
    assert customers.customer_of(org.id) is None and BillingPeriod.select().count() == 0


def test_a_customer_removed_and_given_again_skips_no_hour_and_a_change_moves_none(billing_app, org, two_keys):
    """Removing the customer at 10:59 and giving it again at 11:00:30 would otherwise send neither
    hour; changing it at 12:01 would otherwise send hour 11 to the new customer."""
    exported_since(org, HOUR, customer="cus_a")
    for offset in range(4):
        write_usage(two_keys[0], HOUR + offset * ONE_HOUR, requests=1)
    customers.set_customer(org.id, None, now=HOUR + datetime.timedelta(minutes=59))
    customers.set_customer(org.id, "cus_a", now=HOUR + ONE_HOUR + datetime.timedelta(seconds=30))
    customers.set_customer(org.id, "cus_b", now=HOUR + 2 * ONE_HOUR + datetime.timedelta(minutes=1))
    closing.close(billing_app.config, now=HOUR + 4 * ONE_HOUR + datetime.timedelta(minutes=2))
    assert [(row.hour, row.customer) for row in BillingEvent.select().order_by(BillingEvent.hour)] == [
        (HOUR, "cus_a"), (HOUR + ONE_HOUR, "cus_a"), (HOUR + 2 * ONE_HOUR, "cus_a"), (HOUR + 3 * ONE_HOUR, "cus_b")]


def test_a_deleted_organisation_s_last_hours_still_go_out(billing_app, owner, two_keys):
    team = members.create("Team", owner)
    key, _ = keyactions.issue_key(owner, "team key", "development", org=team.id)
    exported_since(team, HOUR, customer="cus_team")
    write_usage(key, HOUR, requests=3)
    closing.close(billing_app.config, now=HOUR + ONE_HOUR + datetime.timedelta(minutes=2))
    write_usage(key, start_of_hour(utcnow()), requests=5)
    orgadmin.delete(team.id)
    rows = {(row.hour, row.value, row.org_id, row.org_slug, row.state) for row in BillingEvent.select()}
    assert rows == {(HOUR, 3, None, "team", PENDING), (start_of_hour(utcnow()), 5, None, "team", PENDING)}


def test_a_closing_that_overlaps_another_writes_each_event_once(billing_app, org, two_keys):
    exported_since(org, HOUR)
    write_usage(two_keys[0], HOUR, requests=4)
    position = customers.customer_of(org.id)
    closing.close(billing_app.config, now=HOUR + 2 * ONE_HOUR)
    # A second process that read the position before the first moved it on.
    assert closing.close_organisation(billing_app.config, position, HOUR + ONE_HOUR, HOUR + 2 * ONE_HOUR) == 0
    assert BillingEvent.select().count() == 1


def test_a_usage_write_taken_before_the_seal_lands_in_the_oldest_open_hour(billing_app, two_keys):
    """The flush took its time just before the hour ended and commits after the hour was sealed:
    its counts go to the open hour, and the sealed hour, read already, never grows."""
    key = two_keys[0]
    counter = UsageCounter(db.obj, open_hour=sealing.open_hour)
    sealed = sealing.seal(HOUR + ONE_HOUR)
    counter.add(key.id, "protected_test", 200, True)
    counter.write(dict(counter.pending), sealing.open_hour(db.obj, HOUR + datetime.timedelta(minutes=59)))
    assert [(row.hour, row.requests) for row in UsageHour.select()] == [(sealed, 1)]
    assert sealed == HOUR + ONE_HOUR


def test_the_usage_flush_asks_the_clock_in_its_transaction(billing_app, two_keys):
    key = two_keys[0]
    sealing.seal(HOUR + 30 * ONE_HOUR)  # a clock ahead of now: every write lands in that hour
    counter = UsageCounter(db.obj, open_hour=sealing.open_hour)
    counter.add(key.id, "protected_test", 200, True)
    counter.flush()
    assert [row.hour for row in UsageHour.select()] == [HOUR + 30 * ONE_HOUR]


def test_the_clock_never_goes_back(billing_app):
    assert sealing.seal(HOUR + ONE_HOUR) == HOUR + ONE_HOUR
    assert sealing.seal(HOUR) == HOUR + ONE_HOUR
