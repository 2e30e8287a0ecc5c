"""The Security tab's webhook section in-process: Send test event returns to the endpoint's own
section, and the endpoint's attempts list is served alone (for the page's script) to its owner only,
saying whether a test event still waits for its first attempt."""

import pytest
from webhookreceiver import receiving

from accounts import users
from webhooks import delivery, endpoints


@pytest.fixture
def app(make_app, database_url):
    app = make_app({
        "DATABASE_URL": database_url, "RATELIMIT_STORAGE_URL": "memory://", "PUBLIC_RATE_LIMIT": "off",
        "TESTING": True, "WTF_CSRF_ENABLED": False, "WEBHOOK_ALLOW_PRIVATE": True,
    })
    with app.app_context():
        yield app


@pytest.fixture
def hook(app, user):
    """Alice's endpoint at a live receiver that answers 204."""
    with receiving() as receiver:
        endpoint, secret = endpoints.add_endpoint(user, f"{receiver.url}/alice")
        receiver.secrets["/alice"] = secret
        yield endpoint


def test_send_test_event_returns_to_the_endpoints_section(logged_in, hook):
    response = logged_in.post(f"/settings/security/webhooks/{hook.id}/test")
    assert response.status_code == 302
    assert response.location.endswith(f"/settings/security#webhook-{hook.id}")
    page = logged_in.get("/settings/security").text
    assert f'id="webhook-{hook.id}" aria-labelledby="webhook-{hook.id}-url" tabindex="-1"' in page
    assert "is on its way" in page


def test_the_attempts_list_waits_for_the_test_events_attempt_then_shows_it(app, logged_in, hook):
    url = f"/settings/security/webhooks/{hook.id}/attempts"
    before = logged_in.get(url)
    assert before.status_code == 200 and before.mimetype == "text/html"
    assert before.headers["Cache-Control"] == "no-store"
    assert "data-waiting" not in before.text and "No attempts yet." in before.text

    message = endpoints.send_test(hook)
    waiting = logged_in.get(url).text
    assert f'id="webhook-{hook.id}-attempts"' in waiting and "data-waiting" in waiting
    assert message.message_id in waiting and 'role="status"' in waiting

    delivery.deliver_due(app)
    after = logged_in.get(url).text
    assert "data-waiting" not in after and "is on its way" not in after
    assert '<tr class="attempt">' in after and "webhook.test" in after and "HTTP 204" in after


def test_the_attempts_list_is_its_owners_alone(client, logged_in, user, hook):
    bob = users.create_user("bob", "bob@example.com", "correct horse battery")
    bobs, _ = endpoints.add_endpoint(bob, "http://127.0.0.1:9/bob")
    assert logged_in.get(f"/settings/security/webhooks/{bobs.id}/attempts").status_code == 404
    assert logged_in.get("/settings/security/webhooks/999999/attempts").status_code == 404
    assert logged_in.post(f"/settings/security/webhooks/{hook.id}/attempts").status_code == 405
    logged_in.post("/logout")
    assert client.get(f"/settings/security/webhooks/{hook.id}/attempts").status_code == 401
    # A script's question leaves no "log in first" for the next page a person opens.
    assert "Log in first" not in client.get("/login").text
