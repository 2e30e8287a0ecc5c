"""Standard Webhooks 1.0 signatures: the secret's form, and the headers that sign one attempt."""

import base64
import hashlib
import hmac
import secrets

from store import sealing

SECRET_PREFIX = "whsec_"
SECRET_BYTES = 24
# The purpose store/sealing.py derives the sealing key for.
SEALED_AS = "webhook secret"


def new_secret():
    """A signing secret: whsec_ and the base64 of 24 random bytes."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


def signature(secret, message_id, timestamp, body):
    """v1, and the base64 HMAC-SHA256 of id.timestamp.body keyed with the secret's decoded bytes."""
    key = base64.b64decode(secret.removeprefix(SECRET_PREFIX))
    signed = f"{message_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()


def headers(secrets_in_force, message_id, timestamp, body):
    """The headers of one attempt: timestamp is its Unix second, body the exact bytes sent. Each
    secret in force signs, newest first and space-separated, as Standard Webhooks verifiers expect
    during a rotation's overlap."""
    return {
        "webhook-id": message_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": " ".join(signature(secret, message_id, timestamp, body) for secret in secrets_in_force),
    }


def seal(secret):
    return sealing.seal(secret, SEALED_AS)


def unseal(sealed):
    """The secret, or None when SECRET_KEY changed since the endpoint was added."""
    return sealing.unseal(sealed, SEALED_AS)
