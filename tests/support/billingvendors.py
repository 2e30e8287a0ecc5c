"""The billing vendors the usage export posts to, as tests/support/billingreceiver.py plays them:
Stripe, Lago, OpenMeter and a plain CloudEvents sink, each holding every request to the vendor's own
published description (tests/fixtures/billing/, cut from the vendors' repositories; its README.md
names the commits) and answering as the vendor does.

What each vendor answers when an identifier comes again, and when it limits the rate, as read in the
vendors' code, documents and issues (the receivers answer the same):

Stripe, POST /v1/billing/meter_events (form-encoded; Authorization: Bearer <secret key>)
  - An `identifier` already used: 400 {"error": {"type": "invalid_request_error", "message": "An event
    already exists with identifier <id>."}} and Stripe-Should-Retry: false; the event is not counted
    again. No `code` is promised on /v1 (the v2 endpoint says `duplicate_meter_event`), so match the
    status and the message. Sources: langfuse/langfuse#16292 (the answer as Stripe gave it, 2026-08);
    the identifier's description in the spec ("uniqueness within a rolling period of at least 24
    hours"); v2.error.duplicate_meter_event in stripe/openapi latest/openapi.spec3.json.
  - An Idempotency-Key already used (the stripe library sends one per call and repeats it on its own
    retries): the first answer again, 500s included, with Idempotent-Replayed: true; 409
    idempotency_error while the first is still running; 400 idempotency_error with other parameters
    (docs.stripe.com/api/idempotent_requests).
  - 429: {"error": {"type": "invalid_request_error", "code": "rate_limit", ...}} and no Retry-After nor
    any other wait: Stripe asks for exponential back-off (docs.stripe.com/rate-limits and
    .../billing/subscriptions/usage-based/recording-usage-api), stripe-python 16.1.0 never reads
    Retry-After (_http_client.py) and retries a 429 only on Stripe-Should-Retry: true (lock timeouts;
    stripe/stripe-dotnet#1886). So the seconds of fail(1, ("429", seconds)) are not sent.
  - "One concurrent call per customer per meter" (recording-usage-api). What Stripe answers past it is
    not documented, so the receiver measures it (concurrent_max) rather than refuses it.
  - Stripe checks the customer and the value after it has answered (its meter error report,
    v1.billing.meter.error_report_triggered); the receiver refuses them at once, with a 400.

Lago, POST /api/v1/events/batch (JSON; Authorization: Bearer <api key>; at most 100 events)
  - A `transaction_id` already stored, or twice in one batch: 422 {"status": 422, "error":
    "Unprocessable Entity", "code": "validation_errors", "error_details": {"<index>":
    {"transaction_id": ["value_already_exist"]}}}, and the whole batch is rolled back: none of its
    events is stored, new ones included, so the sender resends them without the reused ones. Not a
    silent dedupe: getlago/lago-api app/services/events/create_batch_service.rb at 1b1c24a6 (insert_all
    unique by transaction id, then ActiveRecord::Rollback) and getlago/lago-api#3049 (the same 422 on
    v1.17.4). Organisations on Lago's ClickHouse event store differ: there the event is taken and
    overwrites the one with the same transaction_id and timestamp (the field's description).
  - 429 (Lago Cloud; the open-source API has no limiter): X-RateLimit-Limit, X-RateLimit-Remaining and
    X-RateLimit-Reset (seconds until the window resets) and no Retry-After
    (getlago.com/docs/api-reference/rate-limits); the body is not documented.
  - The description's `properties` values are oneOf string, integer and number: an integer matches two
    of them, so the description refuses it. Send numbers as strings (Lago reads them as decimals).

OpenMeter, POST /api/v1/events (CloudEvents; Authorization: Bearer <token>)
  - An event whose `source` and `id` were seen already: 204 like any other, and dropped
    (openmeterio/openmeter at 7e57a394: openmeter/ingest/dedupe.go, openmeter/dedupe/dedupe.go,
    openmeter/ingest/httpdriver/ingest.go). Errors are application/problem+json.
  - 429 (OpenMeter Cloud; self-hosted has no limit): Retry-After in seconds, with
    X-RateLimit-Remaining and X-RateLimit-Reset, a Unix time (openmeter.io/docs/cloud/api/rate-limiting).

A CloudEvents sink, POST <url> (CloudEvents 1.0, JSON event or batch format; Authorization: Bearer)
  - 202. An event whose `source` and `id` were seen already is a duplicate, as the spec allows
    ("Consumers MAY assume that Events with identical source and id are duplicates"): 202, dropped.
    429 carries Retry-After (RFC 9110).

From each event the receiver reads the meter (event_name, code, type), the customer
(payload.stripe_customer_id, external_subscription_id, subject) and, from its payload, properties or
data, the meter's value under "value" (a whole number) and the service's "key_id" and "org".
"""

