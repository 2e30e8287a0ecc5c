"""Keys another system issued, imported into an organisation by their hash from a JSON Lines file
(`keys import`, the Organisation tab's Import keys form): each line checked alone, written in
transactions of BATCH lines, so that an interruption leaves whole lines imported or not and a
second run refuses those already here. The secrets never pass through: only their hashes."""

import base64
import binascii
import bisect
import dataclasses
import datetime
import json
import re
import secrets

from peewee import IntegrityError

from accounts import securitylog
from keys import allowips, events, keycache
from keys.imported import SECRET_FORM
from keys.keyformat import KEY_PREFIXES
from keys.models import AWAITING_FIRST_USE, SCHEMES, SLOW_SCHEMES, ImportedKey
from metering import credits
from models import SCOPES, ApiKey, SecurityEvent, db, iso_seconds, utcnow
from orgs import keyactions, organisations

MAX_LINES = 10_000
MAX_BYTES = 5 * 1024 * 1024
BATCH = 500
# Imported keys an organisation may hold (active or not): what one member's imports can make it store.
MAX_IMPORTED_KEYS = 100_000
MAX_PREFIX_LENGTH = 32
MIN_LOOKUP_PREFIX_LENGTH, MAX_LOOKUP_PREFIX_LENGTH = 12, 64
MAX_START_LENGTH = 16
MAX_EXTERNAL_ID_LENGTH = 255
# The slow hashes' work is bounded, so that an imported hash cannot make one check cost seconds or GiBs.
MAX_BCRYPT_COST = 12
# The salt's 22nd character carries 2 bits only (one of .Oeu): bcrypt refuses any other as an invalid salt.
BCRYPT_HASH = re.compile(r"\$2[abxy]\$(?P<cost>[0-9]{2})\$[./A-Za-z0-9]{21}[.Oeu][./A-Za-z0-9]{31}")
MAX_ARGON2 = {"m": 65536, "t": 10, "p": 8}
ARGON2ID_HASH = re.compile(r"\$argon2id\$v=19\$m=(?P<m>[0-9]{1,7}),t=(?P<t>[0-9]{1,3}),p=(?P<p>[0-9]{1,2})"
                           r"\$[A-Za-z0-9+/]{11,88}\$[A-Za-z0-9+/]{16,88}")
FIELDS = {"hash", "hash_scheme", "prefix", "lookup_prefix", "start", "name", "type", "tier", "scopes", "allow_ips",
          "expires_at", "credits", "refill", "created_at", "external_id"}


ALREADY_HERE = "a key with this hash or lookup prefix is already here."


class ImportTooLarge(ValueError):
    """A file past MAX_LINES lines or MAX_BYTES bytes: nothing of it is imported."""


@dataclasses.dataclass
class Outcome:
    """What became of one input line: its key's id, or the reason it was refused."""

    line: int
    key_id: int = None
    refused: str = None

    def __str__(self):
        return f"line {self.line}: " + (str(self.key_id) if self.refused is None else f"refused: {self.refused}")


def read_lines(data):
    """The (line number, text) of each non-blank line of a file's bytes; ImportTooLarge past the bounds."""
    if len(data) > MAX_BYTES:
        raise ImportTooLarge(f"An import file is at most {MAX_BYTES // (1024 * 1024)} MiB.")
    lines = data.split(b"\n")
    if len(lines) - (lines[-1] == b"") > MAX_LINES:
        raise ImportTooLarge(f"An import file is at most {MAX_LINES:,} lines.")
    try:
        text = [line.decode() for line in lines]
    except UnicodeDecodeError as error:
        raise ImportTooLarge(f"An import file is UTF-8 text: byte {error.start} of a line is not.") from None
    return [(number, line.strip()) for number, line in enumerate(text, 1) if line.strip()]


def import_keys(org_id, data, dry_run=False, actor=None):
    """Import the keys of a JSON Lines file's bytes into the organisation; return the Outcome of
    each non-blank line. With dry_run, every line is checked and nothing is written."""
    lines = read_lines(data)
    taken = TakenStarts.read()
    outcomes, log = [], ImportLog(org_id, actor)
    for start in range(0, len(lines), BATCH):
        checked = [(number, checked_line(text, taken)) for number, text in lines[start:start + BATCH]]
        try:
            outcomes += write_batch(org_id, checked, dry_run, log)
        except IntegrityError:
            # Another import took one of these hashes meanwhile: this batch again, a savepoint a line.
            outcomes += write_batch(org_id, checked, dry_run, log, line_by_line=True)
    return outcomes


def checked_line(text, taken):
    """The line's fields, or the reason it is refused (a str)."""
    try:
        fields = parsed(text)
        taken.claim(fields)
        return fields
    except ValueError as refused:
        return str(refused).rstrip(".") + "."


def write_batch(org_id, checked, dry_run, log, line_by_line=False):
    """Write the checked lines' keys in one transaction; return their Outcomes."""
    with keycache.announced_after_commit(), db.atomic() as transaction:
        organisations.lock_organisation(org_id)
        room = MAX_IMPORTED_KEYS - imported_in(org_id)
        here = hashes_here([fields["key_hash"] for _, fields in checked if isinstance(fields, dict)
                            and fields["lookup_prefix"] is None])
        outcomes = []
        for number, fields in checked:
            if isinstance(fields, str):
                outcomes.append(Outcome(number, refused=fields))
            elif room <= 0:
                outcomes.append(Outcome(number, refused=f"the organisation holds {MAX_IMPORTED_KEYS:,} imported "
                                                        "keys, the most it may."))
            elif fields["lookup_prefix"] is None and fields["key_hash"] in here:
                outcomes.append(Outcome(number, refused=ALREADY_HERE))
            else:
                outcomes.append(write_line(org_id, number, fields, dry_run, line_by_line))
                if outcomes[-1].refused is None:
                    room -= 1
                    here.add(fields.get("key_hash"))
        made = sum(outcome.refused is None for outcome in outcomes)
        if dry_run:
            transaction.rollback()
        elif made:
            log.count(made)
            keycache.announce_change()
    return outcomes


