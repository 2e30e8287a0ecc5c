"""GitHub's public keys for secret scanning: read from GITHUB_SECRET_SCANNING_KEYS_URL within a
bounded time and size, kept for 30 minutes, read again for an unknown identifier at most once a
minute and by one request at a time; and the check of a report's signature against them (ECDSA
P-256 with SHA-256 over the raw body, the signature base64 DER)."""

import base64
import binascii
import http.client
import json
import logging
import socket
import threading
import time
from urllib.parse import urlsplit

import gevent

log = logging.getLogger(__name__)

KEPT_FOR = 30 * 60
READ_AGAIN_AFTER = 60
# The whole read, from connecting to the last byte: a report waits for it, and GitHub for the report.
READ_SECONDS = 5
# GitHub's document holds a few keys of ~180 bytes each.
MAX_DOCUMENT_BYTES = 64 * 1024
MAX_KEYS = 100
USER_AGENT = "api-key-demo-service (secret scanning partner)"


class KeysUnreadable(Exception):
    """The keys URL could not be read, or did not give a document of usable keys."""


class KeysUnavailable(Exception):
    """No kept key has the identifier and the keys cannot be read now: a report cannot be judged."""


class GitHubKeys:
    """The keys of one process, by identifier. key_for never reads the URL while the kept keys are
    younger than KEPT_FOR and hold the identifier; otherwise one caller reads it, at most once every
    READ_AGAIN_AFTER seconds, while the others wait for its answer."""

    def __init__(self, url, read=None, clock=time.monotonic):
        self.url = url
        self.read = read or read_document
        self.clock = clock
        self.keys = {}
        self.etag = None
        self.read_at = None  # the last read that gave keys
        self.tried_at = None  # the last attempt, whatever its outcome
        self.failed = False  # whether that attempt failed
        # The deadline of the read under way, on time.monotonic; None while none is.
        self.reading_until = None
        self.lock = threading.Lock()

    def key_for(self, identifier):
        """The public key with this identifier, or None when GitHub does not list it; KeysUnavailable
        when no kept key has it and the keys could not be read."""
        if self.fresh() and identifier in self.keys:
            return self.keys[identifier]
        # A waiter waits for a read under way until that read's deadline at most, then answers from
        # what is kept: no report waits longer than READ_SECONDS.
        reading_until = self.reading_until
        wait = READ_SECONDS if reading_until is None else max(0.0, reading_until - time.monotonic())
        if not self.lock.acquire(timeout=wait):
            return self.kept_key(identifier, unavailable=True)
        try:
            if not (self.fresh() and identifier in self.keys) and self.may_read():
                self.reading_until = time.monotonic() + READ_SECONDS
                try:
                    self.refresh()
                finally:
                    self.reading_until = None
            return self.kept_key(identifier, unavailable=self.failed)
        finally:
            self.lock.release()

    def kept_key(self, identifier, unavailable):
        """The kept key with this identifier (one past KEPT_FOR still verifies while the URL cannot be
        read), else None, or KeysUnavailable when the keys could not be read to tell."""
        key = self.keys.get(identifier)
        if key is None and unavailable:
            raise KeysUnavailable
        return key

    def fresh(self):
        return self.read_at is not None and self.clock() - self.read_at < KEPT_FOR

    def may_read(self):
        return self.tried_at is None or self.clock() - self.tried_at >= READ_AGAIN_AFTER

    def refresh(self):
        self.tried_at = self.clock()
        try:
            document = self.read(self.url, self.etag)
            if document is not None:  # None: not modified since the kept keys were read
                body, etag = document
                self.keys, self.etag = parse_keys(body), etag
        except KeysUnreadable as error:
            self.failed = True
            log.warning("GitHub's secret-scanning keys could not be read from %s: %s", where(self.url), error)
            return
        self.failed = False
        self.read_at = self.clock()


