"""GitHub's side of secret scanning for the tests: a signer with a key pair of its own, a
loopback server of the public keys document (counting its reads, and slow, huge, failing or
dripping on demand), and the signed report's headers."""

import base64
import contextlib
import http.server
import json
import threading
import time

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from liveserver import ROOT

PATH = "/api/v1/integrations/github/secret-scanning"
SAMPLES = json.loads((ROOT / "tests" / "fixtures" / "github_secret_scanning.json").read_text())["samples"]


class Signer:
    """An ECDSA P-256 key pair under an identifier, as GitHub holds one."""

    def __init__(self, identifier):
        self.identifier = identifier
        self.private_key = ec.generate_private_key(ec.SECP256R1())

    def public_pem(self):
        return self.private_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()

    def entry(self, current=True):
        return {"key_identifier": self.identifier, "key": self.public_pem(), "is_current": current}

    def sign(self, body):
        return base64.b64encode(self.private_key.sign(body, ec.ECDSA(hashes.SHA256()))).decode()

    def headers(self, body, identifier=None):
        """The headers GitHub sends with a report whose raw body is body."""
        return {"Content-Type": "application/json", "Github-Public-Key-Identifier": identifier or self.identifier,
                "Github-Public-Key-Signature": self.sign(body)}


def report(*tokens, url="https://github.com/octo/repo/blob/0123abc/settings.py", source="content",
           token_type="api_key_demo_service_key"):
    """The raw body of a report naming the tokens, as GitHub writes it (compact JSON)."""
    return json.dumps([{"token": token, "type": token_type, "url": url, "source": source} for token in tokens],
                      separators=(",", ":")).encode()


def send(client, signer, body, **options):
    """The report's raw body posted as GitHub posts it, signed, with Flask's test client."""
    return client.post(PATH, data=body, headers=signer.headers(body), **options)


class KeysServer(http.server.ThreadingHTTPServer):
    # server_close joins every request's thread: none outlives the test.
    daemon_threads = False
    block_on_close = True
    request_queue_size = 128


class Keys:
    """The public keys document on http://127.0.0.1:PORT/keys. answer(handler) may replace the
    document: a (status, body bytes) pair, or None to hold the request until the server stops."""

    def __init__(self, *signers):
        self.document = {"public_keys": [signer.entry() for signer in signers]}
        self.reads = 0
        self.lock = threading.Lock()
        self.answer = None
        self.stopping = threading.Event()
        keys = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # A client that keeps its connection open holds its thread this long at most.
            timeout = 5

            def do_GET(self):
                with keys.lock:
                    keys.reads += 1
                answer = keys.answer(self) if keys.answer else (200, json.dumps(keys.document).encode())
                if answer is None:
                    keys.stopping.wait(60)
                    return
                status, body = answer
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = KeysServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/keys"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def read_count(self):
        with self.lock:
            return self.reads

    def drip(self, handler):
        """An answer whose head comes a byte every half second, for ever (until the server stops)."""
        handler.wfile.write(b"HTTP/1.1 200 OK\r\n")
        handler.wfile.flush()
        self.dripping(handler, b"X")

    def drip_body(self, handler, version="HTTP/1.1"):
        """An answer whose whole head arrives at once, saying that the body ends with the connection,
        and whose body then comes a byte every half second, for ever (until the server stops)."""
        handler.wfile.write(f"{version} 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n"
                            .encode())
        handler.wfile.flush()
        self.dripping(handler, b"{")

    def dripping(self, handler, byte):
        while not self.stopping.wait(0.5):
            try:
                handler.wfile.write(byte)
                handler.wfile.flush()
            except OSError:
                return

    def flood(self, handler):
        """An answer with no length, ended by the connection, whose body never ends."""
        handler.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n")
        chunk = b" " * 65536
        while not self.stopping.is_set():
            try:
                handler.wfile.write(chunk)
            except OSError:
                return

    def stop(self):
        self.stopping.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


@contextlib.contextmanager
def serving_keys(*signers):
    keys = Keys(*signers)
    keys.thread.start()
    try:
        yield keys
    finally:
        keys.stop()


def elapsed(call):
    """(call's result, the seconds it took)."""
    started = time.monotonic()
    result = call()
    return result, time.monotonic() - started
