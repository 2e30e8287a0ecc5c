"""One line of a key import file (orgs/keyimports.py), read and checked alone: its fields, each
hash in the form this service keeps it, and every bound an attacker's file could test (a
prefix that would take this service's own secrets, a slow hash that would cost seconds or GiBs
to check, dates that overflow, characters that would pass for another key's)."""

import base64
import binascii
import datetime
import json
import re

from keys import allowips
from keys.imported import SECRET_FORM
from keys.keyformat import KEY_PREFIXES
from keys.models import SCHEMES, SLOW_SCHEMES
from metering import credits
from models import utcnow
from orgs import keyactions

MAX_PREFIX_LENGTH = 32
MIN_LOOKUP_PREFIX_LENGTH, MAX_LOOKUP_PREFIX_LENGTH = 12, 64
MAX_START_LENGTH = 16
MAX_EXTERNAL_ID_LENGTH = 255
# The slow hashes' work is bounded, so that an imported hash cannot make one check cost seconds or GiBs.
MAX_BCRYPT_COST = 12
# The salt's 22nd character carries 2 bits only (one of .Oeu): bcrypt refuses any other as an invalid salt.
BCRYPT_HASH = re.compile(r"\$2[abxy]\$(?P<cost>[0-9]{2})\$[./A-Za-z0-9]{21}[.Oeu][./A-Za-z0-9]{31}")
MAX_ARGON2 = {"m": 65536, "t": 4, "p": 8}
ARGON2ID_HASH = re.compile(r"\$argon2id\$v=19\$m=(?P<m>[0-9]{1,7}),t=(?P<t>[0-9]{1,3}),p=(?P<p>[0-9]{1,2})"
                           r"\$[A-Za-z0-9+/]{11,88}\$[A-Za-z0-9+/]{16,88}")
FIELDS = {"hash", "hash_scheme", "prefix", "lookup_prefix", "start", "name", "type", "tier", "scopes", "allow_ips",
          "expires_at", "credits", "refill", "created_at", "external_id"}


def parsed(text):
    """A line's fields, checked; ValueError with the reason otherwise."""
    try:
        fields = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        raise ValueError("not a JSON object") from None
    if not isinstance(fields, dict):
        raise ValueError("not a JSON object")
    if unknown := sorted(set(fields) - FIELDS):
        raise ValueError(f"unknown field {unknown[0]!r}")
    for name in ("hash", "hash_scheme", "name"):
        if not isinstance(fields.get(name), str):
            raise ValueError(f"{name} is required, a string")
    scheme = fields["hash_scheme"]
    if scheme not in SCHEMES:
        raise ValueError(f"hash_scheme is one of {', '.join(SCHEMES)}, not {scheme!r}")
    checked = {"scheme": scheme, "name": keyactions.checked_name(fields["name"]),
               "key_type": optional_text(fields, "type", 16) or "production",
               "tier": keyactions.checked_tier(optional_text(fields, "tier", 32) or "free"),
               "scopes": keyactions.parse_scopes(listed(fields, "scopes")),
               "allow_ips": allowips.parse(",".join(listed(fields, "allow_ips"))),
               "expires_at": moment(fields, "expires_at"), "created_at": moment(fields, "created_at"),
               "external_id": printable(fields, "external_id", MAX_EXTERNAL_ID_LENGTH),
               "start": ascii_start(fields)}
    if checked["key_type"] not in KEY_PREFIXES:
        raise ValueError(f"type is {' or '.join(KEY_PREFIXES)}")
    if checked["expires_at"] is not None and checked["expires_at"] <= utcnow():
        raise ValueError("expires_at has passed")
    if checked["created_at"] is not None and checked["created_at"] > utcnow():
        raise ValueError("created_at is in the future")
    given = fields.get("credits")
    if given is not None and (type(given) is not int or not 0 <= given <= credits.MAX_CREDITS):
        raise ValueError(f"credits is a whole number from 0 to {credits.MAX_CREDITS}")
    checked["credits"] = credits.initial(given, credits.parse_refill(optional_text(fields, "refill", 32)))
    if scheme in SLOW_SCHEMES:
        checked.update(slow_hash=slow_hash(scheme, fields["hash"]), lookup_prefix=lookup_prefix(fields), prefix=None)
    else:
        checked.update(key_hash=sha256_hex(scheme, fields["hash"]), prefix=declared_prefix(fields), lookup_prefix=None)
    return checked


def optional_text(fields, name, length):
    value = fields.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > length:
        raise ValueError(f"{name} is a string of at most {length} characters")
    return value


