"""Secrets the service must read back (TOTP secrets, webhook signing secrets), kept in the database
Fernet-encrypted with a key derived from SECRET_KEY and the secret's purpose."""

import base64
import hashlib
import hmac

from flask import current_app


def _fernet(purpose):
    # cryptography (~7 ms) is imported by the first secret sealed or read, not by every start.
    from cryptography.fernet import Fernet

    # Derived from SECRET_KEY, which the database does not hold: a copy of the database (a backup,
    # a dump) cannot read the secrets, and every worker can without another setting. Each purpose
    # has a key of its own.
    key = hmac.new(current_app.config["SECRET_KEY"].encode(), purpose.encode(), hashlib.sha256).digest()
    return Fernet(base64.urlsafe_b64encode(key))


def seal(secret, purpose):
    return _fernet(purpose).encrypt(secret.encode()).decode()


def unseal(sealed, purpose):
    """The secret, or None when SECRET_KEY changed since it was sealed."""
    from cryptography.fernet import InvalidToken

    try:
        return _fernet(purpose).decrypt(sealed.encode()).decode()
    except InvalidToken:
        return None
