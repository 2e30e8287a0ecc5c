"""Keys another system issued, imported into an organisation by their hash from a JSON Lines file
(`keys import`, the Organisation tab's Import keys form): each line checked alone, written in
transactions of BATCH lines, so that an interruption leaves whole lines imported or not and a
second run refuses those already here. The secrets never pass through: only their hashes."""

import bisect
import dataclasses
import secrets

from peewee import IntegrityError, PostgresqlDatabase

from accounts import securitylog
from keys import events, keycache
from keys.models import AWAITING_FIRST_USE, SLOW_SCHEMES, ImportedKey
from models import SCOPES, ApiKey, SecurityEvent, db, iso_seconds, utcnow
from orgs import organisations
from orgs.importlines import MAX_START_LENGTH, parsed

MAX_LINES = 10_000
MAX_BYTES = 5 * 1024 * 1024
BATCH = 500
# Imported keys an organisation may hold (active or not): what one member's imports can make it store.
MAX_IMPORTED_KEYS = 100_000
LOOKUP_PREFIX_LOCK_ID = 0x6B657969  # any constant shared by every process of the service
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
    taken = TakenStarts()
    outcomes, log = [], ImportLog(org_id, actor)
    for start in range(0, len(lines), BATCH):
        checked = [(number, checked_line(text)) for number, text in lines[start:start + BATCH]]
        try:
            outcomes += write_batch(org_id, checked, dry_run, log, taken)
        except IntegrityError:
            # Another import took one of these hashes meanwhile: this batch again, a savepoint a line,
            # against the lookup prefixes as they are now (this batch's claims went with its rollback).
            taken = TakenStarts(kept=taken.claimed_in_dry_runs if dry_run else ())
            outcomes += write_batch(org_id, checked, dry_run, log, taken, line_by_line=True)
    return outcomes


def checked_line(text):
    """The line's fields, or the reason it is refused (a str)."""
    try:
        return parsed(text)
    except ValueError as refused:
        return reason(refused)


def reason(refused):
    return str(refused).rstrip(".") + "."


def write_batch(org_id, checked, dry_run, log, taken, line_by_line=False):
    """Write the checked lines' keys in one transaction; return their Outcomes."""
    with keycache.announced_after_commit(), db.atomic() as transaction:
        organisations.lock_organisation(org_id)
        # One import at a time claims lookup prefixes, against every one held when it does.
        lock_lookup_prefixes()
        taken.read_new()
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
            elif (refused := taken.refusal(fields, dry_run)) is not None:
                outcomes.append(Outcome(number, refused=refused))
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


class TakenStarts:
    """The lookup prefixes held, sorted, read under lock_lookup_prefixes (those imported since the
    last read, by key id): a new one may neither equal, start nor be a start of one of them (a
    secret then matches one key at most, and costs one slow check at most)."""

    def __init__(self, kept=()):
        self.sorted, self.lengths, self.held = [], set(), set()
        self.read_past = 0
        # A dry run's accepted prefixes, held in memory only: the file's later lines are checked against them.
        self.claimed_in_dry_runs = []
        for prefix in kept:
            self.hold(prefix)

    def read_new(self):
        rows = (ImportedKey.select(ImportedKey.key, ImportedKey.lookup_prefix)
                .where(ImportedKey.key > self.read_past).order_by(ImportedKey.key).tuples())
        for key_id, prefix in rows:
            self.read_past = key_id
            if prefix is not None:
                self.hold(prefix)

    def hold(self, prefix):
        if prefix not in self.held:
            bisect.insort(self.sorted, prefix)
            self.lengths.add(len(prefix))
            self.held.add(prefix)

    def refusal(self, fields, dry_run):
        """Why the line's lookup prefix cannot be held, or None once it is (as this line's)."""
        prefix = fields["lookup_prefix"]
        if prefix is None:
            return None
        at = bisect.bisect_left(self.sorted, prefix)
        longer = at < len(self.sorted) and self.sorted[at].startswith(prefix)
        if longer or any(prefix[:length] in self.held for length in self.lengths):
            return "lookup_prefix equals, starts or is the start of another key's lookup prefix."
        self.hold(prefix)
        if dry_run:
            self.claimed_in_dry_runs.append(prefix)
        return None


def lock_lookup_prefixes():
    """Hold the right to claim lookup prefixes until the transaction ends: SQLite's write lock, which
    lock_organisation took, already does; PostgreSQL takes an advisory lock."""
    if isinstance(db.obj, PostgresqlDatabase):
        db.execute_sql("SELECT pg_advisory_xact_lock(%s)", (LOOKUP_PREFIX_LOCK_ID,))


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