def where(url):
    """The URL's scheme and host, for the log: the rest may hold a token."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"


def read_document(url, etag=None):
    """(body, ETag) of the keys URL, or None when it answers 304 to etag; KeysUnreadable for
    anything else. No redirect is followed. The whole read ends within about READ_SECONDS and reads
    at most MAX_DOCUMENT_BYTES: a server that drips bytes, never ends or sends more is cut off."""
    parts = urlsplit(url)
    connection_class = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    connection = connection_class(parts.hostname, parts.port, timeout=READ_SECONDS)
    deadline = time.monotonic() + READ_SECONDS
    # A server may send each byte just within the socket's timeout, in the TLS handshake, the head
    # or the body: at the deadline the socket is shut, which ends a read waiting on it, in a thread
    # as in a greenlet. The socket is held apart from the connection, which lets go of it once a
    # response that ends with the connection (Connection: close, HTTP/1.0) has its head.
    connected = []
    watchdog = threading.Timer(READ_SECONDS, lambda: shut(connected[0] if connected else connection.sock))
    watchdog.daemon = True
    watchdog.start()
    try:
        # The watchdog finds no socket to shut while the host name is looked up: under gevent the
        # Timeout cuts a slow lookup; anywhere, the connection gets only the time left.
        with gevent.Timeout(READ_SECONDS, TimeoutError):
            connection.connect()
        connected.append(connection.sock)
        if (left := deadline - time.monotonic()) <= 0:
            raise TimeoutError
        connection.sock.settimeout(left)
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
        if etag:
            headers["If-None-Match"] = etag
        connection.request("GET", (parts.path or "/") + (f"?{parts.query}" if parts.query else ""), headers=headers)
        response = connection.getresponse()
        if response.status == 304 and etag:
            return None
        if response.status != 200:
            raise KeysUnreadable(f"it answered HTTP {response.status}")
        body = bytearray()
        while piece := response.read1(MAX_DOCUMENT_BYTES + 1 - len(body)):
            body += piece
            if len(body) > MAX_DOCUMENT_BYTES:
                raise KeysUnreadable(f"its document is larger than {MAX_DOCUMENT_BYTES} bytes")
        if time.monotonic() >= deadline:
            raise KeysUnreadable(f"it took longer than {READ_SECONDS} s")
        return bytes(body), response.getheader("ETag")
    except (OSError, http.client.HTTPException, ValueError) as error:
        late = time.monotonic() >= deadline
        raise KeysUnreadable(f"it took longer than {READ_SECONDS} s" if late else
                             f"{type(error).__name__}: {error}"[:200]) from None
    finally:
        watchdog.cancel()
        watchdog.join()
        connection.close()


def shut(sock):
    """Shut a connection's socket, if it has one yet."""
    try:
        if sock is not None:
            sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # closed already


def parse_keys(body):
    """{key_identifier: P-256 public key} of a document {"public_keys": [{"key_identifier", "key",
    "is_current"}]}; entries of other kinds are skipped, and KeysUnreadable when none is left. A
    key no longer current still verifies: GitHub lists a key while reports it signed may arrive."""
    # Imported here: a process that never reads a report (every one while the endpoint is off, each
    # CLI command) does not pay for cryptography's start.
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    try:
        document = json.loads(body)
    except (ValueError, RecursionError):
        raise KeysUnreadable("its answer is not JSON") from None
    entries = document.get("public_keys") if isinstance(document, dict) else None
    if not isinstance(entries, list):
        raise KeysUnreadable('its answer is not {"public_keys": [...]}')
    keys = {}
    for entry in entries[:MAX_KEYS]:
        if not isinstance(entry, dict) or not isinstance(entry.get("key_identifier"), str) \
                or not isinstance(entry.get("key"), str):
            continue
        try:
            key = load_pem_public_key(entry["key"].encode())
        except (ValueError, TypeError, UnsupportedAlgorithm):
            continue
        if isinstance(key, ec.EllipticCurvePublicKey) and isinstance(key.curve, ec.SECP256R1):
            keys[entry["key_identifier"]] = key
    if not keys:
        raise KeysUnreadable("its answer holds no P-256 public key")
    return keys


def signature_holds(key, body, signature):
    """True when signature (base64 of a DER ECDSA signature) is key's over body with SHA-256."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    try:
        key.verify(base64.b64decode(signature, validate=True), body, ec.ECDSA(hashes.SHA256()))
    except (InvalidSignature, binascii.Error, ValueError):
        return False
    return True