def write_line(org_id, number, fields, dry_run, in_savepoint):
    if not in_savepoint:
        key = create(org_id, fields)
        return Outcome(number, key_id="ok" if dry_run else key.id)
    try:
        with db.atomic():
            key = create(org_id, fields)
        return Outcome(number, key_id="ok" if dry_run else key.id)
    except IntegrityError:
        return Outcome(number, refused=ALREADY_HERE)


def hashes_here(key_hashes):
    """The SHA-256 hashes among key_hashes that a key already has, as its secret or as the one it
    was rolled from (still opening it in its grace period: taken, it would open the importer's key)."""
    rows = ApiKey.select(ApiKey.key_hash, ApiKey.previous_key_hash).where(
        ApiKey.key_hash.in_(key_hashes) | ApiKey.previous_key_hash.in_(key_hashes)).tuples()
    wanted = set(key_hashes)
    return {key_hash for row in rows for key_hash in row if key_hash in wanted}


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
        raise ValueError("an argon2id hash's parameters are at most m=65536 (64 MiB), t=10 and p=8")
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


class TakenStarts:
    """The lookup prefixes already held, sorted: a new one may neither equal, start nor be a start of
    one of them (a secret then matches one key at most, and costs one slow check at most)."""

    def __init__(self, prefixes):
        self.sorted = sorted(prefixes)
        self.lengths = {len(prefix) for prefix in self.sorted}
        self.held = set(self.sorted)

    @classmethod
    def read(cls):
        return cls(prefix for (prefix,) in ImportedKey.select(ImportedKey.lookup_prefix)
                   .where(ImportedKey.lookup_prefix.is_null(False)).tuples())

    def claim(self, fields):
        prefix = fields["lookup_prefix"]
        if prefix is None:
            return
        at = bisect.bisect_left(self.sorted, prefix)
        longer = at < len(self.sorted) and self.sorted[at].startswith(prefix)
        if longer or any(prefix[:length] in self.held for length in self.lengths):
            raise ValueError("lookup_prefix equals, starts or is the start of another key's lookup prefix")
        self.sorted.insert(at, prefix)
        self.lengths.add(len(prefix))
        self.held.add(prefix)


def create(org_id, fields):
    """The key's rows and its key.created event (in the caller's transaction). A slow hash already
    here needs no look-up: its secret would start with two lookup prefixes, which TakenStarts refuses."""
    key_hash = AWAITING_FIRST_USE + secrets.token_hex(16) if fields["scheme"] in SLOW_SCHEMES else fields["key_hash"]
    display = fields["start"] or fields["prefix"] or (fields["lookup_prefix"] or "")[:MAX_START_LENGTH]
    key = ApiKey.create(org=org_id, user=None, name=fields["name"], key_type=fields["key_type"],
                        rate_limit_tier=fields["tier"], display_prefix=display[:MAX_START_LENGTH], key_hash=key_hash,
                        expires_at=fields["expires_at"], created_at=fields["created_at"] or utcnow(),
                        scopes=None if len(fields["scopes"]) == len(SCOPES) else ",".join(fields["scopes"]),
                        allow_ips=fields["allow_ips"], **fields["credits"])
    ImportedKey.create(key=key, hash_scheme=fields["scheme"], prefix=fields["prefix"],
                       lookup_prefix=fields["lookup_prefix"], slow_hash=fields.get("slow_hash"),
                       external_id=fields["external_id"])
    events.key_changed.send(
        "key.created", key=key, detail=None,
        data=events.key_data(key, key_type=key.key_type, scopes=fields["scopes"], imported=True,
                             external_id=fields["external_id"],
                             expires_at=key.expires_at and iso_seconds(key.expires_at)))
    return key


def imported_in(org_id):
    return ImportedKey.select().join(ApiKey).where(ApiKey.org == org_id).count()


class ImportLog:
    """The import's one key.imported event, written with its first batch that imports a key and
    counted up, in its transaction, with each next: an interrupted import's event counts what it left."""

    def __init__(self, org_id, actor):
        self.org_id, self.actor = org_id, actor
        self.imported, self.event_id = 0, None

    def count(self, made):
        self.imported += made
        detail = f"imported {self.imported} key{'s' if self.imported != 1 else ''} by their hash"
        if self.event_id is not None:
            SecurityEvent.update(detail=detail).where(SecurityEvent.id == self.event_id).execute()
            return
        securitylog.record_in(self.org_id, "key.imported", detail, actor_id=self.actor.id if self.actor else None)
        self.event_id = (SecurityEvent.select(SecurityEvent.id)
                         .where((SecurityEvent.org == self.org_id) & (SecurityEvent.event == "key.imported"))
                         .order_by(SecurityEvent.id.desc()).scalar())


def summary(outcomes, dry_run=False):
    made = sum(outcome.refused is None for outcome in outcomes)
    verb = "would be imported" if dry_run else "imported"
    return f"{made} of {len(outcomes)} line{'s' if len(outcomes) != 1 else ''} {verb}, {len(outcomes) - made} refused."
