"""What the billing vendors' stand-ins (tests/support/billingvendors.py) share: a request and its
answer, a refusal with its reason, the vendors' descriptions in tests/fixtures/billing/ and their
body validators, and the events as the receiver lists them."""

import datetime
import json
import re
from decimal import Decimal
from pathlib import Path
from typing import NamedTuple

from referencing import Registry, Resource

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "billing"
# The meter's value key: Stripe's default value_settings.event_payload_key, and the field the Lago
# billable metric and the OpenMeter meter are taken to be configured with.
VALUE = "value"
WHOLE_NUMBER = re.compile(r"-?\d+")
UNIX_SECONDS = re.compile(r"-?\d+(\.\d+)?")


class Answer(NamedTuple):
    status: int
    body: bytes = b""
    headers: dict = {}

    def with_headers(self, **headers):
        """The answer with these headers too, their names written with _ for -."""
        return self._replace(headers={**self.headers, **{name.replace("_", "-"): value
                                                         for name, value in headers.items()}})


class Request(NamedTuple):
    method: str
    path: str
    headers: dict
    body: bytes
    answer: int | None  # the status answered; None: the connection was closed unanswered


class Refused(Exception):
    """A request the vendor refuses because it does not match the vendor's description: the
    vendor's answer, and why."""

    def __init__(self, answer, reason):
        super().__init__(reason)
        self.answer = answer
        self.reason = reason


def json_answer(status, body, content_type="application/json"):
    return Answer(status, json.dumps(body).encode(), {"Content-Type": content_type})


def load(name):
    return json.loads((FIXTURES / name).read_text())


def body_validators(description, specification, validator_class, path):
    """A validator of the body of the POST at path for each media type it takes, resolving the
    description's own $refs."""
    registry = Registry().with_resource("urn:vendor", Resource.from_contents(description, specification))
    operation = "/".join(("urn:vendor#/paths", path.replace("/", "~1"), "post/requestBody/content"))
    return {media_type: validator_class({"$ref": f"{operation}/{media_type.replace('/', '~1')}/schema"},
                                        registry=registry, format_checker=validator_class.FORMAT_CHECKER)
            for media_type in description["paths"][path]["post"]["requestBody"]["content"]}


def schema_errors(validator, instance):
    """How the instance differs from the schema, a sentence each, the deepest first."""
    errors = sorted(validator.iter_errors(instance), key=lambda error: -len(error.absolute_path))
    return [f"body at {error.json_path}: {error.message}" for error in errors]


def whole_number(value):
    """The value as an int when it is a whole number or one written as a string, else None."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and WHOLE_NUMBER.fullmatch(value):
        return int(value)
    return None


def text(value):
    """The value as text: a string as it is, a whole number written out; else None."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return value if isinstance(value, str) else None


def event_time(value):
    """An aware UTC datetime from Unix seconds (a number or a decimal string) or an RFC 3339 string."""
    if isinstance(value, int) or UNIX_SECONDS.fullmatch(str(value)):
        return datetime.datetime.fromtimestamp(float(Decimal(str(value))), datetime.UTC)
    return datetime.datetime.fromisoformat(value).astimezone(datetime.UTC)


def record(event_id, meter, customer, payload, time_value, raw):
    """What the receiver lists for one event; a time the event leaves out is the time it arrived, as
    every vendor here takes it."""
    payload = payload if isinstance(payload, dict) else {}
    return {"id": event_id, "meter": meter, "customer": customer, "value": whole_number(payload.get(VALUE)),
            "time": datetime.datetime.now(datetime.UTC) if time_value is None else event_time(time_value),
            "key_id": text(payload.get("key_id")), "org": text(payload.get("org")), "raw": raw}


class Vendor:
    """One vendor's endpoint as its description has it: `path`, the `media_types` it takes (each with
    the validator of its body) and the authorizations; a subclass reads the events and words the
    answers as the vendor does."""

    def __init__(self, token):
        self.authorizations = {f"Bearer {token}"}

    def read(self, method, path, headers, body):
        """The request's events, each as the receiver lists it; Refused when the vendor would refuse
        the request."""
        if path != self.path:
            raise Refused(self.refusal(404, f"Unrecognized request URL ({method}: {path})."),
                          f"{method} {path}: the path is {self.path}")
        if method != "POST":
            raise Refused(self.refusal(405, f"{method} is not allowed on {path}."), f"{method} {path}: not POST")
        if headers.get("authorization") not in self.authorizations:
            raise Refused(self.unauthorized(), f"Authorization {headers.get('authorization')!r} is not the token")
        media_type = headers.get("content-type", "").split(";")[0].strip().lower()
        if media_type not in self.media_types:
            raise Refused(self.refusal(400, f"invalid content type: {media_type}"),
                          f"Content-Type {media_type!r} is none of {sorted(self.media_types)}")
        return self.events(media_type, body)

    def identity(self, event):
        """What makes two events the same event for this vendor."""
        return event["id"]

    def unauthorized(self):
        return self.refusal(401, "Unauthorized")

    def server_error(self):
        return self.refusal(500, "Internal Server Error")

    def replayed(self, headers, body, execute):
        """The answer to a request that passed; a vendor that keeps answers by idempotency key gives
        the kept one instead of running execute() again."""
        return execute()

    def json_body(self, body):
        try:
            return json.loads(body)
        except ValueError as error:
            raise Refused(self.refusal(400, f"invalid JSON: {error}"), f"the body is not JSON: {error}") from None
