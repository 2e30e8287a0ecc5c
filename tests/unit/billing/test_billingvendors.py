"""tests/support/billingreceiver.py: each receiver takes a valid event of its vendor and lists it, refuses
a request that differs from the vendor's description (answering in the vendor's words, which the
description's own schemas check), answers a reused identifier as the vendor does without counting it
twice, fails as a test asks, counts the requests in flight per customer and meter, and leaves no
thread behind."""

import json
import threading
import time

import pytest
import requests
from billingevents import ACCEPTED, HOUR, SENT_AS, TOKEN, VENDORS, body, cloudevent, lago_event, post, stripe_fields
from billingreceiver import VendorReceiver
from billingwire import FIXTURES
from openapi_schema_validator import OAS30Validator, OAS31Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT4, DRAFT202012


def conforms(description, schema, answer):
    """Fails unless the answer's body is what the vendor's description says that answer is."""
    document = json.loads((FIXTURES / description).read_text())
    validator_class, specification = (OAS31Validator, DRAFT202012) if document["openapi"] >= "3.1" else (
        OAS30Validator, DRAFT4)
    registry = Registry().with_resource("urn:vendor", Resource.from_contents(document, specification))
    validator = validator_class({"$ref": f"urn:vendor#/components/schemas/{schema}"}, registry=registry,
                                format_checker=validator_class.FORMAT_CHECKER)
    assert [error.message for error in validator.iter_errors(answer.json())] == []


@pytest.fixture(params=VENDORS)
def vendor(request):
    return request.param


@pytest.fixture
def receiver(vendor):
    with VendorReceiver(vendor) as receiver:
        yield receiver


def test_a_valid_event_is_accepted_and_listed(vendor, receiver):
    answer = post(receiver, vendor, body(vendor, "evt-1"))

    assert answer.status_code == ACCEPTED[vendor]
    [event] = receiver.accepted
    assert {key: value for key, value in event.items() if key != "raw"} == {
        "id": "evt-1", "meter": "api_requests", "customer": "cus_1", "value": 3, "time": HOUR, "key_id": "7",
        "org": "acme"}
    assert receiver.invalid == [] and receiver.duplicates == []
    [request] = receiver.requests
    assert (request.method, request.path, request.headers["authorization"], request.answer) == (
        "POST", SENT_AS[vendor][0] or "/events", f"Bearer {TOKEN}", ACCEPTED[vendor])
    if vendor == "stripe":
        conforms("stripe.openapi.json", "billing.meter_event", answer)
        assert answer.json()["identifier"] == "evt-1" and answer.json()["timestamp"] == int(HOUR.timestamp())
    if vendor == "lago":
        conforms("lago.openapi.json", "EventsCreated", answer)
        assert [event["transaction_id"] for event in answer.json()["events"]] == ["evt-1"]
    if vendor in ("openmeter", "cloudevents"):
        assert answer.content == b""


def without(mapping, key):
    return {name: value for name, value in mapping.items() if name != key}


