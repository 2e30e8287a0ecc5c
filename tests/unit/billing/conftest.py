"""An app with the billing export on, an organisation with a customer, and usage rows written for
chosen hours."""

import datetime

import pytest

from accounts import users
from billing import customers
from models import UsageHour, personal_organisation, start_of_hour, utcnow
from orgs import keyactions

# An hour long ended: its events are due as soon as it is closed.
HOUR = start_of_hour(utcnow()) - datetime.timedelta(hours=5)


@pytest.fixture
def billing_app(make_app, database_url, request):
    target = getattr(request, "param", "cloudevents")
    app = make_app({"DATABASE_URL": database_url, "RATELIMIT_STORAGE_URL": "memory://", "PUBLIC_RATE_LIMIT": "off",
                    "TESTING": True, "WTF_CSRF_ENABLED": False, "BILLING_EXPORT": target,
                    "BILLING_URL": "http://127.0.0.1:9", "BILLING_API_KEY": "test-billing-token",
                    "BILLING_RETRY_SCHEDULE": "1m,5m"})
    with app.app_context():
        yield app


@pytest.fixture
def owner(billing_app):
    return users.create_user("carol", "carol@example.com", "correct horse battery")


@pytest.fixture
def org(owner):
    return personal_organisation(owner.id)


@pytest.fixture
def two_keys(owner):
    return [keyactions.issue_key(owner, name, "development", "free")[0] for name in ("one", "two")]


def exported_since(org, hour, customer="cus_test"):
    """Give org its customer as if it was given at `hour`."""
    return customers.set_customer(org.id, customer, now=hour)


def write_usage(key, hour, endpoint="protected_test", status=200, requests=1, credits=0):
    UsageHour.create(api_key=key.id, hour=hour, endpoint=endpoint, status=status, requests=requests, credits=credits)
