"""Passkeys (WebAuthn Level 2, on py_webauthn): registration, password-less log-in and use as the
second factor, with each ceremony's challenge kept server-side, used once, for a short while.

py_webauthn is imported by the ceremonies that use it, on the passkey pages only: its import takes
~70 ms (cryptography, pyOpenSSL, pyasn1), about as long as Flask's own."""

import datetime
import json
import re
import secrets
from urllib.parse import urlsplit

from flask import current_app, request
from peewee import IntegrityError

from accounts import securitylog, sessions, users
from accounts.models import Passkey, WebAuthnChallenge
from models import Session, User, db, utcnow

RP_NAME = "API-key demo service"
CHALLENGE_LIFE = datetime.timedelta(minutes=2)
TIMEOUT_MS = 120_000
MAX_PASSKEYS = 10
MAX_NAME_LENGTH = 64
# A credential JSON far beyond any authenticator's is refused before parsing.
MAX_CREDENTIAL_CHARACTERS = 16_384
REGISTER, LOGIN, SECOND_FACTOR = "register", "login", "2fa"
# What a stored credential id looks like (base64url, as Passkey.credential_id holds it): anything
# else is no passkey of ours and never reaches a query (PostgreSQL refuses NUL with an error).
CREDENTIAL_ID = re.compile(r"[A-Za-z0-9_-]{1,1400}")


class PasskeyRefused(ValueError):
    """The browser's answer does not prove a registered passkey (or a new one) for this ceremony."""


def rp_id():
    return current_app.config["WEBAUTHN_RP_ID"] or urlsplit(request.host_url).hostname


def origin():
    return current_app.config["WEBAUTHN_ORIGIN"] or request.host_url.rstrip("/")


def user_handle(user_id):
    # The account's id, not its name or email: the handle is stored on the authenticator.
    return str(user_id).encode()


def owned(user):
    return list(Passkey.select().where(Passkey.user == user.id).order_by(Passkey.id))


def keep_challenge(purpose, challenge, user=None):
    """Store a ceremony's challenge; return the token for the browser's cookie."""
    token = secrets.token_urlsafe(32)
    with db.atomic():
        WebAuthnChallenge.delete().where(WebAuthnChallenge.expires_at < utcnow()).execute()
        WebAuthnChallenge.create(token_hash=sessions.token_hash(token), purpose=purpose,
                                 user=user.id if user else None, challenge=challenge,
                                 expires_at=utcnow() + CHALLENGE_LIFE)
    return token


def take_challenge(token, purpose, user=None):
    """The challenge of the cookie's token for this ceremony (and user), once; None when there is
    none, it expired, or another request took it."""
    if not isinstance(token, str) or not token:
        return None
    row = WebAuthnChallenge.get_or_none(WebAuthnChallenge.token_hash == sessions.token_hash(token))
    if row is None or not WebAuthnChallenge.delete().where(WebAuthnChallenge.token_hash == row.token_hash).execute():
        return None
    if row.purpose != purpose or row.expires_at < utcnow() or row.user_id != (user.id if user else None):
        return None
    return bytes(row.challenge)


def registration_options(user):
    """(options JSON for navigator.credentials.create, challenge token)."""
    import webauthn
    from webauthn.helpers.structs import (
        AuthenticatorSelectionCriteria,
        ResidentKeyRequirement,
        UserVerificationRequirement,
    )

    options = webauthn.generate_registration_options(
        rp_id=rp_id(), rp_name=RP_NAME, user_name=user.username, user_id=user_handle(user.id),
        timeout=TIMEOUT_MS,
        authenticator_selection=AuthenticatorSelectionCriteria(
            resident_key=ResidentKeyRequirement.REQUIRED, user_verification=UserVerificationRequirement.REQUIRED),
        exclude_credentials=[descriptor(passkey) for passkey in owned(user)])
    return webauthn.options_to_json(options), keep_challenge(REGISTER, options.challenge, user)


def descriptor(passkey):
    import webauthn
    from webauthn.helpers.structs import PublicKeyCredentialDescriptor

    return PublicKeyCredentialDescriptor(id=webauthn.base64url_to_bytes(passkey.credential_id))


