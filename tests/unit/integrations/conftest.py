"""The app of tests/unit/integrations/test_github*.py: GitHub's secret scanning on, its keys read
from a loopback server of GitHub's keys signed by the module's signer, and bob, a user with a
verified address and a webhook endpoint."""

import pytest
from githubscanning import Signer, serving_keys

from accounts import users
from models import User, utcnow
from webhooks import endpoints


@pytest.fixture(scope="module")
def signer():
    return Signer("a" * 64)


@pytest.fixture
def keys(signer):
    with serving_keys(signer) as keys:
        yield keys


@pytest.fixture
def scanning(make_app, database_url, keys):
    """An app with GITHUB_SECRET_SCANNING on, its keys read from the loopback server."""
    app = make_app({"DATABASE_URL": database_url, "RATELIMIT_STORAGE_URL": "memory://", "TESTING": True,
                    "PUBLIC_RATE_LIMIT": "50/minute", "WTF_CSRF_ENABLED": False, "MAIL_URL": "console",
                    "PUBLIC_URL": "https://api.example.com", "WEBHOOK_ALLOW_PRIVATE": True,
                    "GITHUB_SECRET_SCANNING": True, "GITHUB_SECRET_SCANNING_KEYS_URL": keys.url})
    with app.app_context():
        yield app


@pytest.fixture
def client(scanning):
    return scanning.test_client()


@pytest.fixture
def bob(scanning):
    bob = users.create_user("bob", "bob@example.com", "correct horse battery")
    User.update(email_verified_at=utcnow()).where(User.id == bob.id).execute()
    endpoints.add_endpoint(bob, "http://127.0.0.1:9/hooks")
    return bob