import base64
import datetime
import http
import http.server
import re
import threading
import time
import urllib.parse
import uuid

from billingwire import (
    UNIX_SECONDS,
    VALUE,
    WHOLE_NUMBER,
    Answer,
    Refused,
    Vendor,
    body_validators,
    json_answer,
    load,
    record,
    schema_errors,
    text,
    whole_number,
)
from jsonschema import Draft7Validator
from openapi_schema_validator import OAS30Validator, OAS31Validator
from referencing.jsonschema import DRAFT4, DRAFT202012

# Lago's CreateBatchService.MAX_LENGTH (LAGO_EVENTS_BATCH_MAX_LENGTH, 100 by default), as its
# description also says.
LAGO_BATCH_MAX = 100


def form_fields(body):
    """The form body as Stripe reads it: `payload[stripe_customer_id]=...` as an object, `expand[0]=...`
    as a list; ValueError when a name is both a value and an object."""
    fields = {}
    for name, value in urllib.parse.parse_qsl(body.decode(), keep_blank_values=True):
        head, *keys = re.findall(r"^[^\[]+|(?<=\[)[^\]]*(?=\])", name)
        target, key = fields, head
        for inner in keys:
            target = target.setdefault(key, {})
            if not isinstance(target, dict):
                raise ValueError(f"{name} nests into a value")
            key = inner or str(len(target))
        target[key] = value
    return as_lists(fields)


def as_lists(node):
    if not isinstance(node, dict):
        return node
    node = {key: as_lists(value) for key, value in node.items()}
    if node and all(key.isdigit() for key in node):
        return [node[key] for key in sorted(node, key=int)]
    return node


def typed(value, schema):
    """The form's strings as the types the schema gives them (a form carries strings only)."""
    if isinstance(value, dict):
        extra = schema.get("additionalProperties")
        return {key: typed(item, schema.get("properties", {}).get(key, extra if isinstance(extra, dict) else {}))
                for key, item in value.items()}
    if isinstance(value, list):
        return [typed(item, schema.get("items", {})) for item in value]
    if schema.get("type") == "integer" and isinstance(value, str) and WHOLE_NUMBER.fullmatch(value):
        return int(value)
    if schema.get("type") == "boolean" and value in ("true", "false"):
        return value == "true"
    return value


