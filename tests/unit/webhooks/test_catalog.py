"""The webhook event catalog: openapi.json's `webhooks` is what webhooks/catalog.py makes (and
regenerating changes nothing else in the file), it is valid OpenAPI 3.1 that openapi-core reads,
and every event, made for real by the service (web, command line, API, the periodic jobs, the hot
path), reaches a receiver as the catalog describes it, in every variant of its nullable fields.
The receiver (tests/support/webhookreceiver.py) checks every delivery of every test the same way."""

import copy
import datetime
import json

import pytest
from openapi_core import OpenAPI
from openapi_spec_validator import validate
from webhookreceiver import catalog_errors, receiving

import openapi
from models import ApiKey, utcnow
from orgs import keyactions, keyedits
from webhooks import catalog, delivery, endpoints, outbox, periodic
from webhooks.models import WebhookMessage

TEXT = openapi.PATH.read_text(encoding="utf-8")
DOCUMENT = json.loads(TEXT)
HEADERS = {"webhook-id": "msg_" + "a" * 24, "webhook-timestamp": "1795312800",
           "webhook-signature": "v1," + "A" * 43 + "="}


def test_openapi_json_holds_the_catalog_as_regenerating_writes_it():
    # Run `python -m webhooks.catalog` when this fails: the catalog changed and openapi.json did not.
    assert catalog.rewrite(TEXT) == TEXT
    assert list(DOCUMENT["webhooks"]) == list(catalog.EVENTS) == list(outbox.EVENTS)


def test_regenerating_rewrites_only_the_webhooks_member():
    stale = copy.deepcopy(DOCUMENT)
    stale["webhooks"]["key.revoked"]["post"]["summary"] = "stale"
    before = TEXT.replace(json.dumps(DOCUMENT["webhooks"]["key.revoked"]["post"]["summary"]), '"stale"', 1)
    assert json.loads(before) == stale
    assert catalog.rewrite(before) == TEXT
    # A document without the member gets it last, after everything it had, untouched.
    without = TEXT[:TEXT.index(',\n  "webhooks": ')] + "\n}\n"
    assert catalog.rewrite(without) == TEXT


def test_the_document_with_its_webhooks_is_valid_openapi_3_1():
    assert DOCUMENT["openapi"] == "3.1.0"
    validate(DOCUMENT)
    OpenAPI.from_dict(DOCUMENT)


def test_each_event_gives_its_body_headers_and_answers():
    for event, item in DOCUMENT["webhooks"].items():
        post = item["post"]
        assert post["security"] == [] and set(post["responses"]) == {"2XX", "default"}
        assert [(parameter["name"], parameter["in"], parameter["required"]) for parameter in post["parameters"]] == [
            ("webhook-id", "header", True), ("webhook-timestamp", "header", True),
            ("webhook-signature", "header", True)]
        media = post["requestBody"]["content"]["application/json"]
        body = media["schema"]
        assert body["required"] == ["type", "timestamp", "data"] and body["properties"]["type"]["const"] == event
        data = body["properties"]["data"]
        assert "additionalProperties" not in body and "additionalProperties" not in data
        assert "later release may add properties" in data["description"]
        assert set(data["required"]) <= set(data["properties"])
        assert catalog_errors(HEADERS, media["example"]) == []


def test_a_body_or_header_that_differs_from_the_catalog_is_named():
    example = DOCUMENT["webhooks"]["key.revoked"]["post"]["requestBody"]["content"]["application/json"]["example"]
    wrong_type = {**example, "data": {**example["data"], "key_id": "42"}}
    unlisted = {**example, "data": {**example["data"], "secret": "sk_live_..."}}
    missing = {**example, "data": {name: value for name, value in example["data"].items() if name != "actor"}}
    ms_less = {**example, "data": {**example["data"], "revoked_at": "2026-11-22T23:20:00.123Z"}}
    assert catalog_errors(HEADERS, wrong_type) == ["key.revoked body at $.data.key_id: '42' is not of type 'integer'"]
    assert "Additional properties are not allowed ('secret' was unexpected)" in catalog_errors(HEADERS, unlisted)[0]
    assert catalog_errors(HEADERS, missing) == ["key.revoked body at $.data: 'actor' is a required property"]
    assert "revoked_at" in catalog_errors(HEADERS, ms_less)[0]
    assert catalog_errors({**HEADERS, "webhook-timestamp": "soon"}, example)[0].startswith(
        "key.revoked header webhook-timestamp")
    assert catalog_errors(HEADERS, {**example, "type": "key.renamed"}) == [
        "'key.renamed' is not an event of openapi.json's webhooks"]
    assert catalog_errors(HEADERS, {**example, "type": "key.renamed"}, uncatalogued={"key.renamed"}) == []


