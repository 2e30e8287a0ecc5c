"""Users, their web sessions, API keys and their hourly and daily usage in peewee; the connection
each request uses (opened as store/connections.py says)."""

import datetime
import functools
import logging
import math
import time

from peewee import (
    SQL,
    AutoField,
    BigIntegerField,
    CharField,
    DatabaseProxy,
    DateField,
    DateTimeField,
    ForeignKeyField,
    IntegerField,
    IntegrityError,
    InterfaceError,
    Model,
    OperationalError,
    SqliteDatabase,
    TextField,
)
from playhouse.pool import MaxConnectionsExceeded

from store import schema, slugs
from store.connections import connect_at_start, open_database
from store.ids import IdField
from store.statements import Statements

log = logging.getLogger(__name__)

# What "the database cannot be used right now" looks like: a 503 for requests, a sentence for the CLI.
DATABASE_ERRORS = (OperationalError, InterfaceError, MaxConnectionsExceeded)

db = DatabaseProxy()


def utcnow():
    """Return the current UTC time as a naive datetime, the form stored in the database."""
    return datetime.datetime.now(datetime.UTC).replace(tzinfo=None)


def utc_from_epoch(epoch):
    """Return epoch seconds as a naive UTC datetime."""
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).replace(tzinfo=None)


def epoch_of(moment):
    """Return a naive UTC datetime as epoch seconds."""
    return moment.replace(tzinfo=datetime.UTC).timestamp()


def iso_ms(moment):
    """Return a naive UTC datetime as ISO 8601 with milliseconds and Z."""
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def iso_seconds(moment):
    """Return a naive UTC datetime as ISO 8601 to the second, with Z."""
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def display_time(moment):
    """Return a naive UTC datetime in the form people read."""
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def now_strings():
    """Return the current time as (ISO 8601 with milliseconds and Z, the display form). Only the
    milliseconds are formatted per call: strftime was a tenth of the echo socket's time."""
    now = time.time()
    second = math.floor(now)
    iso_to_the_second, display = second_strings(second)
    return f"{iso_to_the_second}.{int((now - second) * 1000):03d}Z", display


def iso_second(second):
    """Return whole epoch seconds as ISO 8601 to the second, with Z, formatted once a second."""
    return second_strings(second)[0] + "Z"


@functools.lru_cache(maxsize=4)
def second_strings(second):
    moment = utc_from_epoch(second)
    return moment.strftime("%Y-%m-%dT%H:%M:%S"), display_time(moment)


SCOPES = {
    "test:read": "GET /api/v1/protected/test",
    "user:read": "GET /api/v1/user/me",
    "usage:read": "GET /api/v1/usage/stats",
    "time:stream": "WS /api/v1/ws/time",
}


class BaseModel(Model):
    # No id is given to a second row (store/ids.py), except in the tables of many rows whose ids never
    # leave the database and that no row names (usage counts, the security log, webhook attempts):
    # there a reused id could not be mistaken, and upgrades need not copy them (store/schema.py).
    id = IdField()

    class Meta:
        database = db


class User(BaseModel):
    username = CharField(unique=True, max_length=32)
    email = CharField(unique=True, max_length=254)
    password_hash = CharField()
    created_at = DateTimeField(default=utcnow)
    # When the owner followed the link mailed to the address (accounts/emailtokens.py); None: not yet.
    email_verified_at = DateTimeField(null=True)

    class Meta:
        table_name = "users"


ROLES = ("owner", "admin", "developer", "viewer")
OWNER = "owner"


class Organisation(BaseModel):
    """Who owns keys, webhook endpoints, credits, account allowances and usage: a team, or the
    personal organisation every user has (named after the username), whose members come and go
    while its keys keep working."""

    name = CharField(max_length=64)
    # slug_of(name), made unique (a personal organisation's gets -2, -3 ... when taken).
    slug = CharField(unique=True, max_length=64)
    created_at = DateTimeField(default=utcnow)
    # The user whose personal organisation this is; None for one made with /orgs or `orgs create`.
    personal_for = ForeignKeyField(User, null=True, unique=True, on_delete="SET NULL")
    # Who made it (orgs/members.py caps how many one account makes, whoever owns them since).
    created_by = ForeignKeyField(User, null=True, on_delete="SET NULL", backref="organisations_created")

    class Meta:
        table_name = "organisations"


class Membership(BaseModel):
    """A user's one role in an organisation (ROLES)."""

    org = ForeignKeyField(Organisation, backref="memberships", on_delete="CASCADE")
    user = ForeignKeyField(User, backref="memberships", on_delete="CASCADE", index=True)
    role = CharField(max_length=16)
    created_at = DateTimeField(default=utcnow)

    class Meta:
        table_name = "memberships"
        indexes = ((("org", "user"), True),)


class FormerSlug(BaseModel):
    """A slug an organisation had before a rename: it still finds the organisation until `until`,
    and no other organisation may take it meanwhile (orgs/orgadmin.py)."""

    id = AutoField()
    slug = CharField(unique=True, max_length=64)
    org = ForeignKeyField(Organisation, on_delete="CASCADE", index=True)
    until = DateTimeField()

    class Meta:
        table_name = "former_slugs"