# vendor -> [(case, the body sent, status, the answer's body (None: any), the schema it has)]
REFUSED = {
    "stripe": [
        ("a required field missing", without(stripe_fields(), "event_name"), 400,
         {"error": {"type": "invalid_request_error", "message": "Missing required param: event_name.",
                    "param": "event_name", "code": "parameter_missing"}}, "error"),
        ("a timestamp that is not an integer", stripe_fields() | {"timestamp": "soon"}, 400,
         {"error": {"type": "invalid_request_error", "message": "Invalid integer: soon", "param": "timestamp",
                    "code": "parameter_invalid_integer"}}, "error"),
        ("an unknown field", stripe_fields() | {"quantity": "3"}, 400,
         {"error": {"type": "invalid_request_error", "message": "Received unknown parameter: quantity",
                    "param": "quantity", "code": "parameter_unknown"}}, "error"),
        ("no customer in the payload", without(stripe_fields(), "payload[stripe_customer_id]"), 400,
         {"error": {"type": "invalid_request_error",
                    "message": "Customer mapping key stripe_customer_id not found in payload.",
                    "param": "payload[stripe_customer_id]", "code": "meter_event_no_customer_defined"}}, "error"),
    ],
    "lago": [
        ("a required field missing", {"events": [without(lago_event(), "code")]}, 422,
         {"status": 422, "error": "Unprocessable Entity", "code": "validation_errors",
          "error_details": {"0": {"code": ["value_is_mandatory"]}}}, "ApiErrorUnprocessableEntity"),
        ("a timestamp of the wrong type", {"events": [lago_event() | {"timestamp": 1.5}]}, 422,
         {"status": 422, "error": "Unprocessable Entity", "code": "validation_errors",
          "error_details": {"0": {"timestamp": ["value_is_invalid"]}}}, "ApiErrorUnprocessableEntity"),
        # The description's quirk: an integer property matches two of its oneOf.
        ("an integer property", {"events": [lago_event() | {"properties": {"value": 3}}]}, 422,
         {"status": 422, "error": "Unprocessable Entity", "code": "validation_errors",
          "error_details": {"0": {"properties": ["value_is_invalid"]}}}, "ApiErrorUnprocessableEntity"),
        ("no events", {"events": []}, 400,
         {"status": 400, "error": "BadRequest: param is missing or the value is empty: events"},
         "ApiErrorBadRequest"),
    ],
    "openmeter": [
        ("a required field missing", [without(cloudevent(), "subject")], 400, None, "BadRequestProblemResponse"),
        ("an id of the wrong type", [cloudevent() | {"id": 5}], 400, None, "BadRequestProblemResponse"),
        ("data that is not an object", [cloudevent() | {"data": "3"}], 400, None, "BadRequestProblemResponse"),
    ],
    "cloudevents": [
        ("a required field missing", [without(cloudevent(), "source")], 400, None, None),
        ("an id of the wrong type", [cloudevent() | {"id": 5}], 400, None, None),
        ("another specversion", [cloudevent() | {"specversion": "0.3"}], 400, None, None),
    ],
}
DESCRIPTIONS = {"stripe": "stripe.openapi.json", "lago": "lago.openapi.json", "openmeter": "openmeter.openapi.json"}


@pytest.mark.parametrize(("vendor", "sent", "status", "answered", "schema"),
                         [(vendor, *case[1:]) for vendor, cases in REFUSED.items() for case in cases],
                         ids=[f"{vendor}-{case[0]}" for vendor, cases in REFUSED.items() for case in cases])
def test_a_body_that_differs_from_the_description_is_refused_and_listed(vendor, receiver, sent, status, answered,
                                                                        schema):
    answer = post(receiver, vendor, sent)

    assert answer.status_code == status
    if answered is not None:
        assert answer.json() == answered
    if schema is not None:
        conforms(DESCRIPTIONS[vendor], schema, answer)
    assert receiver.accepted == [] and len(receiver.invalid) == 1
    assert receiver.requests[0].answer == status


@pytest.mark.parametrize("token", [None, "another-token"], ids=["no token", "another token"])
def test_a_request_without_the_token_is_refused_and_listed(vendor, receiver, token):
    answer = post(receiver, vendor, body(vendor, "evt-1"), token=token)

    assert answer.status_code == 401
    expected = {"stripe": {"error": {"type": "invalid_request_error", "message": "Invalid API Key provided."}},
                "lago": {"status": 401, "error": "Unauthorized"}}
    if vendor in expected:
        assert answer.json() == expected[vendor]
    if vendor == "openmeter":
        conforms("openmeter.openapi.json", "UnauthorizedProblemResponse", answer)
    assert receiver.accepted == [] and receiver.invalid == [
        f"{type(receiver.vendor).__name__}: Authorization {f'Bearer {token}' if token else None!r} is not the token"]


