"""A billing vendor's API on a loopback port, in a thread of its own (tests/support/billingvendors.py
holds what each vendor takes and answers): what the usage export sends, what it was answered, and
the failures a test asks for."""

import collections
import contextlib
import http
import http.server
import sys
import threading
import time
import urllib.parse

from billingvendors import VENDORS
from billingwire import Refused, Request


class Server(http.server.ThreadingHTTPServer):
    # A backlog for a sender's bursts (http.server's default is 5).
    request_queue_size = 1024
    # server_close() joins the request threads (a held answer is woken first): none outlives the receiver.
    daemon_threads = False
    block_on_close = True

    def handle_error(self, request, client_address):
        # A client that gave up on a held answer has closed its end: no fault of the receiver's.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class VendorReceiver:
    """A vendor's API on 127.0.0.1:<free port>, in a thread, as a context manager (stopped on exit; no
    thread outlives it). vendor is "stripe", "lago", "openmeter" or "cloudevents"; url is the base URL
    the vendor's client takes (for "cloudevents", the sink's own URL). What the receiver took is in
    `accepted`, what it dropped or refused as a reused identifier in `duplicates` (dicts with id, meter,
    customer, value, time, key_id, org and raw), every request in `requests` (method, path, headers
    with lower-case names, body, the status answered), and the reason for every request refused for not
    matching the vendor's description (401s included) in `invalid`."""

    def __init__(self, vendor, token="test-billing-token"):
        self.vendor = VENDORS[vendor](token)
        self.accepted, self.duplicates, self.invalid, self.requests = [], [], [], []
        self.lock = threading.Lock()
        self.failures = collections.deque()
        self.seen = set()
        self.in_flight = collections.Counter()
        self.most_in_flight = collections.Counter()
        self.stopping = threading.Event()
        self.server = Server(("127.0.0.1", 0), handler_for(self))
        base = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.url = base + self.vendor.path if vendor == "cloudevents" else base
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                       name=f"{vendor} receiver")

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc_info):
        self.stopping.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()

    def fail(self, times, how):
        """The next `times` requests that match the description get, instead of the answer: 500, 400,
        ("429", seconds) (the vendor's rate limit, announcing the wait as the vendor does), "close" (the
        connection closed unanswered) or ("slow", seconds) (the vendor takes that long over the request,
        then answers as usual)."""
        if how not in (500, 400, "close") and not (isinstance(how, tuple) and how[0] in ("429", "slow")):
            raise ValueError(f"no such failure: {how!r}")
        with self.lock:
            self.failures.extend([how] * times)

    def concurrent_max(self, key):
        """The most requests in flight at once for one (customer, meter) pair."""
        with self.lock:
            return self.most_in_flight[key]

    def wait_for(self, count, seconds=60):
        """The accepted events once there are at least count; AssertionError after `seconds`."""
        deadline = time.monotonic() + seconds
        while True:
            with self.lock:
                accepted = list(self.accepted)
            if len(accepted) >= count:
                return accepted
            assert time.monotonic() < deadline, f"{len(accepted)} of {count} events arrived in {seconds} s"
            time.sleep(0.05)

    def serve(self, handler, body):
        method, path = handler.command, urllib.parse.urlsplit(handler.path).path
        headers = {name.lower(): value for name, value in handler.headers.items()}
        try:
            events = self.vendor.read(method, path, headers, body)
        except Refused as refused:
            with self.lock:
                self.invalid.append(f"{type(self.vendor).__name__}: {refused.reason}")
                self.requests.append(Request(method, path, headers, body, refused.answer.status))
            return refused.answer
        with self.counted({(event["customer"], event["meter"]) for event in events}):
            with self.lock:
                failure = self.failures.popleft() if self.failures else None
            answer = self.outcome(failure, events, headers, body)
            with self.lock:
                self.requests.append(Request(method, path, headers, body, answer and answer.status))
        return answer

    def outcome(self, failure, events, headers, body):
        """The answer to a request that matches the description, given the failure asked for (None:
        close the connection unanswered)."""
        if failure == "close":
            return None
        if failure == 400:
            return self.vendor.refusal(400, "Refused at the test's request.")
        if isinstance(failure, tuple) and failure[0] == "429":
            return self.vendor.rate_limited(failure[1])

        def execute():
            # A slow vendor is slow at its work: the events are taken (and an idempotency key held)
            # only once the time is up, whether or not the client still waits.
            if isinstance(failure, tuple) and failure[0] == "slow":
                self.stopping.wait(failure[1])
            return self.vendor.server_error() if failure == 500 else self.settle(events)

        return self.vendor.replayed(headers, body, execute)

    def settle(self, events):
        with self.lock:
            reused, identities = [], set()
            for event in events:
                identity = self.vendor.identity(event)
                reused.append(identity in self.seen or identity in identities)
                identities.add(identity)
            answer, kept = self.vendor.settle(events, reused)
            self.accepted.extend(kept)
            self.seen.update(self.vendor.identity(event) for event in kept)
            self.duplicates.extend(event for event, again in zip(events, reused) if again)
        return answer

    @contextlib.contextmanager
    def counted(self, keys):
        """Counts the request in flight for each key until its answer is ready; the answer is written
        after, so a client that waits for it never overlaps itself."""
        with self.lock:
            for key in keys:
                self.in_flight[key] += 1
                self.most_in_flight[key] = max(self.most_in_flight[key], self.in_flight[key])
        try:
            yield
        finally:
            with self.lock:
                self.in_flight.subtract(keys)


def handler_for(receiver):
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            answer = receiver.serve(self, self.rfile.read(int(self.headers.get("Content-Length", 0))))
            # One request a connection: nothing keeps a request thread waiting once it is answered.
            self.close_connection = True
            if answer is None:
                return
            self.send_response(answer.status)
            for name, value in answer.headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(answer.body)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(answer.body)

        do_GET = do_PUT = do_PATCH = do_DELETE = do_POST

        def log_message(self, *args):
            pass

    return Handler