def test_a_receiver_fails_its_test_when_a_delivery_differs_from_the_catalog(app, user):
    with pytest.raises(AssertionError, match=r"differ from openapi.json's webhooks:\n.*key.revoked body at \$.data"):
        with receiving() as receiver:
            endpoint, receiver.secrets["/h"] = endpoints.add_endpoint(user, f"{receiver.url}/h")
            outbox.emit(endpoint.org_id, "key.revoked", {"key_id": 1})
            delivery.deliver_due(app)
            receiver.wait_for(1)


def test_revoked_as_leaked_may_say_that_github_reported_it():
    example = (DOCUMENT["webhooks"]["key.revoked_as_leaked"]["post"]["requestBody"]["content"]["application/json"]
               ["example"])
    reported = {**example, "data": {**example["data"], "source": "github",
                                    "url": "https://github.com/acme/app/blob/main/.env"}}
    by_holder = {**example, "data": {name: value for name, value in example["data"].items()
                                     if name not in ("source", "url")}}
    assert catalog_errors(HEADERS, reported) == [] and catalog_errors(HEADERS, by_holder) == []
    assert catalog_errors(HEADERS, {**reported, "data": {**reported["data"], "source": "gitlab"}})


def make_every_event(app, client, user, endpoint):
    """Every event of the catalog, each way the service makes it: from the command line (actor
    null), the web application (actor a username), the API, the periodic jobs and the hot path;
    nullable fields null and not."""
    plain, _ = keyactions.issue_key(user, "Plain", "development")  # expires_at null
    keyactions.roll_key(plain, grace=0)  # previous_valid_until null
    keyactions.revoke_key(ApiKey.get_by_id(plain.id))
    _, leaked = keyactions.issue_key(user, "Leaky", "production")
    assert app.test_client().post("/api/v1/keys/revoke", headers={"X-API-Key": leaked}).status_code == 200
    soon, _ = keyactions.issue_key(user, "Soon", "production", expires_in=3 * 86400)
    assert periodic.run() == 1
    assert periodic.run(now=utcnow() + datetime.timedelta(days=3, hours=1)) == 1
    busy, busy_secret = keyactions.issue_key(user, "Busy", "production")
    refilled, refilled_secret = keyactions.issue_key(user, "Refilled", "production", credits_given=10,
                                                     refill=(10, "day"))
    metered, metered_secret = keyactions.issue_key(user, "Metered", "production", credits_given=10)
    ApiKey.update(rate_limits="100/minute").where(ApiKey.id.in_([refilled.id, metered.id])).execute()
    keyedits.update_key(busy.id, True, name="Busier")
    api = app.test_client()
    for secret, count in ((busy_secret, 5), (refilled_secret, 10), (metered_secret, 10)):
        assert {api.get("/api/v1/protected/test", headers={"X-API-Key": secret}).status_code
                for _ in range(count)} == {200}
    app.extensions["usage"].flush()
    endpoints.send_test(endpoint)
    assert client.post("/login", data={"username": "alice", "password": "correct horse battery"}).status_code == 302
    assert client.post("/settings/security/keys", data={"name": "Web", "type": "production", "expires_in": "30d",
                                                        "scopes": ["test:read", "usage:read"]}).status_code == 302
    web = ApiKey.get(ApiKey.name == "Web")
    assert client.post(f"/settings/security/keys/{web.id}/edit", data={"name": "Web app"}).status_code == 302
    assert client.post(f"/settings/security/keys/{web.id}/roll", data={"grace": "1h"}).status_code in (200, 302)
    assert client.post(f"/settings/security/keys/{web.id}/revoke").status_code == 302


def test_every_event_made_for_real_is_delivered_as_the_catalog_describes_it(app, client, user):
    with receiving() as receiver:
        endpoint, receiver.secrets["/all"] = endpoints.add_endpoint(user, f"{receiver.url}/all")
        make_every_event(app, client, user, endpoint)
        delivery.deliver_due(app)
        received = receiver.wait_for(WebhookMessage.select().count())
    assert {sent.payload["type"] for sent in received} == set(catalog.EVENTS)
    assert all(sent.error is None and sent.catalog_errors == [] for sent in received)
    data = [(sent.payload["type"], sent.payload["data"]) for sent in received]
    # Each nullable field was seen null and not null, and the actor both ways.
    for event, field in (("key.created", "expires_at"), ("key.rolled", "previous_valid_until"),
                         ("credits.exhausted", "next_refill_at"), ("key.revoked", "actor")):
        assert {fields[field] is None for name, fields in data if name == event} == {True, False}, (event, field)
    assert {fields["percent"] for name, fields in data if name == "usage.threshold"} == {80, 100}
