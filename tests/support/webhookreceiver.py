"""A webhook receiver for the tests: a local HTTP server on a free port, in a thread, that verifies
every delivery with the `standardwebhooks` library, checks it against its event's entry in
openapi.json's `webhooks` (the catalog), and answers as the test tells it."""

import contextlib
import copy
import http.server
import json
import threading
import time
from pathlib import Path

from jsonschema import Draft202012Validator
from standardwebhooks import Webhook

WEBHOOKS = json.loads((Path(__file__).resolve().parents[2] / "openapi.json").read_text())["webhooks"]


def closed(schema):
    """The schema with no property beyond those it lists, at every level: a receiver must tolerate
    new ones, but the service sends none that the catalog does not list."""
    schema = copy.deepcopy(schema)
    if "properties" in schema:
        schema.setdefault("additionalProperties", False)
        schema["properties"] = {name: closed(child) for name, child in schema["properties"].items()}
    return schema


def validator(schema):
    return Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


# {event: (the body's validator, [(header, its validator)])}
CATALOG = {event: (validator(closed(item["post"]["requestBody"]["content"]["application/json"]["schema"])),
                   [(parameter["name"], validator(parameter["schema"])) for parameter in item["post"]["parameters"]])
           for event, item in WEBHOOKS.items()}


def catalog_errors(headers, payload, uncatalogued=()):
    """What the delivery does differently from its event's entry in the catalog, a sentence each."""
    event = payload.get("type") if isinstance(payload, dict) else None
    if event in uncatalogued:
        return []
    if event not in CATALOG:
        return [f"{event!r} is not an event of openapi.json's webhooks"]
    body, parameters = CATALOG[event]
    errors = [f"{event} body at {error.json_path}: {error.message}" for error in body.iter_errors(payload)]
    for name, check in parameters:
        value = headers.get(name)
        if check.schema.get("type") == "integer" and value is not None and value.isdigit():
            value = int(value)
        errors += [f"{event} header {name}: {error.message}" for error in check.iter_errors(value)]
    return errors


class Delivery:
    def __init__(self, path, headers, body, verified, error, uncatalogued=()):
        self.path = path
        self.headers = headers
        self.body = body
        self.verified = verified
        self.error = error
        self.message_id = headers.get("webhook-id")
        self.payload = json.loads(body) if body else None
        self.catalog_errors = catalog_errors(headers, self.payload, uncatalogued)
        # When it arrived (epoch seconds), to measure a promise against the server's own timestamps.
        self.received_at = time.time()


class Server(http.server.ThreadingHTTPServer):
    # A backlog for a sender's fifty attempts at once (http.server's default is 5).
    request_queue_size = 1024
    daemon_threads = True


class Receiver:
    """Deliveries arrive at http://127.0.0.1:PORT/<path>; each path's secret (set by the test once
    the endpoint is added) verifies its deliveries. answer(delivery) -> status, by default 204;
    a status of None holds the request without answering until the receiver stops; bytes are
    written as they are in place of an answer, and the connection closed (b"": no answer at all).
    Every delivery is checked against the catalog, and receiving() fails the test that made one
    that differs; uncatalogued names the event types a test sends on purpose that it does not list."""

    def __init__(self):
        self.secrets = {}
        self.uncatalogued = set()
        self.deliveries = []
        self.lock = threading.Lock()
        self.answer = lambda delivery: 204
        self.stopping = threading.Event()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                headers = {name.lower(): value for name, value in self.headers.items()}
                delivery = receiver.verify(self.path, headers, body)
                status = receiver.answer(delivery)
                if status is None:
                    receiver.stopping.wait(60)
                    return
                if isinstance(status, bytes):
                    self.wfile.write(status)
                    self.close_connection = True
                    return
                self.send_response(status)
                if 300 <= status < 400:
                    self.send_header("Location", f"{receiver.url}/elsewhere")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def verify(self, path, headers, body):
        secret = self.secrets.get(path)
        verified, error = None, None
        try:
            verified = Webhook(secret).verify(body, headers)
        except Exception as failure:  # no secret yet, or a bad signature: the test asserts on it
            error = failure
        delivery = Delivery(path, headers, body, verified, error, self.uncatalogued)
        with self.lock:
            self.deliveries.append(delivery)
        return delivery

    def received(self, path=None):
        with self.lock:
            return [delivery for delivery in self.deliveries if path is None or delivery.path == path]

    def wait_for(self, count, path=None, seconds=60):
        """The deliveries (to path) once there are at least count; fail after `seconds` (generous,
        for a loaded machine: it returns as soon as they are there)."""
        deadline = time.monotonic() + seconds
        while len(found := self.received(path)) < count:
            assert time.monotonic() < deadline, f"{len(found)} of {count} deliveries arrived in {seconds} s"
            time.sleep(0.05)
        return found

    def stop(self):
        self.stopping.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def verifies(secret, delivery):
    """True when the `standardwebhooks` library accepts the delivery under this secret (one of the
    signatures in its webhook-signature is the secret's)."""
    try:
        Webhook(secret).verify(delivery.body, delivery.headers)
        return True
    except Exception:  # the library's own errors for every way a signature fails
        return False


@contextlib.contextmanager
def receiving():
    receiver = Receiver()
    receiver.thread.start()
    try:
        yield receiver
    finally:
        receiver.stop()
    differing = [f"{delivery.message_id}: {error}"
                 for delivery in receiver.received() for error in delivery.catalog_errors]
    assert not differing, "deliveries that differ from openapi.json's webhooks:\n" + "\n".join(differing)
