"""A webhook receiver for the tests: a local HTTP server on a free port, in a thread, that verifies
every delivery with the `standardwebhooks` library and answers as the test tells it."""

import contextlib
import http.server
import json
import threading
import time

from standardwebhooks import Webhook


class Delivery:
    def __init__(self, path, headers, body, verified, error):
        self.path = path
        self.headers = headers
        self.body = body
        self.verified = verified
        self.error = error
        self.message_id = headers.get("webhook-id")
        self.payload = json.loads(body) if body else None
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
    written as they are in place of an answer, and the connection closed (b"": no answer at all)."""

    def __init__(self):
        self.secrets = {}
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
        delivery = Delivery(path, headers, body, verified, error)
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


@contextlib.contextmanager
def receiving():
    receiver = Receiver()
    receiver.thread.start()
    try:
        yield receiver
    finally:
        receiver.stop()
