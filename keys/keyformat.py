"""The key's secret: its form (prefix, random part, checksum), how one is made, and its hash."""

import hashlib
import re
import secrets
import string
import zlib

KEY_PREFIXES = {"development": "sk_test_", "production": "sk_live_"}
KEY_ALPHABET = string.ascii_letters + string.digits
# New secrets: 32 random characters and a 6-character base62 CRC32 of everything before it, so a
# typo or a scanner's false positive is refused without a database lookup (GitHub's scheme). Keys
# issued before (40 random characters) keep working.
RANDOM_LENGTH = 32
CHECKSUM_LENGTH = 6
CHECKSUM_ALPHABET = string.digits + string.ascii_uppercase + string.ascii_lowercase
CHECKSUMMED_LENGTH = len("sk_live_") + RANDOM_LENGTH + CHECKSUM_LENGTH
KEY_PATTERN = re.compile(r"sk_(?:live|test)_[A-Za-z0-9]{32,128}")
DISPLAY_PREFIX_LENGTH = len("sk_live_") + 4


def hash_key(secret):
    """Return the hex SHA-256 of a key secret, the only form the database keeps."""
    return hashlib.sha256(secret.encode()).hexdigest()


def generate_secret(key_type):
    """Return a new secret: the type's prefix, RANDOM_LENGTH characters from a CSPRNG, the checksum."""
    head = KEY_PREFIXES[key_type] + "".join(secrets.choice(KEY_ALPHABET) for _ in range(RANDOM_LENGTH))
    return head + checksum(head)


def checksum(text):
    """The CRC32 of text in base62 (0-9A-Za-z), left-padded with 0 to CHECKSUM_LENGTH characters."""
    number, digits = zlib.crc32(text.encode()), []
    while number:
        number, digit = divmod(number, 62)
        digits.append(CHECKSUM_ALPHABET[digit])
    return "".join(reversed(digits)).rjust(CHECKSUM_LENGTH, "0")


def checksum_fails(secret):
    """True for a secret of the checksummed length whose checksum does not match."""
    return len(secret) == CHECKSUMMED_LENGTH and checksum(secret[:-CHECKSUM_LENGTH]) != secret[-CHECKSUM_LENGTH:]


def well_formed(secret):
    """True for a secret in the form of a key, with the right checksum where it has one."""
    return KEY_PATTERN.fullmatch(secret) is not None and not checksum_fails(secret)
