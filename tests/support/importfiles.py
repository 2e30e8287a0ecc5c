"""Lines of a key import file (docs/importing-keys.md) for secrets a test makes up: each hash scheme
as another system would have stored it, at the cheapest cost the hash allows, so a test's first
uses stay quick."""

import base64
import hashlib
import json
import secrets

import bcrypt
from argon2 import PasswordHasher

LOOKUP_LENGTH = 14


def made_secret(start="acme_live_"):
    return start + secrets.token_urlsafe(24)


def sha256_hex(secret, prefix="acme_live_", **more):
    return {"hash": hashlib.sha256(secret.encode()).hexdigest(), "hash_scheme": "sha256-hex", "prefix": prefix,
            "name": "hex", **more}


def sha256_base64(secret, prefix="acme_live_", **more):
    digest = hashlib.sha256(secret.encode()).digest()
    return {"hash": base64.b64encode(digest).decode(), "hash_scheme": "sha256-base64", "prefix": prefix,
            "name": "base64", **more}


def bcrypt_line(secret, **more):
    # bcrypt reads 72 bytes of a secret, and the library refuses more: cut as other systems' libraries do.
    return {"hash": bcrypt.hashpw(secret.encode()[:72], bcrypt.gensalt(4)).decode(), "hash_scheme": "bcrypt",
            "lookup_prefix": secret[:LOOKUP_LENGTH], "name": "bcrypt", **more}


def argon2id_line(secret, **more):
    hasher = PasswordHasher(time_cost=1, memory_cost=64, parallelism=1)
    return {"hash": hasher.hash(secret), "hash_scheme": "argon2id", "lookup_prefix": secret[:LOOKUP_LENGTH],
            "name": "argon2id", **more}


def jsonl(*lines):
    """The file's bytes: one JSON object (or a line given as text, as it stands) a line."""
    return "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines).encode()
