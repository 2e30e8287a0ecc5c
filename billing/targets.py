"""What goes out to each billing system, exactly as the contract fixes it, and how its answer is
read: accepted, refused for now (a 429 with the wait it asks for), or failed with the system's
error. Stripe's events go through Stripe's own client (imported by the first Stripe send); the
others' are CloudEvents or Lago's batch, posted as JSON."""

import collections
import datetime
import http.client
import json
import logging
import re
import time
from urllib.parse import urlsplit

from models import iso_seconds

log = logging.getLogger(__name__)

# A call's whole time (as a webhook's); the outbox's lease outlasts it.
TIMEOUT_SECONDS = 10
# Events a Lago, OpenMeter or CloudEvents call carries at most.
BATCH = 100
# Stripe takes a meter event up to 35 days after its timestamp.
STRIPE_OLDEST = datetime.timedelta(days=35)
TOO_OLD = "Stripe refuses meter events older than 35 days."
# Stripe refuses an identifier it has seen "within a rolling period of at least 24 hours": an event
# whose earlier attempt may have been counted (no answer, a 5xx) is not sent again past that.
STRIPE_REMEMBERS = datetime.timedelta(hours=23)
PAST_STRIPE_MEMORY = ("Not sent again: Stripe remembers an identifier for 24 hours, and an earlier attempt may have "
                      "been counted. Check the meter's events in Stripe, then billing resend if it is missing.")
# Characters an error keeps: a database refuses a NUL, and a log line takes no other control character.
CONTROL = re.compile(r"[\x00-\x1f\x7f]+")
# The longest wait a Retry-After gets; without one (Stripe sends none), consecutive 429s wait
# 1, 2, 4 ... seconds, up to LONGEST_BACKOFF_SECONDS: the exponential back-off Stripe asks for.
LONGEST_WAIT_SECONDS = 3600
LONGEST_BACKOFF_SECONDS = 60
ERROR_CHARACTERS = 300
# Enough of an answer to read Lago's refusal of a whole batch, index by index.
ANSWER_BYTES = 65536
USER_AGENT = "api-key-demo-service-billing/1"
# How Stripe says an identifier was taken before (it promises no code on /v1).
STRIPE_DUPLICATE = "already exists with identifier"
LAGO_DUPLICATE = "value_already_exist"

# accepted: the system took every event of the call; limited: it answered 429; wait: seconds
# before the next try, which is not counted as an attempt (None: the schedule's); final: not worth
# another attempt; error: the system's answer or why there was none; already: the indexes of the
# call's events the system had stored before (Lago refuses a whole batch for them).
Outcome = collections.namedtuple("Outcome", "accepted limited wait final error already",
                                 defaults=(False, None, False, None, frozenset()))
ACCEPTED = Outcome(True)


def batch_size(target):
    return 1 if target == "stripe" else BATCH


def cloudevent(event, source, slug):
    """An event in the CloudEvents 1.0 JSON format, as OpenMeter, a CloudEvents sink and `billing
    export` take it."""
    return {"specversion": "1.0", "id": event.identifier, "source": source, "type": event.meter,
            "subject": event.customer, "time": iso_seconds(event.hour),
            "datacontenttype": "application/json",
            "data": {"value": event.value, "key_id": event.api_key_id, "org": slug}}


def lago_event(event, slug):
    return {"transaction_id": event.identifier, "external_subscription_id": event.customer, "code": event.meter,
            "timestamp": int(event.hour.replace(tzinfo=datetime.UTC).timestamp()),
            # As strings: Lago's description gives each property as one of string, integer and
            # number, which a whole number matches twice.
            "properties": {"value": str(event.value), "key_id": str(event.api_key_id), "org": slug}}


def source_of(config):
    return config["PUBLIC_URL"] or "urn:api-key-service"


class BillingSystem:
    """BILLING_EXPORT's system, as the settings name it; Stripe's client made by the first send."""

    def __init__(self, config):
        self.config = config
        self.target = config["BILLING_EXPORT"]
        self.stripe = None
        self.limited_in_a_row = 0
        # After a 429, the process makes no call until then (time.monotonic()).
        self.paused_until = 0.0

    def paused(self):
        return time.monotonic() < self.paused_until

    def send(self, events, now):
        """Send one call's events and read the answer."""
        outcome = self.call(events, now)
        if not outcome.limited:
            self.limited_in_a_row = 0
            return outcome
        self.limited_in_a_row += 1
        if outcome.wait is None:
            outcome = outcome._replace(wait=min(2 ** min(self.limited_in_a_row - 1, 10), LONGEST_BACKOFF_SECONDS))
        self.paused_until = time.monotonic() + outcome.wait
        return outcome

    def call(self, events, now):
        try:
            if self.target == "stripe":
                if self.stripe is None:
                    self.stripe = stripe_client(self.config)
                return send_to_stripe(self.stripe, events[0], now)
            if self.target == "lago":
                body = {"events": [lago_event(event, event.org_slug) for event in events]}
                return lago_outcome(post_json(self.config, "/api/v1/events/batch", body, "application/json"),
                                    len(events))
            batch = [cloudevent(event, source_of(self.config), event.org_slug) for event in events]
            path = "/api/v1/events" if self.target == "openmeter" else ""
            return outcome_of(*post_json(self.config, path, batch, "application/cloudevents-batch+json"))
        except (OSError, http.client.HTTPException) as failure:
            return Outcome(False, error=described(failure))
        except Exception as failure:  # whatever a library raises is a failed attempt, its words never kept
            return Outcome(False, error=f"The call failed: {type(failure).__name__}.")


