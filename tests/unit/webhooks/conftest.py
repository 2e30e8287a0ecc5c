"""The webhook tests' app (limits in memory, a retry schedule of 1 s and 1 s, receivers on
127.0.0.1 allowed), a local receiver that verifies every delivery with `standardwebhooks`, and
alice's endpoint at it."""

import pytest
from webhookreceiver import receiving

from webhooks import endpoints


@pytest.fixture
def app(make_app, database_url):
    app = make_app({
        "DATABASE_URL": database_url, "RATELIMIT_STORAGE_URL": "memory://", "RATE_LIMIT_TIERS": "free=5/minute",
        "PUBLIC_RATE_LIMIT": "off", "TESTING": True, "WTF_CSRF_ENABLED": False,
        "WEBHOOK_RETRY_SCHEDULE": "1s,1s", "WEBHOOK_ALLOW_PRIVATE": True,
    })
    with app.app_context():
        yield app


@pytest.fixture
def receiver():
    with receiving() as receiver:
        yield receiver


@pytest.fixture
def hook(app, user, receiver):
    """alice's endpoint at the receiver, subscribed to every event; the receiver holds its secret."""
    endpoint, secret = endpoints.add_endpoint(user, f"{receiver.url}/alice")
    receiver.secrets["/alice"] = secret
    return endpoint