class Stripe(Vendor):
    """Stripe's meter events: one event a call, form-encoded, its answers kept by idempotency key."""

    description = load("stripe.openapi.json")
    path = "/v1/billing/meter_events"
    form = "application/x-www-form-urlencoded"
    form_schema = description["paths"][path]["post"]["requestBody"]["content"][form]["schema"]
    media_types = body_validators(description, DRAFT4, OAS30Validator, path)

    def __init__(self, token):
        super().__init__(token)
        # The description also takes the key as HTTP Basic's user name.
        self.authorizations.add("Basic " + base64.b64encode(f"{token}:".encode()).decode())
        self.answers = {}  # idempotency key -> (the first request's body, its answer; None while it runs)
        self.answers_lock = threading.Lock()

    def refusal(self, status, message, error_type="invalid_request_error", **fields):
        return json_answer(status, {"error": {"type": error_type, "message": message, **fields}})

    def unauthorized(self):
        return self.refusal(401, "Invalid API Key provided.")

    def rate_limited(self, seconds):
        return self.refusal(429, "Too many requests hit the API too quickly. We recommend an exponential backoff "
                                 "of your requests.", code="rate_limit")

    def server_error(self):
        return self.refusal(500, "An unknown error occurred.", error_type="api_error").with_headers(
            Stripe_Should_Retry="false")

    def events(self, media_type, body):
        try:
            fields = typed(form_fields(body), self.form_schema)
        except (UnicodeDecodeError, ValueError) as error:
            raise Refused(self.refusal(400, f"Invalid request: {error}"), f"the form does not parse: {error}") from None
        validator = self.media_types[media_type]
        errors = sorted(validator.iter_errors(fields), key=lambda error: -len(error.absolute_path))
        if errors:
            raise Refused(self.invalid_param(errors[0]), "; ".join(schema_errors(validator, fields)))
        payload = fields["payload"]
        # Stripe checks these against the meter only after it answers, and reports them in the meter's
        # error report under these codes; refused here at once, so that a test sees them.
        if "stripe_customer_id" not in payload:
            raise Refused(self.refusal(400, "Customer mapping key stripe_customer_id not found in payload.",
                                       param="payload[stripe_customer_id]", code="meter_event_no_customer_defined"),
                          "payload[stripe_customer_id] is missing")
        if whole_number(payload.get(VALUE)) is None:
            raise Refused(self.refusal(400, f"Value in payload[{VALUE}] is not a whole number.",
                                       param=f"payload[{VALUE}]", code="meter_event_invalid_value"),
                          f"payload[{VALUE}] is {payload.get(VALUE)!r}, not a whole number")
        identifier = fields.get("identifier") or uuid.uuid4().hex
        return [record(identifier, fields["event_name"], payload["stripe_customer_id"], payload,
                       fields.get("timestamp"), fields)]

    def invalid_param(self, error):
        """Stripe's answer to a parameter the schema refuses, coded as Stripe's error codes list has it."""
        where = [str(key) for key in error.absolute_path]
        if error.validator == "required":
            where.append(re.search(r"'(.+?)'", error.message)[1])
        param = where[0] + "".join(f"[{key}]" for key in where[1:]) if where else ""
        if error.validator == "required":
            return self.refusal(400, f"Missing required param: {param}.", param=param, code="parameter_missing")
        if error.validator == "additionalProperties":
            unknown = re.search(r"'(.+?)'", error.message)[1]
            return self.refusal(400, f"Received unknown parameter: {unknown}", param=unknown, code="parameter_unknown")
        if error.validator == "type" and error.validator_value == "integer":
            return self.refusal(400, f"Invalid integer: {error.instance}", param=param,
                                code="parameter_invalid_integer")
        return self.refusal(400, f"Invalid {param}: {error.message}", param=param)

    def settle(self, events, reused):
        (event,), (again,) = events, reused
        if again:
            return self.refusal(400, f"An event already exists with identifier {event['id']}.").with_headers(
                Stripe_Should_Retry="false"), []
        return json_answer(200, {"object": "billing.meter_event", "created": int(time.time()),
                                 "event_name": event["meter"], "identifier": event["id"], "livemode": False,
                                 "payload": event["raw"]["payload"],
                                 "timestamp": int(event["time"].timestamp())}), events

    def replayed(self, headers, body, execute):
        key = headers.get("idempotency-key")
        if key is None:
            return execute()
        with self.answers_lock:
            earlier = self.answers.get(key)
            if earlier is None:
                self.answers[key] = (body, None)
        if earlier is not None:
            first_body, first_answer = earlier
            if first_body != body:
                return self.refusal(400, "Keys for idempotent requests can only be used with the same parameters "
                                         f"they were first used with. Try using a key other than '{key}' if you "
                                         "meant to execute a different request.", error_type="idempotency_error")
            if first_answer is None:
                return self.refusal(409, "There is currently another in-progress request using this Idempotent "
                                         f"Key: {key}. Please try again later.", error_type="idempotency_error")
            return first_answer.with_headers(Idempotent_Replayed="true")
        answer = execute()
        with self.answers_lock:
            self.answers[key] = (body, answer)
        return answer