def free_slug(name):
    """The slug of name that no organisation has yet, nor keeps from a rename (store/slugs.py)."""
    base = slugs.slug_of(name) or "org"
    taken = {slug for (slug,) in Organisation.select(Organisation.slug)
             .where(Organisation.slug.startswith(base)).tuples()}
    taken |= {slug for (slug,) in FormerSlug.select(FormerSlug.slug)
              .where(FormerSlug.slug.startswith(base) & (FormerSlug.until > utcnow())).tuples()}
    return slugs.first_free(name, taken)


def create_personal_organisation(user):
    """Make the user's personal organisation, the user its owner (in the caller's transaction)."""
    org = Organisation.create(name=user.username, slug=free_slug(user.username), personal_for=user.id,
                              created_at=user.created_at)
    Membership.create(org=org.id, user=user.id, role=OWNER, created_at=user.created_at)
    return org


def personal_organisation(user_id):
    return Organisation.get_or_none(Organisation.personal_for == user_id)


class Session(BaseModel):
    """A logged-in browser: its cookie holds the token, the database only the token's hash."""

    token_hash = CharField(primary_key=True, max_length=64)
    user = ForeignKeyField(User, backref="sessions", on_delete="CASCADE")
    created_at = DateTimeField(default=utcnow)
    last_seen_at = DateTimeField(default=utcnow, index=True)
    # A new key's secret until the next page shows it, encrypted with a key only the cookie holds.
    pending_secret = TextField(null=True)
    # The TOTP secret this session's set-up waits to confirm (accounts/twofactor.py), sealed, and when it was
    # made: no other session sees it, and it ends with the session.
    totp_setup = TextField(null=True)
    totp_setup_at = DateTimeField(null=True)
    # The organisation the session works in (/orgs/switch); None, or one the user left: the personal one.
    org = ForeignKeyField(Organisation, null=True, on_delete="SET NULL")

    class Meta:
        table_name = "sessions"


class ApiKey(BaseModel):
    org = ForeignKeyField(Organisation, backref="api_keys", on_delete="CASCADE", index=True)
    # Who created the key; None once that account is deleted (the key keeps working for its organisation).
    user = ForeignKeyField(User, backref="api_keys", null=True, on_delete="SET NULL")
    name = CharField(max_length=100)
    key_type = CharField(max_length=16)
    rate_limit_tier = CharField(default="free", max_length=32)
    display_prefix = CharField(max_length=16)
    key_hash = CharField(unique=True, max_length=64)
    created_at = DateTimeField(default=utcnow)
    last_used_at = DateTimeField(null=True)
    revoked_at = DateTimeField(null=True)
    total_requests = BigIntegerField(default=0)
    # Indexed: the expiry events look for keys about to expire, and for keys just expired, each minute.
    expires_at = DateTimeField(null=True, index=True)
    # Comma-separated; NULL grants every scope (keys made before scopes existed).
    scopes = CharField(null=True, max_length=200)
    # A rolled key's former secret, accepted until previous_expires_at.
    previous_key_hash = CharField(null=True, max_length=64, index=True)
    previous_display_prefix = CharField(null=True, max_length=16)
    previous_expires_at = DateTimeField(null=True)
    # The networks the key may be used from (allowips.parse's form); NULL: any address.
    allow_ips = TextField(null=True)
    # The key's own windows (`10/second+5000/hour`) in place of its tier's; NULL: its tier's.
    rate_limits = CharField(null=True, max_length=200)
    # Credits (metering/credits.py): NULL remaining is a key without credits. granted is what the last set, add
    # or refill gave (credits.low is 10 % of it); refilled_for the start of the last period whose refill is applied.
    credits_remaining = BigIntegerField(null=True)
    credits_granted = BigIntegerField(null=True)
    credits_refill_amount = BigIntegerField(null=True)
    credits_refill_interval = CharField(null=True, max_length=8)
    credits_refilled_for = DateTimeField(null=True)
    # A key revoked as leaked: who reported it (keys/leaks.py: "github", or "api" for POST
    # /api/v1/keys/revoke) and where GitHub found it; NULL for any other key.
    leak_report = CharField(null=True, max_length=8)
    leak_url = TextField(null=True)
    # Not a column: how ratelimit.Limiter counts this key, made once for each key it counts; a
    # kept key (keys/keycache.py) serves many requests.
    limit_plan = None
    # Not a column: whether the key has credits (find_active_key reads it).
    has_credits = False

    class Meta:
        table_name = "api_keys"

    @classmethod
    def active_in(cls, org, created_by=None):
        """Return the organisation's keys (those the user created_by made, when given) that are
        neither revoked nor expired, oldest first."""
        unexpired = cls.expires_at.is_null() | (cls.expires_at > utcnow())
        which = (cls.org == org) & cls.revoked_at.is_null() & unexpired
        if created_by is not None:
            which &= cls.user == created_by
        return cls.select().where(which).order_by(cls.id)

    def scope_list(self):
        """The key's scopes; every scope for a key made before scopes existed."""
        return self.scopes.split(",") if self.scopes else list(SCOPES)

    def opened_by_previous_secret(self):
        """True for a key found (find_active_key) by its rolled-out secret, still in its grace."""
        return self.presented_hash != self.key_hash

    def is_expired(self, now=None):
        return self.expires_at is not None and self.expires_at <= (now or utcnow())