def register(user, token, name, credential):
    """Verify a new credential and store it under name; return the Passkey."""
    import webauthn
    from webauthn.helpers import bytes_to_base64url
    from webauthn.helpers.exceptions import WebAuthnException

    name = " ".join(name.split()) if isinstance(name, str) else ""
    users.refuse_control_characters(name, "A passkey's name")
    if not 1 <= len(name) <= MAX_NAME_LENGTH:
        raise ValueError(f"Give the passkey a name of 1 to {MAX_NAME_LENGTH} characters.")
    challenge = take_challenge(token, REGISTER, user)
    if challenge is None:
        raise PasskeyRefused("The passkey request expired; add the passkey again.")
    try:
        verified = webauthn.verify_registration_response(
            credential=bounded(credential), expected_challenge=challenge, expected_rp_id=rp_id(),
            expected_origin=origin(), require_user_verification=True)
    except (WebAuthnException, ValueError, TypeError, KeyError) as error:
        raise PasskeyRefused("The browser's answer was not a valid new passkey.") from error
    with db.atomic():
        users.lock_user(user)
        if Passkey.select().where(Passkey.user == user.id).count() >= MAX_PASSKEYS:
            raise ValueError(f"An account has at most {MAX_PASSKEYS} passkeys; remove one first.")
        try:
            with db.atomic():
                passkey = Passkey.create(user=user.id, name=name,
                                         credential_id=bytes_to_base64url(verified.credential_id),
                                         public_key=verified.credential_public_key, sign_count=verified.sign_count)
        except IntegrityError:
            raise PasskeyRefused("That passkey is already registered.") from None
        securitylog.record(user.id, "user.passkey_added", name)
    return passkey


def bounded(credential):
    if not isinstance(credential, str) or len(credential) > MAX_CREDENTIAL_CHARACTERS:
        raise ValueError("credential")
    return credential


def authentication_options(purpose, user=None):
    """(options JSON for navigator.credentials.get, challenge token). For the log-in page no
    credentials are listed (the authenticator offers its discoverable ones); for the second
    factor, the user's."""
    import webauthn
    from webauthn.helpers.structs import UserVerificationRequirement

    allowed = [descriptor(passkey) for passkey in owned(user)] if user else []
    options = webauthn.generate_authentication_options(
        rp_id=rp_id(), timeout=TIMEOUT_MS, allow_credentials=allowed,
        user_verification=UserVerificationRequirement.REQUIRED)
    return webauthn.options_to_json(options), keep_challenge(purpose, options.challenge, user)


def authenticate(token, purpose, credential, user=None):
    """Verify an assertion for the ceremony of token; return the passkey's user (who must be user,
    when given). The sign counter must grow (unless the authenticator keeps none)."""
    import webauthn
    from webauthn.helpers.exceptions import WebAuthnException

    challenge = take_challenge(token, purpose, user)
    if challenge is None:
        raise PasskeyRefused("The passkey request expired; try again.")
    try:
        parsed = json.loads(bounded(credential))
        raw_id = parsed["rawId"]
        passkey = None
        if isinstance(raw_id, str) and CREDENTIAL_ID.fullmatch(raw_id):
            passkey = Passkey.get_or_none(Passkey.credential_id == raw_id)
        if passkey is None or (user is not None and passkey.user_id != user.id):
            raise PasskeyRefused("That passkey is not registered here.")
        handle = (parsed.get("response") or {}).get("userHandle")
        if handle and webauthn.base64url_to_bytes(handle) != user_handle(passkey.user_id):
            raise PasskeyRefused("That passkey belongs to another account.")
        verified = webauthn.verify_authentication_response(
            credential=credential, expected_challenge=challenge, expected_rp_id=rp_id(), expected_origin=origin(),
            credential_public_key=bytes(passkey.public_key), credential_current_sign_count=passkey.sign_count,
            require_user_verification=True)
    except PasskeyRefused:
        raise
    except (WebAuthnException, ValueError, TypeError, KeyError, AttributeError) as error:
        raise PasskeyRefused("The passkey's answer could not be verified.") from error
    # Compare-and-set: of two requests with the same count (a cloned authenticator, a replay
    # racing the original) one wins.
    moved = (Passkey.update(sign_count=verified.new_sign_count, last_used_at=utcnow())
             .where((Passkey.id == passkey.id) & (Passkey.sign_count == passkey.sign_count)).execute())
    if not moved:
        raise PasskeyRefused("The passkey's answer could not be verified.")
    return User.get_by_id(passkey.user_id), passkey


def record_login(user, passkey):
    securitylog.record(user.id, "user.passkey_login", passkey.name)


def remove(user, passkey_id, keep_session):
    """Remove one of the user's passkeys and end every session of the account but keep_session
    (SECURITY.md says why); return its name, or None when the user has no passkey of that id."""
    with db.atomic():
        users.lock_user(user)
        passkey = Passkey.get_or_none((Passkey.id == passkey_id) & (Passkey.user == user.id))
        if passkey is None:
            return None
        passkey.delete_instance()
        Session.delete().where((Session.user == user.id) & (Session.token_hash != keep_session.token_hash)).execute()
        securitylog.record(user.id, "user.passkey_removed", passkey.name)
    return passkey.name
