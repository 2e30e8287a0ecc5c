"""A software WebAuthn authenticator for tests: one P-256 credential whose assertions the test
shapes (flags, sign counter, origin, user handle) to play an attacker's part."""

import base64
import hashlib
import json
import os
import struct

import cbor2
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

USER_PRESENT, USER_VERIFIED = 0x01, 0x04


def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def from_b64url(text):
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class SoftAuthenticator:
    def __init__(self):
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.credential_id = b64url(os.urandom(16))
        self.count = 0

    def public_key(self):
        """The credential's public key as COSE (EC2, ES256), as a registration stores it."""
        numbers = self.key.public_key().public_numbers()
        return cbor2.dumps({1: 2, 3: -7, -1: 1, -2: numbers.x.to_bytes(32, "big"), -3: numbers.y.to_bytes(32, "big")})

    def assertion(self, options, origin="http://localhost", flags=USER_PRESENT | USER_VERIFIED, count=None,
                  user_handle=None):
        """The JSON of navigator.credentials.get's answer to options (as the server sent them)."""
        self.count = self.count + 1 if count is None else count
        auth_data = hashlib.sha256(options["rpId"].encode()).digest() + bytes([flags]) + struct.pack(">I", self.count)
        client_data = json.dumps({"type": "webauthn.get", "challenge": options["challenge"], "origin": origin}).encode()
        signature = self.key.sign(auth_data + hashlib.sha256(client_data).digest(), ec.ECDSA(hashes.SHA256()))
        response = {"clientDataJSON": b64url(client_data), "authenticatorData": b64url(auth_data),
                    "signature": b64url(signature)}
        if user_handle is not None:
            response["userHandle"] = b64url(user_handle)
        return json.dumps({"id": self.credential_id, "rawId": self.credential_id, "type": "public-key",
                           "response": response})
