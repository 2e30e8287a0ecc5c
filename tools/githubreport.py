"""GitHub's side of secret scanning, for trying the service's GitHub endpoint on your own machine
(docs/leaked-keys.md): it serves a public keys document at the service's keys URL, as GitHub's keys
URL does, POSTs a report naming the tokens to the running service, signed with its private key as
GitHub signs one, and prints the answer. Its P-256 key pair is made on the first run and kept in
instance/githubreport-key.pem, so that the keys the service keeps (for 30 minutes) verify the next
runs' reports too.

    python -m tools.githubreport TOKEN [TOKEN ...] [--service URL] [--keys-url URL] [--url URL]

By default the service is http://127.0.0.1:$PORT (5000 when PORT is unset) and the keys are served
where $GITHUB_SECRET_SCANNING_KEYS_URL says, which must then be an http URL on this machine.
"""

import argparse
import base64
import hashlib
import http.server
import json
import os
import socket
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

PATH = "/api/v1/integrations/github/secret-scanning"
KEY_FILE = Path(__file__).resolve().parents[1] / "instance" / "githubreport-key.pem"
KEYS_URL = "http://127.0.0.1:8700/keys"
LOOPBACK = ("127.0.0.1", "localhost", "::1")
# What the service answers, when the answer is not 200, and what to do about it.
HINTS = {
    404: "The endpoint is off: start the service with GITHUB_SECRET_SCANNING=on and "
         "GITHUB_SECRET_SCANNING_KEYS_URL={keys_url}",
    401: "The signature did not verify against the keys the service holds. It keeps the keys it read for 30 "
         "minutes and reads them again for an identifier it does not know at most once a minute: wait a minute, "
         "or restart the service.",
    503: "The service could not read the keys: is its GITHUB_SECRET_SCANNING_KEYS_URL {keys_url}?",
}


def private_key(path=KEY_FILE):
    """The key pair kept in path, made (and written, readable by its owner only) when there is none."""
    try:
        return serialization.load_pem_private_key(path.read_bytes(), password=None)
    except FileNotFoundError:
        pass
    key = ec.generate_private_key(ec.SECP256R1())
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as file:
        file.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                     serialization.NoEncryption()))
    return key


def public_pem(key):
    return key.public_key().public_bytes(serialization.Encoding.PEM,
                                         serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def key_identifier(key):
    """The SHA-256 of the public key, in hex: as long as GitHub's identifiers, and the same every run."""
    return hashlib.sha256(public_pem(key).encode()).hexdigest()


def keys_document(key):
    """The keys URL's answer, as GitHub's: {"public_keys": [{"key_identifier", "key", "is_current"}]}."""
    return {"public_keys": [{"key_identifier": key_identifier(key), "key": public_pem(key), "is_current": True}]}


def report(tokens, url, token_type="api_key_demo_service_key"):
    """A report's raw body, compact JSON as GitHub writes it."""
    return json.dumps([{"token": token, "type": token_type, "url": url, "source": "content"} for token in tokens],
                      separators=(",", ":")).encode()


def signed_headers(key, body):
    """The headers GitHub sends with a report: its key's identifier and the base64 DER signature of the body."""
    signature = key.sign(body, ec.ECDSA(hashes.SHA256()))
    return {"Content-Type": "application/json", "Github-Public-Key-Identifier": key_identifier(key),
            "Github-Public-Key-Signature": base64.b64encode(signature).decode()}


def keys_address(keys_url):
    """(host, port) where the keys URL is served; ValueError unless it is an http URL on this machine."""
    parts = urlsplit(keys_url)
    if parts.scheme != "http" or parts.hostname not in LOOPBACK:
        raise ValueError(f"The keys URL is {keys_url}: give the service (GITHUB_SECRET_SCANNING_KEYS_URL) and "
                         f"this tool one on this machine, such as {KEYS_URL}, where this tool serves the keys.")
    return parts.hostname, parts.port or 80


class KeysServer(http.server.ThreadingHTTPServer):
    """The keys document on every GET path of the keys URL's host and port, while a report is sent."""

    daemon_threads = True

    def __init__(self, address, document):
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.document = json.dumps(document).encode()
        super().__init__(address, KeysHandler)


class KeysHandler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.server.document)))
        self.end_headers()
        self.wfile.write(self.server.document)
        print(f"The service read the public keys (GET {self.path}).", flush=True)

    def log_message(self, *args):
        pass  # the line above says what came


def send(service, body, headers):
    """(status, answer's text) of the service's GitHub endpoint for the report."""
    request = urllib.request.Request(service.rstrip("/") + PATH, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def main(argv=None, environ=os.environ):
    parser = argparse.ArgumentParser(prog="python -m tools.githubreport", description=__doc__.split("\n\n")[0])
    parser.add_argument("tokens", nargs="+", metavar="TOKEN", help="a token to report found in public")
    parser.add_argument("--service", default=f"http://127.0.0.1:{environ.get('PORT') or 5000}",
                        help="the running service (%(default)s)")
    parser.add_argument("--keys-url", default=environ.get("GITHUB_SECRET_SCANNING_KEYS_URL") or KEYS_URL,
                        help="where the public keys are served: the service's GITHUB_SECRET_SCANNING_KEYS_URL "
                             "(%(default)s)")
    parser.add_argument("--url", default="https://github.com/octo-org/octo-repo/blob/main/settings.py",
                        help="where GitHub says it found them (%(default)s)")
    parser.add_argument("--key-file", type=Path, default=KEY_FILE, help="the kept key pair (%(default)s)")
    options = parser.parse_args(argv)
    try:
        address = keys_address(options.keys_url)
    except ValueError as error:
        print(error, file=sys.stderr)
        return 1
    key = private_key(options.key_file)
    try:
        server = KeysServer(address, keys_document(key))
    except OSError as error:
        print(f"Cannot serve the keys at {options.keys_url}: {error.strerror}.", file=sys.stderr)
        return 1
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(f"Serving the public keys at {options.keys_url} (key identifier {key_identifier(key)[:16]}...).",
          flush=True)
    body = report(options.tokens, options.url)
    try:
        status, answer = send(options.service, body, signed_headers(key, body))
    except OSError as error:
        print(f"Nothing answered at {options.service} ({error}): is the service running?", file=sys.stderr)
        return 1
    finally:
        server.shutdown()
        server.server_close()
    print(f"POST {options.service.rstrip('/')}{PATH}: HTTP {status}")
    print(answer.strip())
    if status in HINTS:
        print(HINTS[status].format(keys_url=options.keys_url), file=sys.stderr)
    return 0 if status == 200 else 1


if __name__ == "__main__":
    sys.exit(main())
