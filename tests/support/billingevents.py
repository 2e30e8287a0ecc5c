"""What each billing vendor's client sends, for the receivers of tests/support/billingreceiver.py:
a valid body of each vendor with an event for each identifier, and the request that posts it."""

import datetime
import json
import urllib.parse

import requests

TOKEN = "test-billing-token"
HOUR = datetime.datetime(2026, 1, 5, 10, tzinfo=datetime.UTC)
VENDORS = ["stripe", "lago", "openmeter", "cloudevents"]
# (path under the receiver's url, content type, how the body is written) as each vendor's client sends it
SENT_AS = {"stripe": ("/v1/billing/meter_events", "application/x-www-form-urlencoded", urllib.parse.urlencode),
           "lago": ("/api/v1/events/batch", "application/json", json.dumps),
           "openmeter": ("/api/v1/events", "application/cloudevents-batch+json", json.dumps),
           "cloudevents": ("", "application/cloudevents-batch+json", json.dumps)}
ACCEPTED = {"stripe": 200, "lago": 200, "openmeter": 204, "cloudevents": 202}


def stripe_fields(identifier="evt-1", customer="cus_1"):
    return {"event_name": "api_requests", "identifier": identifier, "timestamp": str(int(HOUR.timestamp())),
            "payload[stripe_customer_id]": customer, "payload[value]": "3", "payload[key_id]": "7",
            "payload[org]": "acme"}


def lago_event(identifier="evt-1", customer="cus_1"):
    return {"transaction_id": identifier, "external_subscription_id": customer, "code": "api_requests",
            "timestamp": int(HOUR.timestamp()), "properties": {"value": "3", "key_id": "7", "org": "acme"}}


def cloudevent(identifier="evt-1", customer="cus_1"):
    return {"specversion": "1.0", "id": identifier, "source": "urn:api-key-service", "type": "api_requests",
            "subject": customer, "time": "2026-01-05T10:00:00Z", "datacontenttype": "application/json",
            "data": {"value": 3, "key_id": "7", "org": "acme"}}


def body(vendor, *identifiers, customer="cus_1"):
    """A valid body of the vendor with an event for each identifier (Stripe takes one a call)."""
    if vendor == "stripe":
        return stripe_fields(*identifiers, customer=customer)
    if vendor == "lago":
        return {"events": [lago_event(identifier, customer) for identifier in identifiers]}
    return [cloudevent(identifier, customer) for identifier in identifiers]


def post(receiver, vendor, sent, token=TOKEN, content_type=None, idempotency_key=None):
    path, media_type, written = SENT_AS[vendor]
    headers = {"Content-Type": content_type or media_type}
    if idempotency_key:
        headers["Idempotency-Key"] = idempotency_key
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return requests.post(receiver.url + path, data=written(sent), headers=headers, timeout=10)
