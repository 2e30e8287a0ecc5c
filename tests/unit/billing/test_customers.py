"""An organisation's billing customer, given by an owner on the Organisation tab or with `orgs
billing`, and the `billing` commands: status, export (CloudEvents as JSON Lines) and resend."""

import datetime
import json
import re

import pytest

from accounts import securitylog, users
from billing import closing, customers, sender
from billing.models import FAILED, PENDING, SENT, BillingCustomer, BillingEvent
from models import Membership, start_of_hour, utcnow
from orgs import members
from tests.unit.billing.conftest import HOUR, exported_since, write_usage

BILLING = "/settings/organisation/billing"
ONE_HOUR = datetime.timedelta(hours=1)


def logged_in_as(app, username):
    client = app.test_client()
    assert client.post("/login", data={"username": username, "password": "correct horse battery"}).status_code == 302
    return client


def org_id_of(page):
    return re.search(r'name="org_id" value="(\d+)"', page)[1]


def test_an_owner_gives_the_customer_on_the_organisation_tab_and_it_starts_with_this_hour(billing_app, org):
    client = logged_in_as(billing_app, "carol")
    page = client.get("/settings/organisation").text
    assert "carol's usage is not exported: it has no billing customer." in page
    response = client.post(BILLING, data={"org_id": org_id_of(page), "customer": " subject-42 "})
    assert response.status_code == 302
    page = client.get(response.location).text
    assert "usage is exported as customer subject-42" in page
    assert '<dt>Customer</dt><dd><code>subject-42</code></dd>' in page
    row = customers.customer_of(org.id)
    assert (row.customer, row.since, row.closed_through) == ("subject-42", start_of_hour(row.changed_at), row.since)
    assert securitylog.SecurityEvent.get(securitylog.SecurityEvent.event == "org.billing_customer_set").detail == \
        "subject-42"
    response = client.post(BILLING, data={"org_id": org.id, "action": "remove"})
    page = client.get(response.location).text
    assert "usage is exported no more after the hour under way, which still goes out." in page
    assert "none: removed, its\n          hours until" in page
    assert customers.customer_of(org.id).customer is None


@pytest.mark.parametrize("customer", ["", "has space", "x" * 256, "tab\there", "ünïcode"])
def test_a_customer_no_billing_system_takes_is_a_400_with_a_sentence(billing_app, org, customer):
    client = logged_in_as(billing_app, "carol")
    response = client.post(BILLING, data={"org_id": org.id, "customer": customer})
    assert response.status_code == 400
    assert "1 to 255 printable characters without spaces" in response.text
    assert BillingCustomer.select().count() == 0


def test_only_an_owner_may_give_it_and_a_form_of_another_organisation_changes_nothing(billing_app, owner, org):
    team = members.create("Team", owner)
    admin = users.create_user("dora", "dora@example.com", "correct horse battery")
    Membership.create(org=team.id, user=admin.id, role="admin")
    client = logged_in_as(billing_app, "dora")
    client.post("/orgs/switch", data={"org": team.slug})
    page = client.get("/settings/organisation").text
    assert 'id="billing-customer"' not in page
    assert client.post(BILLING, data={"org_id": team.id, "customer": "cus_1"}).status_code == 403
    carol = logged_in_as(billing_app, "carol")
    assert carol.post(BILLING, data={"org_id": team.id, "customer": "cus_1"}).status_code == 409
    assert BillingCustomer.select().count() == 0


def test_with_the_export_off_the_tab_has_no_billing_and_the_form_is_not_found(make_app, database_url):
    app = make_app({"DATABASE_URL": database_url, "RATELIMIT_STORAGE_URL": "memory://", "TESTING": True,
                    "WTF_CSRF_ENABLED": False})
    with app.app_context():
        users.create_user("carol", "carol@example.com", "correct horse battery")
        client = logged_in_as(app, "carol")
        assert 'id="billing-heading"' not in client.get("/settings/organisation").text
        assert client.post(BILLING, data={"customer": "cus_1"}).status_code == 404


def test_orgs_billing_gives_and_removes_the_customer(billing_app, org):
    runner = billing_app.test_cli_runner()
    result = runner.invoke(args=["orgs", "billing", org.slug, "--customer", "cus_NffrFeUfNV2Hib"])
    assert result.exit_code == 0, result.output
    assert f"{org.slug} is exported as customer cus_NffrFeUfNV2Hib: its hours from" in result.output
    assert runner.invoke(args=["orgs", "billing", org.slug]).exit_code == 1
    assert "1 to 255 printable" in runner.invoke(args=["orgs", "billing", org.slug, "--customer", "a b"]).output
    assert "exported no more after the hour under way" in runner.invoke(args=["orgs", "billing", org.slug,
                                                                              "--remove"]).output