def post_json(config, path, body, content_type):
    parts = urlsplit(config["BILLING_URL"] + path)
    connection_type = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    connection = connection_type(parts.hostname, parts.port, timeout=TIMEOUT_SECONDS)
    headers = {"Content-Type": content_type, "User-Agent": USER_AGENT}
    if config["BILLING_API_KEY"]:
        headers["Authorization"] = f"Bearer {config['BILLING_API_KEY']}"
    try:
        connection.request("POST", parts.path + (f"?{parts.query}" if parts.query else ""),
                           body=json.dumps(body, separators=(",", ":")), headers=headers)
        response = connection.getresponse()
        answer = response.read(ANSWER_BYTES).decode("utf-8", "replace")
    finally:
        connection.close()
    return response.status, response.getheader("Retry-After"), answer


def outcome_of(status, retry_after, answer):
    if 200 <= status < 300:
        return ACCEPTED
    error = CONTROL.sub(" ", f"{status}: {' '.join(answer.split())}")[:ERROR_CHARACTERS]
    if status == 429:
        return Outcome(False, limited=True, wait=wait_of(retry_after), error=error)
    return Outcome(False, error=error)


def lago_outcome(answer, size):
    """Lago refuses a whole batch (422) when one of its transaction ids is stored already, and
    stores none of it: the events it names so are accepted (stored before), and the others go
    again at once unless something else is wrong with them."""
    status, retry_after, text = answer
    outcome = outcome_of(status, retry_after, text)
    if status != 422:
        return outcome
    try:
        details = json.loads(text).get("error_details") or {}
        refusals = {int(index): [code for codes in fields.values() for code in codes]
                    for index, fields in details.items()}
    except (ValueError, AttributeError, TypeError):
        return outcome
    already = frozenset(index for index, codes in refusals.items()
                        if 0 <= index < size and codes and set(codes) == {LAGO_DUPLICATE})
    if not already:
        return outcome
    return outcome._replace(already=already, wait=0 if len(already) == len(refusals) else None)


def wait_of(retry_after):
    """The seconds a Retry-After of whole seconds asks for, from 1 to LONGEST_WAIT_SECONDS; None without one."""
    text = (retry_after or "").strip()
    if not (text.isdigit() and len(text) < 10):
        return None
    return min(max(int(text), 1), LONGEST_WAIT_SECONDS)


def stripe_client(config):
    """A client of Stripe's own library for BILLING_URL: its retries off, as the outbox retries;
    its answers read up to ANSWER_BYTES; its three lines a call kept out of the service's log."""
    import requests
    import stripe

    class BoundedSession(requests.Session):
        def request(self, *args, **kwargs):
            response = super().request(*args, **{**kwargs, "stream": True})
            try:
                # What Response.content would read, bounded (a larger answer is cut, then refused as not JSON).
                response._content = response.raw.read(ANSWER_BYTES, decode_content=True)
            finally:
                response.close()
            return response

    logging.getLogger("stripe").setLevel(logging.WARNING)
    return stripe.StripeClient(config["BILLING_API_KEY"], base_addresses={"api": config["BILLING_URL"]},
                               max_network_retries=0,
                               http_client=stripe.RequestsClient(timeout=TIMEOUT_SECONDS, session=BoundedSession()))


def send_to_stripe(client, event, now):
    import stripe

    if event.hour < now - STRIPE_OLDEST:
        return Outcome(False, final=True, error=TOO_OLD)
    if event.attempts > 1 and event.created_at < now - STRIPE_REMEMBERS:
        return Outcome(False, final=True, error=PAST_STRIPE_MEMORY)
    params = {"event_name": event.meter, "identifier": event.identifier,
              "timestamp": int(event.hour.replace(tzinfo=datetime.UTC).timestamp()),
              "payload": {"stripe_customer_id": event.customer, "value": str(event.value)}}
    try:
        client.v1.billing.meter_events.create(params=params)
    except stripe.StripeError as failure:
        if is_stripe_duplicate(failure):
            return ACCEPTED
        status = failure.http_status
        if status is None:
            return Outcome(False, error=described(failure))
        return outcome_of(status, (failure.headers or {}).get("Retry-After"), failure.http_body or "")
    return ACCEPTED


def is_stripe_duplicate(failure):
    """Stripe's answer to an identifier it took before: the event is there, which is all a resend wants."""
    return failure.http_status == 400 and STRIPE_DUPLICATE in (failure.user_message or "")


def described(failure):
    """A failure without an answer (a network error's words, which name neither the API key nor a URL)."""
    text = str(failure) or type(failure).__name__
    return CONTROL.sub(" ", f"No answer: {' '.join(text.split())}")[:ERROR_CHARACTERS]
