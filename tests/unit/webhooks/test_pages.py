"""The Security tab's webhook section in-process: Send test event returns to the endpoint's own
section, and the endpoint's attempts list is served alone (for the page's script) to its owner only,
saying whether a test event still waits for its first attempt."""

import re

import pytest
from webhookreceiver import receiving

from accounts import users
from webhooks import delivery, endpoints
from webhooks.models import FAILED, PENDING, WebhookMessage


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


def test_each_attempt_has_a_resend_button_that_sends_its_message_again(app, logged_in, hook):
    message = endpoints.send_test(hook)
    delivery.deliver_due(app)
    attempts = logged_in.get(f"/settings/security/webhooks/{hook.id}/attempts").text
    assert f'name="message_id" value="{message.message_id}"' in attempts
    assert f'aria-label="Resend {message.message_id}"' in attempts
    response = logged_in.post(f"/settings/security/webhooks/{hook.id}/resend", data={"message_id": message.message_id})
    assert response.status_code == 302 and response.location.endswith(f"#webhook-{hook.id}")
    assert f"{message.message_id} is being sent again" in logged_in.get("/settings/security").text
    [(claimed, _, state)] = delivery.deliver_due(app)
    assert (claimed.message_id, claimed.number, state) == (message.message_id, 2, "delivered")


def test_a_resend_of_another_endpoints_or_an_unknown_message_is_a_404(app, logged_in, user, hook):
    other, _ = endpoints.add_endpoint(user, "http://127.0.0.1:9/other")
    elsewhere = endpoints.send_test(other)
    for message_id in [elsewhere.message_id, "msg_nothing", "", "x" * 5000, "msg_\x00x"]:
        response = logged_in.post(f"/settings/security/webhooks/{hook.id}/resend", data={"message_id": message_id})
        assert response.status_code == 404, message_id


def test_an_eleventh_resend_in_a_minute_is_refused_with_its_reason(app, logged_in, hook):
    message = endpoints.send_test(hook)
    delivery.deliver_due(app)
    for _ in range(10):
        assert logged_in.post(f"/settings/security/webhooks/{hook.id}/resend",
                              data={"message_id": message.message_id}).status_code == 302
        delivery.deliver_due(app)
    refused = logged_in.post(f"/settings/security/webhooks/{hook.id}/resend", data={"message_id": message.message_id})
    assert refused.status_code == 409
    assert "This endpoint has had 10 resends in the last minute" in refused.text


def test_recover_failed_messages_says_how_many(app, logged_in, hook):
    failed = endpoints.send_test(hook)
    WebhookMessage.update(state=FAILED, next_attempt_at=None).execute()
    response = logged_in.post(f"/settings/security/webhooks/{hook.id}/recover", data={"since": "1h"})
    assert response.status_code == 302
    assert "1 failed message of the last hour is being sent to" in logged_in.get("/settings/security").text
    assert WebhookMessage.get_by_id(failed.id).state == PENDING
    assert logged_in.post(f"/settings/security/webhooks/{hook.id}/recover", data={"since": "1y"}).status_code == 400


def test_rotate_shows_the_new_secret_once_and_the_overlap(app, logged_in, hook):
    response = logged_in.post(f"/settings/security/webhooks/{hook.id}/rotate", data={"overlap": "24h"})
    assert response.status_code == 302
    page = logged_in.get("/settings/security").text
    [secret] = re.findall(r">(whsec_[A-Za-z0-9+/=]+)<", page)
    assert "The new signing secret of" in page and "each delivery carries\n          two signatures" in page
    assert "the old one signs each delivery too until" in page
    assert secret not in logged_in.get("/settings/security").text
    assert delivery.secrets_in_force(hook.id)[0] == secret
    assert logged_in.post(f"/settings/security/webhooks/{hook.id}/rotate", data={"overlap": "30d"}).status_code == 400
    assert logged_in.post(f"/settings/security/webhooks/{hook.id}/rotate", data={"overlap": "0"}).status_code == 302
    assert "The old secret no longer signs" in logged_in.get("/settings/security").text
    assert len(delivery.secrets_in_force(hook.id)) == 1


def test_the_resend_button_of_a_forgotten_message_says_it_is_no_longer_kept(app, logged_in, hook):
    message = endpoints.send_test(hook)
    delivery.deliver_due(app)
    WebhookMessage.delete().execute()  # forgotten a week on; its attempt is still listed
    response = logged_in.post(f"/settings/security/webhooks/{hook.id}/resend", data={"message_id": message.message_id})
    assert response.status_code == 409
    assert f"{message.message_id} is no longer kept: messages are forgotten a week after they were made." in response.text