class SecurityEvent(BaseModel):
    """One line of a security log: an account's own event (org None), or an organisation's, user
    then being who acted (None: the command line or the service itself)."""

    id = AutoField()  # a plain id: BaseModel says why
    user = ForeignKeyField(User, backref="security_events", null=True, on_delete="SET NULL")
    org = ForeignKeyField(Organisation, null=True, on_delete="CASCADE")
    created_at = DateTimeField(default=utcnow)
    event = CharField(max_length=32)
    ip = CharField(max_length=64)
    detail = CharField(max_length=200)

    class Meta:
        table_name = "security_events"
        indexes = ((("user", "created_at"), False), (("org", "created_at"), False))


class UsageHour(BaseModel):
    """A key's requests in one UTC hour to one endpoint with one HTTP status. Every count is also
    added to its UsageDay when written, so deleting old hours loses nothing the daily view shows."""

    id = AutoField()  # a plain id: BaseModel says why
    api_key = ForeignKeyField(ApiKey, backref="usage_hours", on_delete="CASCADE")
    hour = DateTimeField(index=True)
    # The route (a bounded set), never the raw path; "" for counts kept from before endpoints were.
    endpoint = CharField(max_length=64, default="")
    status = IntegerField(default=200)
    requests = IntegerField(default=0)
    # The credits those requests spent (metering/credits.py): the ledger billing reads. A default in
    # the database too: rows written without it (an older process, by hand) spent none.
    credits = IntegerField(default=0, constraints=[SQL("DEFAULT 0")])

    class Meta:
        table_name = "usage_hours"
        indexes = ((("api_key", "hour", "endpoint", "status"), True),)


class UsageDay(BaseModel):
    """A key's requests on one UTC day to one endpoint with one HTTP status."""

    id = AutoField()  # a plain id: BaseModel says why
    api_key = ForeignKeyField(ApiKey, backref="usage_days", on_delete="CASCADE")
    day = DateField(index=True)
    endpoint = CharField(max_length=64, default="")
    status = IntegerField(default=200)
    requests = IntegerField(default=0)
    credits = IntegerField(default=0, constraints=[SQL("DEFAULT 0")])

    class Meta:
        table_name = "usage_days"
        indexes = ((("api_key", "day", "endpoint", "status"), True),)


class UsageWriter(BaseModel):
    """The last transaction of usage counts each process committed: after an error that leaves it
    unknown whether a commit went through (the connection lost at COMMIT), the process reads its
    row instead of writing the counts a second time."""

    writer = CharField(primary_key=True, max_length=32)
    sequence = BigIntegerField()
    written_at = DateTimeField()

    class Meta:
        table_name = "usage_writers"


class MaintenanceLock(BaseModel):
    """Who may run a periodic job (pruning) until when: one process of all the service's workers
    and instances takes it, the others skip."""

    name = CharField(primary_key=True, max_length=32)
    until = DateTimeField()

    class Meta:
        table_name = "maintenance_locks"


def keep_newest(model, belongs, newest, key, count):
    """Delete the rows that belong, beyond the newest count."""
    kept = model.select(key).where(belongs).order_by(newest.desc(), key.desc()).limit(count)
    model.delete().where(belongs & key.not_in(kept)).execute()


def start_of_hour(moment):
    return moment.replace(minute=0, second=0, microsecond=0)


def init_app(app, more_models=()):
    """Connect the models to DATABASE_URL, bring its schema up to date (with more_models: the tables
    of the rooms that build on these models, which app.py hands in) and register connection hooks."""
    database = open_database(app.config["DATABASE_URL"])
    database.statements = Statements(database)
    db.initialize(database)
    connect_at_start(database)
    tables = [User, Organisation, FormerSlug, Membership, Session, ApiKey, UsageHour, UsageDay, UsageWriter,
              SecurityEvent, MaintenanceLock, *more_models]
    app.extensions["schema"] = schema.upgrade(database, tables, after=[add_username_index, schema.keep_key_generation])
    app.teardown_appcontext(release_request_connection)


def add_username_index(database):
    """Make usernames unique without regard to case. A database that already holds two usernames
    differing only in case keeps working: sign-up checks case-insensitively too."""
    try:
        with database.savepoint():
            database.execute_sql(
                "CREATE UNIQUE INDEX IF NOT EXISTS users_username_lower ON users (lower(username))")
    except IntegrityError:
        log.warning("Two usernames differ only in case; rename one to make usernames unique without regard "
                    "to case.")


def release_connection(database=None):
    """Return a pooled connection to its pool, even after an error; SQLite's stays open."""
    if database is None:
        database = db.obj
    if not isinstance(database, SqliteDatabase) and not database.is_closed():
        database.close()


def release_request_connection(exc):
    release_connection()
