"""webhooks/periodic.py: `key.expiring` and `key.expired` sent once each, and old messages
forgotten in batches."""

import datetime

from models import utcnow
from orgs import keyactions
from webhooks import delivery, outbox, periodic
from webhooks.models import DELIVERED, WebhookMessage


def test_expiring_and_expired_are_sent_once_each(app, user, hook, receiver):
    soon, _ = keyactions.issue_key(user, "Soon", "production", expires_in=3 * 86400)
    keyactions.issue_key(user, "Later", "production", expires_in=30 * 86400)
    delivery.deliver_due(app)
    receiver.deliveries.clear()
    assert periodic.run() == 1 and periodic.run() == 0
    after_expiry = utcnow() + datetime.timedelta(days=3, hours=12)
    assert periodic.run(now=after_expiry) == 1 and periodic.run(now=after_expiry) == 0
    delivery.deliver_due(app)
    expiring, expired = sorted(receiver.wait_for(2), key=lambda sent: sent.payload["type"])[::-1]
    assert expiring.payload["type"] == "key.expiring" and expired.payload["type"] == "key.expired"
    for event in (expiring, expired):
        assert event.verified["data"] == {"key_id": soon.id, "key_name": "Soon", "key_prefix": soon.display_prefix,
                                          "expires_at": event.verified["data"]["expires_at"], "org": "alice",
                                          "actor": None}


def test_old_messages_are_forgotten_in_batches_until_none_is_left(app, hook, monkeypatch):
    monkeypatch.setattr(periodic, "BATCH", 10)
    monkeypatch.setattr(periodic, "PAUSE_SECONDS", 0, raising=False)
    week_ago = utcnow() - periodic.MESSAGES_KEPT_FOR - datetime.timedelta(minutes=1)
    WebhookMessage.insert_many([{"endpoint": hook.id, "message_id": outbox.new_message_id(), "event": "webhook.test",
                                 "body": "{}", "created_at": week_ago, "state": DELIVERED}
                                for _ in range(25)]).execute()
    kept = outbox.write_test(hook)
    periodic.run()
    assert [message.id for message in WebhookMessage.select()] == [kept.id]