class Lago(Vendor):
    """Lago's event batches: up to 100 events a call, stored or refused together."""

    description = load("lago.openapi.json")
    path = urllib.parse.urlsplit(description["servers"][0]["url"]).path + "/events/batch"
    media_types = body_validators(description, DRAFT202012, OAS31Validator, "/events/batch")

    def refusal(self, status, message):
        return json_answer(status, {"status": status, "error": message})

    def invalid(self, error_details):
        return json_answer(422, {"status": 422, "error": "Unprocessable Entity", "code": "validation_errors",
                                 "error_details": error_details})

    def rate_limited(self, seconds):
        return self.refusal(429, "Too Many Requests").with_headers(
            X_RateLimit_Limit="500", X_RateLimit_Remaining="0", X_RateLimit_Reset=str(seconds))

    def events(self, media_type, body):
        batch = self.json_body(body)
        if not isinstance(batch, dict) or not batch.get("events"):
            raise Refused(self.refusal(400, "BadRequest: param is missing or the value is empty: events"),
                          "the body has no events")
        if isinstance(batch["events"], list) and len(batch["events"]) > LAGO_BATCH_MAX:
            raise Refused(self.invalid({"events": ["too_many_events"]}),
                          f"{len(batch['events'])} events, more than {LAGO_BATCH_MAX}")
        validator = self.media_types[media_type]
        details = {}
        for error in validator.iter_errors(batch):
            where = list(error.absolute_path)  # ["events", index, field, ...]
            index = where[1] if len(where) > 1 else "events"
            if error.validator == "required":
                field, code = re.search(r"'(.+?)'", error.message)[1], "value_is_mandatory"
            else:
                field, code = (where[2] if len(where) > 2 else "events"), "value_is_invalid"
            details.setdefault(index, {}).setdefault(field, []).append(code)
        if details:
            raise Refused(self.invalid(details), "; ".join(schema_errors(validator, batch)))
        for index, event in enumerate(batch["events"]):
            if "timestamp" in event and not UNIX_SECONDS.fullmatch(str(event["timestamp"])):
                details.setdefault(index, {})["timestamp"] = ["invalid_format"]
            if whole_number((event.get("properties") or {}).get(VALUE)) is None:
                details.setdefault(index, {})["properties"] = ["value_is_invalid"]
        if details:
            raise Refused(self.invalid(details), f"events {sorted(details)}: a timestamp that is not Unix seconds, "
                                                 f"or properties.{VALUE} not a whole number")
        return [record(event["transaction_id"], event["code"], event["external_subscription_id"],
                       event.get("properties"), event.get("timestamp"), event) for event in batch["events"]]

    def settle(self, events, reused):
        # Lago stores the batch in one transaction, and rolls it all back for one reused identifier.
        if any(reused):
            return self.invalid({index: {"transaction_id": ["value_already_exist"]}
                                 for index, again in enumerate(reused) if again}), []
        return json_answer(200, {"events": [
            {"lago_id": str(uuid.uuid4()), "transaction_id": event["id"], "lago_customer_id": None,
             "code": event["meter"], "timestamp": rails_time(event["time"], "milliseconds"),
             "precise_total_amount_cents": event["raw"].get("precise_total_amount_cents"),
             "properties": event["raw"].get("properties") or {}, "lago_subscription_id": None,
             "external_subscription_id": event["customer"],
             "created_at": rails_time(datetime.datetime.now(datetime.UTC), "seconds")}
            for event in events]}), events


def rails_time(moment, timespec):
    """The time as Lago's Rails writes it (iso8601, Z for UTC)."""
    return moment.isoformat(timespec=timespec).replace("+00:00", "Z")