def test_a_content_type_the_description_does_not_give_is_refused(vendor, receiver):
    answer = post(receiver, vendor, body(vendor, "evt-1"), content_type="text/plain")

    assert answer.status_code == 400
    assert receiver.accepted == [] and "Content-Type 'text/plain'" in receiver.invalid[0]


def test_a_path_the_description_does_not_give_is_refused(vendor, receiver):
    answer = requests.post(receiver.url + "/v2/elsewhere", data=b"{}", timeout=10,
                           headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": SENT_AS[vendor][1]})

    assert answer.status_code == 404
    assert receiver.accepted == [] and len(receiver.invalid) == 1


def test_stripe_answers_a_reused_identifier_with_a_400_it_asks_not_to_retry():
    with VendorReceiver("stripe") as receiver:
        post(receiver, "stripe", body("stripe", "evt-1"))
        answer = post(receiver, "stripe", body("stripe", "evt-1"))

    assert answer.status_code == 400
    assert answer.json() == {"error": {"type": "invalid_request_error",
                                       "message": "An event already exists with identifier evt-1."}}
    assert answer.headers["Stripe-Should-Retry"] == "false"
    assert [event["id"] for event in receiver.accepted] == ["evt-1"]
    assert [event["id"] for event in receiver.duplicates] == ["evt-1"] and receiver.invalid == []


def test_lago_refuses_a_whole_batch_for_one_reused_transaction_id_and_stores_none_of_it():
    with VendorReceiver("lago") as receiver:
        post(receiver, "lago", body("lago", "evt-1"))
        refused = post(receiver, "lago", body("lago", "evt-2", "evt-1"))
        within = post(receiver, "lago", body("lago", "evt-3", "evt-3"))
        resent = post(receiver, "lago", body("lago", "evt-2", "evt-3"))

    assert refused.status_code == 422
    assert refused.json() == {"status": 422, "error": "Unprocessable Entity", "code": "validation_errors",
                              "error_details": {"1": {"transaction_id": ["value_already_exist"]}}}
    assert within.json()["error_details"] == {"1": {"transaction_id": ["value_already_exist"]}}
    assert resent.status_code == 200
    assert [event["id"] for event in receiver.accepted] == ["evt-1", "evt-2", "evt-3"]
    assert [event["id"] for event in receiver.duplicates] == ["evt-1", "evt-3"] and receiver.invalid == []


@pytest.mark.parametrize("vendor", ["openmeter", "cloudevents"])
def test_a_cloudevent_with_a_source_and_id_seen_before_is_answered_as_any_and_dropped(vendor, receiver):
    first = post(receiver, vendor, body(vendor, "evt-1", "evt-1"))
    again = post(receiver, vendor, body(vendor, "evt-1", "evt-2"))
    elsewhere = post(receiver, vendor, [cloudevent("evt-1") | {"source": "urn:another-source"}])

    assert first.status_code == again.status_code == elsewhere.status_code == ACCEPTED[vendor]
    assert [(event["raw"]["source"], event["id"]) for event in receiver.accepted] == [
        ("urn:api-key-service", "evt-1"), ("urn:api-key-service", "evt-2"), ("urn:another-source", "evt-1")]
    assert [event["id"] for event in receiver.duplicates] == ["evt-1", "evt-1"]


def test_lago_refuses_a_batch_of_101_events_and_takes_one_of_100():
    with VendorReceiver("lago") as receiver:
        too_many = post(receiver, "lago", body("lago", *[f"evt-{n}" for n in range(101)]))
        most = post(receiver, "lago", body("lago", *[f"evt-{n}" for n in range(100)]))

    assert too_many.status_code == 422
    assert too_many.json() == {"status": 422, "error": "Unprocessable Entity", "code": "validation_errors",
                               "error_details": {"events": ["too_many_events"]}}
    assert most.status_code == 200 and len(receiver.accepted) == 100
    assert receiver.invalid == ["Lago: 101 events, more than 100"]


# vendor -> (the 500's body (None: any), its headers that matter)
SERVER_ERRORS = {
    "stripe": ({"error": {"type": "api_error", "message": "An unknown error occurred."}},
               {"Stripe-Should-Retry": "false"}),
    "lago": ({"status": 500, "error": "Internal Server Error"}, {}),
    "openmeter": (None, {"Content-Type": "application/problem+json"}),
    "cloudevents": (None, {}),
}


def test_a_500_takes_nothing_and_the_next_request_is_answered(vendor, receiver):
    receiver.fail(1, 500)
    failed = post(receiver, vendor, body(vendor, "evt-1"))
    then = post(receiver, vendor, body(vendor, "evt-2"))

    answered, headers = SERVER_ERRORS[vendor]
    assert failed.status_code == 500
    if answered is not None:
        assert failed.json() == answered
    assert {name: failed.headers[name] for name in headers} == headers
    assert then.status_code == ACCEPTED[vendor]
    assert [event["id"] for event in receiver.accepted] == ["evt-2"]
    assert [request.answer for request in receiver.requests] == [500, ACCEPTED[vendor]]


def test_a_400_asked_for_takes_nothing(vendor, receiver):
    receiver.fail(1, 400)
    answer = post(receiver, vendor, body(vendor, "evt-1"))

    assert answer.status_code == 400
    assert receiver.accepted == [] and receiver.invalid == []


# vendor -> the headers its 429 carries when the test asks for a wait of 7 seconds
RATE_LIMITED = {
    "stripe": {"Retry-After": None, "X-RateLimit-Reset": None},
    "lago": {"Retry-After": None, "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "7"},
    "openmeter": {"Retry-After": "7", "X-RateLimit-Remaining": "0"},
    "cloudevents": {"Retry-After": "7"},
}


def test_a_429_announces_its_wait_as_the_vendor_does(vendor, receiver):
    receiver.fail(1, ("429", 7))
    answer = post(receiver, vendor, body(vendor, "evt-1"))

    assert answer.status_code == 429
    assert {name: answer.headers.get(name) for name in RATE_LIMITED[vendor]} == RATE_LIMITED[vendor]
    if vendor == "stripe":
        assert answer.json()["error"]["code"] == "rate_limit"
    if vendor == "openmeter":
        assert int(answer.headers["X-RateLimit-Reset"]) >= int(time.time()) + 6
    assert receiver.accepted == []


def test_a_closed_connection_gives_no_answer_and_takes_nothing(vendor, receiver):
    receiver.fail(1, "close")
    with pytest.raises(requests.ConnectionError):
        post(receiver, vendor, body(vendor, "evt-1"))

    assert receiver.accepted == [] and [request.answer for request in receiver.requests] == [None]


def test_a_slow_answer_is_held_then_given_and_its_events_taken(vendor, receiver):
    receiver.fail(1, ("slow", 0.4))
    started = time.monotonic()
    answer = post(receiver, vendor, body(vendor, "evt-1"))

    assert time.monotonic() - started >= 0.4
    assert answer.status_code == ACCEPTED[vendor] and len(receiver.accepted) == 1


def test_failures_are_counted_on_the_requests_that_match_the_description():
    with VendorReceiver("lago") as receiver:
        receiver.fail(2, 500)
        refused = post(receiver, "lago", {"events": [without(lago_event(), "code")]})
        statuses = [post(receiver, "lago", body("lago", f"evt-{n}")).status_code for n in range(3)]

    assert refused.status_code == 422
    assert statuses == [500, 500, 200]


def test_an_unknown_failure_is_refused_when_asked_for():
    with VendorReceiver("lago") as receiver, pytest.raises(ValueError, match="no such failure"):
        receiver.fail(1, 503)


def test_concurrent_max_counts_the_requests_in_flight_for_a_customer_and_meter(vendor, receiver):
    receiver.fail(3, ("slow", 1.5))
    threads = [threading.Thread(target=post, args=(receiver, vendor, body(vendor, identifier, customer=customer)))
               for identifier, customer in (("evt-1", "cus_1"), ("evt-2", "cus_1"), ("evt-3", "cus_2"))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for identifier in ("evt-4", "evt-5"):
        post(receiver, vendor, body(vendor, identifier, customer="cus_3"))

    assert receiver.concurrent_max(("cus_1", "api_requests")) == 2
    assert receiver.concurrent_max(("cus_2", "api_requests")) == 1
    assert receiver.concurrent_max(("cus_3", "api_requests")) == 1
    assert receiver.concurrent_max(("cus_4", "api_requests")) == 0


def test_stripe_replays_the_answer_kept_for_an_idempotency_key():
    with VendorReceiver("stripe") as receiver:
        receiver.fail(1, ("slow", 2))
        first = threading.Thread(target=post, args=(receiver, "stripe", body("stripe", "evt-1")),
                                 kwargs={"idempotency_key": "key-1"})
        first.start()
        while not receiver.concurrent_max(("cus_1", "api_requests")):
            time.sleep(0.01)
        running = post(receiver, "stripe", body("stripe", "evt-1"), idempotency_key="key-1")
        first.join()
        replayed = post(receiver, "stripe", body("stripe", "evt-1"), idempotency_key="key-1")
        other = post(receiver, "stripe", body("stripe", "evt-2"), idempotency_key="key-1")

    assert running.status_code == 409 and running.json()["error"]["type"] == "idempotency_error"
    assert replayed.status_code == 200 and replayed.headers["Idempotent-Replayed"] == "true"
    assert replayed.json()["identifier"] == "evt-1"
    assert other.status_code == 400 and other.json()["error"]["type"] == "idempotency_error"
    assert [event["id"] for event in receiver.accepted] == ["evt-1"] and receiver.duplicates == []


def test_the_stripe_library_sends_a_meter_event_the_receiver_takes():
    stripe = pytest.importorskip("stripe", reason="Stripe's library is not installed (requirements-dev.txt)")
    with VendorReceiver("stripe") as receiver:
        client = stripe.StripeClient(TOKEN, base_addresses={"api": receiver.url}, max_network_retries=0)
        params = {"event_name": "api_requests", "identifier": "evt-1", "timestamp": int(HOUR.timestamp()),
                  "payload": {"stripe_customer_id": "cus_1", "value": "3"}}
        event = client.v1.billing.meter_events.create(params=params)
        with pytest.raises(stripe.InvalidRequestError) as duplicate:
            client.v1.billing.meter_events.create(params=params)
        receiver.fail(1, ("429", 7))
        with pytest.raises(stripe.RateLimitError) as limited:
            client.v1.billing.meter_events.create(params=params | {"identifier": "evt-2"})

    assert (event.identifier, event.event_name, event.timestamp) == ("evt-1", "api_requests", int(HOUR.timestamp()))
    assert duplicate.value.http_status == 400
    assert "already exists with identifier evt-1" in duplicate.value.user_message
    assert "Retry-After" not in limited.value.headers
    assert [(event["id"], event["customer"], event["value"]) for event in receiver.accepted] == [("evt-1", "cus_1", 3)]
    assert receiver.invalid == []


def test_no_thread_outlives_the_receiver():
    before = set(threading.enumerate())
    answers = []
    with VendorReceiver("cloudevents") as receiver:
        receiver.fail(1, ("slow", 60))
        sender = threading.Thread(target=lambda: answers.append(post(receiver, "cloudevents",
                                                                     body("cloudevents", "evt-1"))))
        sender.start()
        while not receiver.concurrent_max(("cus_1", "api_requests")):
            time.sleep(0.01)
        stopping = time.monotonic()
    sender.join(10)

    assert time.monotonic() - stopping < 5
    assert [answer.status_code for answer in answers] == [202]
    assert set(threading.enumerate()) <= before