def test_billing_status_says_where_each_organisation_stands(billing_app, org, two_keys):
    exported_since(org, HOUR)
    write_usage(two_keys[0], HOUR, requests=3)
    write_usage(two_keys[0], HOUR + ONE_HOUR, requests=2)
    write_usage(two_keys[0], HOUR + 2 * ONE_HOUR, requests=2)
    closing.close(billing_app.config, now=HOUR + 3 * ONE_HOUR + datetime.timedelta(minutes=3))
    first, second, third = BillingEvent.select().order_by(BillingEvent.hour)
    BillingEvent.update(state=SENT).where(BillingEvent.id == first.id).execute()
    BillingEvent.update(state=FAILED).where(BillingEvent.id == second.id).execute()
    output = billing_app.test_cli_runner().invoke(args=["billing", "status"]).output
    assert output.splitlines() == [
        "Export: cloudevents",
        f"{org.slug}  customer cus_test  last hour sent {HOUR:%Y-%m-%dT%H:%M:%S}Z  pending 1  failed 1"]


def test_billing_export_prints_the_cloudevents_of_any_hours_whatever_the_export(billing_app, org, two_keys):
    write_usage(two_keys[0], HOUR, requests=3, credits=2)
    write_usage(two_keys[1], HOUR + ONE_HOUR, requests=1)
    write_usage(two_keys[1], HOUR + 2 * ONE_HOUR, requests=9)
    billing_app.config["BILLING_EXPORT"] = "off"
    result = billing_app.test_cli_runner().invoke(args=[
        "billing", "export", "--since", f"{HOUR:%Y-%m-%dT%H}", "--until", f"{HOUR + 2 * ONE_HOUR:%Y-%m-%dT%H:%M}Z"])
    assert result.exit_code == 0, result.output
    events = [json.loads(line) for line in result.output.splitlines()]
    assert [(event["type"], event["data"]["value"], event["data"]["key_id"]) for event in events] == [
        ("api_requests", 3, two_keys[0].id), ("api_credits", 2, two_keys[0].id), ("api_requests", 1, two_keys[1].id)]
    assert {(event["specversion"], event["source"], event["subject"], event["data"]["org"]) for event in events} == {
        ("1.0", "urn:api-key-service", org.slug, org.slug)}
    assert events[0]["id"] == f"{two_keys[0].id}-api_requests-{HOUR:%Y%m%d%H}"
    assert events[0]["time"] == f"{HOUR:%Y-%m-%dT%H:%M:%S}Z"


def test_billing_export_refuses_a_time_it_cannot_read(billing_app):
    result = billing_app.test_cli_runner().invoke(args=["billing", "export", "--since", "yesterday"])
    assert (result.exit_code, "is not a UTC time such as 2026-11-28" in result.output) == (1, True)


def test_resend_makes_failed_hours_due_and_sends_the_hours_before_the_customer(billing_app, org, two_keys):
    key = two_keys[0]
    write_usage(key, HOUR - 2 * ONE_HOUR, requests=5)
    exported_since(org, HOUR)
    write_usage(key, HOUR, requests=3)
    write_usage(key, HOUR + ONE_HOUR, requests=4)
    closing.close(billing_app.config, now=HOUR + 2 * ONE_HOUR + datetime.timedelta(minutes=3))
    failed, sent = BillingEvent.select().order_by(BillingEvent.hour)
    BillingEvent.update(state=FAILED, attempts=3, next_attempt_at=None).where(BillingEvent.id == failed.id).execute()
    BillingEvent.update(state=SENT).where(BillingEvent.id == sent.id).execute()
    result = billing_app.test_cli_runner().invoke(args=[
        "billing", "resend", "--org", org.slug, "--since", f"{HOUR - 3 * ONE_HOUR:%Y-%m-%dT%H}"])
    assert result.exit_code == 0, result.output
    assert f"2 billing events of {org.slug} due now" in result.output
    rows = {(row.hour, row.value, row.state, row.attempts) for row in BillingEvent.select()}
    assert rows == {(HOUR - 2 * ONE_HOUR, 5, PENDING, 0), (HOUR, 3, PENDING, 0), (HOUR + ONE_HOUR, 4, SENT, 0)}
    assert sender.due_exists("cloudevents", now=utcnow())


def test_resend_of_an_organisation_without_a_customer_says_so(billing_app, org):
    result = billing_app.test_cli_runner().invoke(args=["billing", "resend", "--org", org.slug,
                                                        "--since", "2026-01-01"])
    assert (result.exit_code, "has no billing customer" in result.output) == (1, True)


def test_a_customer_is_one_organisation_s(billing_app, owner, org):
    """Else an owner could send its usage to another organisation's customer."""
    team = members.create("Team", owner)
    customers.set_customer(org.id, "cus_shared")
    with pytest.raises(ValueError, match="Another organisation has that billing customer"):
        customers.set_customer(team.id, "cus_shared")
    assert BillingCustomer.get_or_none(BillingCustomer.org == team.id) is None