def printable(fields, name, length):
    value = optional_text(fields, name, length)
    if value is not None and not value.isprintable():
        raise ValueError(f"{name} cannot contain control characters")
    return value or None


def ascii_start(fields):
    """The start shown for the key: printable ASCII without spaces, as webhooks' key_prefix promises."""
    start = optional_text(fields, "start", MAX_START_LENGTH)
    if start and re.fullmatch(r"[!-~]+", start) is None:
        raise ValueError("start is printable ASCII without spaces")
    if start and start.startswith(tuple(KEY_PREFIXES.values())):
        raise ValueError("start may not pass for this service's own secrets (sk_live_, sk_test_)")
    return start or None


def listed(fields, name):
    """A field given as a list of strings or as one comma-separated string."""
    value = fields.get(name)
    if value is None:
        return []
    if isinstance(value, str):
        value = value.split(",")
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value) or len(value) > 100:
        raise ValueError(f"{name} is a list of strings or one comma-separated string")
    return value


def moment(fields, name):
    value = optional_text(fields, name, 40)
    if value is None:
        return None
    try:
        parsed_moment = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
        if parsed_moment.tzinfo is not None:
            parsed_moment = parsed_moment.astimezone(datetime.timezone.utc).replace(tzinfo=None)
    except (ValueError, OverflowError):
        raise ValueError(f"{name} is an ISO 8601 time, such as 2027-01-31T00:00:00Z") from None
    return parsed_moment


def sha256_hex(scheme, text):
    if scheme == "sha256-hex":
        if re.fullmatch(r"[0-9a-fA-F]{64}", text) is None:
            raise ValueError("a sha256-hex hash is 64 hexadecimal digits")
        return text.lower()
    try:
        digest = base64.b64decode(text.replace("-", "+").replace("_", "/") + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        digest = b""
    if len(digest) != 32:
        raise ValueError("a sha256-base64 hash is the 32 bytes of a SHA-256 in base64")
    return digest.hex()


def slow_hash(scheme, text):
    if scheme == "bcrypt":
        match = BCRYPT_HASH.fullmatch(text)
        if match is None:
            raise ValueError("a bcrypt hash looks like $2b$12$ and 53 characters of bcrypt's base64")
        if not 4 <= int(match["cost"]) <= MAX_BCRYPT_COST:
            raise ValueError(f"a bcrypt hash's cost is at most {MAX_BCRYPT_COST}")
        return text
    match = ARGON2ID_HASH.fullmatch(text)
    if match is None:
        raise ValueError("an argon2id hash is a PHC string: $argon2id$v=19$m=...,t=...,p=...$salt$hash")
    if any(not 1 <= int(match[name]) <= most for name, most in MAX_ARGON2.items()):
        raise ValueError("an argon2id hash's parameters are at most m=65536 (64 MiB), t=4 and p=8")
    return text


def declared_prefix(fields):
    if "lookup_prefix" in fields:
        raise ValueError("lookup_prefix is for bcrypt and argon2id hashes; a SHA-256 key gives prefix")
    prefix = fields.get("prefix")
    if not isinstance(prefix, str) or len(prefix) > MAX_PREFIX_LENGTH:
        raise ValueError(f"prefix is required for a SHA-256 hash: a string of at most {MAX_PREFIX_LENGTH} characters, "
                         "\"\" where the secrets share none")
    if prefix and re.fullmatch(r"[!-~]+", prefix) is None:
        raise ValueError("prefix is printable ASCII without spaces")
    return native_form_refused(prefix, "prefix")


def lookup_prefix(fields):
    if "prefix" in fields:
        raise ValueError("prefix is for SHA-256 hashes; a bcrypt or argon2id key gives lookup_prefix")
    value = fields.get("lookup_prefix")
    if (not isinstance(value, str) or SECRET_FORM.fullmatch(value.ljust(16, "x")) is None
            or not MIN_LOOKUP_PREFIX_LENGTH <= len(value) <= MAX_LOOKUP_PREFIX_LENGTH):
        raise ValueError(f"lookup_prefix is required for a slow hash: the secret's first {MIN_LOOKUP_PREFIX_LENGTH} to "
                         f"{MAX_LOOKUP_PREFIX_LENGTH} characters, printable ASCII without spaces")
    return native_form_refused(value, "lookup_prefix")


def native_form_refused(prefix, name):
    """The prefix, unless it is a start of this service's own secrets or they are a start of it."""
    for native in KEY_PREFIXES.values():
        if prefix and (native.startswith(prefix) or prefix.startswith(native)):
            raise ValueError(f"{name} {prefix!r} would take secrets of this service's own form (sk_live_, sk_test_)")
    return prefix