def cloudevent_record(event):
    return record(event["id"], event["type"], text(event.get("subject")), event.get("data"), event.get("time"),
                  event)


def unmetered(events):
    """The indexes of the events whose data carries no whole-number value."""
    return [index for index, event in enumerate(events)
            if not isinstance(event.get("data"), dict) or whole_number(event["data"].get(VALUE)) is None]


class OpenMeter(Vendor):
    """OpenMeter's ingestion: a CloudEvent or a batch of them, each taken or dropped on its own."""

    description = load("openmeter.openapi.json")
    path = "/api/v1/events"
    media_types = body_validators(description, DRAFT4, OAS30Validator, path)

    def refusal(self, status, message):
        # Worded as OpenMeter's pkg/models/problem.go does: the request's id as the instance, and no
        # detail in a 500 (though the description requires one).
        problem = {"type": "about:blank", "title": http.HTTPStatus(status).phrase, "status": status}
        if status != 500:
            problem["detail"] = message
        problem["instance"] = f"urn:request:{uuid.uuid4().hex}"
        return json_answer(status, problem, content_type="application/problem+json")

    def rate_limited(self, seconds):
        return self.refusal(429, "rate limit exceeded").with_headers(
            Retry_After=str(seconds), X_RateLimit_Remaining="0", X_RateLimit_Reset=str(int(time.time()) + seconds))

    def events(self, media_type, body):
        events = self.json_body(body)
        errors = schema_errors(self.media_types[media_type], events)
        if errors:
            raise Refused(self.refusal(400, "invalid event: " + errors[0]), "; ".join(errors))
        events = events if isinstance(events, list) else [events]
        if unmetered(events):
            raise Refused(self.refusal(400, f"invalid event: no whole number in data.{VALUE}"),
                          f"events {unmetered(events)} carry no whole number in data.{VALUE}")
        return [cloudevent_record(event) for event in events]

    def identity(self, event):
        return event["raw"]["source"], event["raw"]["id"]

    def settle(self, events, reused):
        return Answer(204), [event for event, again in zip(events, reused) if not again]


CLOUDEVENT = Draft7Validator(load("cloudevents.schema.json"), format_checker=Draft7Validator.FORMAT_CHECKER)


class CloudEventsSink(Vendor):
    """Any receiver of CloudEvents 1.0 in the JSON event or the JSON batch format, each event checked
    with the specification's own JSON Schema."""

    path = "/events"
    media_types = {"application/cloudevents+json": "event", "application/cloudevents-batch+json": "batch"}

    def refusal(self, status, message):
        return Answer(status, message.encode(), {"Content-Type": "text/plain; charset=utf-8"})

    def rate_limited(self, seconds):
        return self.refusal(429, "Too Many Requests").with_headers(Retry_After=str(seconds))

    def events(self, media_type, body):
        document = self.json_body(body)
        if self.media_types[media_type] == "event":
            document = [document]
        if not isinstance(document, list):
            raise Refused(self.refusal(400, "A batch is a JSON array."), "the batch is not a JSON array")
        errors = [f"event {index}: {message}" for index, event in enumerate(document)
                  for message in schema_errors(CLOUDEVENT, event)]
        if errors:
            raise Refused(self.refusal(400, errors[0]), "; ".join(errors))
        errors = [f"event {index}: specversion {event['specversion']!r}, not 1.0"
                  for index, event in enumerate(document) if event["specversion"] != "1.0"]
        errors += [f"event {index}: no whole number in data.{VALUE}" for index in unmetered(document)]
        if errors:
            raise Refused(self.refusal(400, errors[0]), "; ".join(errors))
        return [cloudevent_record(event) for event in document]

    def identity(self, event):
        return event["raw"]["source"], event["raw"]["id"]

    def settle(self, events, reused):
        return Answer(202), [event for event, again in zip(events, reused) if not again]


VENDORS = {"stripe": Stripe, "lago": Lago, "openmeter": OpenMeter, "cloudevents": CloudEventsSink}
