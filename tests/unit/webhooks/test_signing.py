"""webhooks/signing.py: a secret is whsec_ and 24 random bytes, stored sealed; a delivery's
signature is the one the `standardwebhooks` library makes and verifies, over the bytes sent."""

import base64
import datetime
import re

from standardwebhooks import Webhook

from webhooks import delivery, endpoints, signing
from webhooks.models import DELIVERED, WebhookEndpoint


def test_a_secret_is_whsec_and_the_base64_of_24_random_bytes():
    secret = signing.new_secret()
    assert secret.startswith("whsec_") and len(base64.b64decode(secret[6:], validate=True)) == 24
    assert signing.new_secret() != secret


def test_the_signature_is_hmac_sha256_of_id_timestamp_body_as_the_library_computes_it():
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    body = b'{"type":"webhook.test","timestamp":"2026-11-22T00:53:39.123Z","data":{}}'
    headers = signing.headers([secret], "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body)
    # The library's own signing of the same message, and a known answer, computed independently.
    expected = Webhook(secret).sign("msg_p5jXN8AQM9LWM0D4loKWxJek",
                                    datetime.datetime.fromtimestamp(1614265330, datetime.UTC), body.decode())
    assert headers["webhook-signature"] == expected
    assert headers["webhook-timestamp"] == "1614265330" and headers["webhook-id"] == "msg_p5jXN8AQM9LWM0D4loKWxJek"


def test_a_delivery_verifies_with_the_library_and_keeps_its_bytes(app, hook, receiver):
    endpoint, secret = hook, receiver.secrets["/alice"]
    message = endpoints.send_test(endpoint)
    [(claimed, outcome, state)] = delivery.deliver_due(app)
    assert state == DELIVERED and outcome.status == 204
    [received] = receiver.received()
    assert received.error is None, received.error
    assert received.verified == {"type": "webhook.test", "timestamp": received.payload["timestamp"],
                                 "data": {"endpoint_id": endpoint.id, "url": endpoint.url, "org": "alice"}}
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", received.payload["timestamp"])
    assert received.headers["content-type"] == "application/json"
    assert received.message_id == message.message_id and received.message_id.startswith("msg_")
    assert received.body == message.body.encode()
    assert secret not in received.body.decode() and secret not in str(received.headers)


def test_the_secret_is_stored_sealed(app, hook, receiver):
    endpoint, secret = hook, receiver.secrets["/alice"]
    stored = WebhookEndpoint.get_by_id(endpoint.id).sealed_secret
    assert secret not in stored and secret[6:] not in stored and signing.unseal(stored) == secret
