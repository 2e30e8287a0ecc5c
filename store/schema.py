"""Schema upgrades. Each database records its schema version in `schema_version`; on start (and
with `flask --app app db upgrade`) it is brought to the latest in place, in one transaction, one
process at a time: workers that start together wait for the one that upgrades."""

import contextlib
import logging

from peewee import SQL, BigIntegerField, CharField, DateTimeField, IntegerField, PostgresqlDatabase, TextField
from playhouse.migrate import PostgresqlMigrator, SqliteMigrator, migrate

from store import ids, schemafills

log = logging.getLogger(__name__)

SCHEMA_LOCK_ID = 0x61706B73  # any constant shared by every process of the service


def add_key_lifecycle(database, migrator):
    """Version 2: expiry, scopes and the previous secret of a rolled key."""
    have = {column.name for column in database.get_columns("api_keys")}
    columns = {
        "expires_at": DateTimeField(null=True),
        "scopes": CharField(null=True, max_length=200),
        "previous_key_hash": CharField(null=True, max_length=64),
        "previous_display_prefix": CharField(null=True, max_length=16),
        "previous_expires_at": DateTimeField(null=True),
    }
    migrate(*(migrator.add_column("api_keys", name, field) for name, field in columns.items() if name not in have))


def add_account_protection(database, migrator):
    """Version 3: two-factor log-in and passkeys, new tables only (made from the models after the steps)."""


def add_key_allow_ips(database, migrator):
    """Version 4: each key's IP allow-list (NULL: any address, as every key before)."""
    if "allow_ips" not in {column.name for column in database.get_columns("api_keys")}:
        migrate(migrator.add_column("api_keys", "allow_ips", TextField(null=True)))


def add_usage_breakdown(database, migrator):
    """Version 5: hourly counts per endpoint and HTTP status. The counts kept so far become those
    of endpoint "" (not recorded) and status 200 (they were admitted requests)."""
    have = {column.name for column in database.get_columns("usage_hours")}
    columns = {"endpoint": CharField(max_length=64, default=""), "status": IntegerField(default=200)}
    migrate(*(migrator.add_column("usage_hours", name, field) for name, field in columns.items() if name not in have))
    # The one-row-per-key-and-hour index would refuse a second endpoint in the same hour.
    database.execute_sql("DROP INDEX IF EXISTS usagehour_api_key_id_hour")


def keep_totp_setups_with_their_session(database, migrator):
    """Version 6: a TOTP set-up waiting for its code belongs to the session that started it. The
    unconfirmed secrets kept so far with the account, which any session could see, are discarded.
    (A database without these tables gets them from the models, whole.)"""
    if database.table_exists("sessions"):
        have = {column.name for column in database.get_columns("sessions")}
        columns = {"totp_setup": TextField(null=True), "totp_setup_at": DateTimeField(null=True)}
        migrate(*(migrator.add_column("sessions", name, field) for name, field in columns.items() if name not in have))
    if database.table_exists("two_factor"):
        database.execute_sql("DELETE FROM two_factor WHERE enabled_at IS NULL")


def add_usage_writers(database, migrator):
    """Version 7: each process's last committed transaction of usage counts, a new table only."""


def add_metering(database, migrator):
    """Version 8: each key's own windows and its credits (NULL: its tier's windows, no credits)."""
    have = {column.name for column in database.get_columns("api_keys")}
    columns = {
        "rate_limits": CharField(null=True, max_length=200),
        "credits_remaining": BigIntegerField(null=True),
        "credits_granted": BigIntegerField(null=True),
        "credits_refill_amount": BigIntegerField(null=True),
        "credits_refill_interval": CharField(null=True, max_length=8),
        "credits_refilled_for": DateTimeField(null=True),
    }
    migrate(*(migrator.add_column("api_keys", name, field) for name, field in columns.items() if name not in have))


def add_webhooks(database, migrator):
    """Version 9: webhook endpoints, their outbox and attempts, new tables only."""


# The tables whose ids SQLite could give again (models.py makes them with IdField); the usage
# counts, the security log and webhook attempts keep plain ids (models.py says why).
NEVER_REUSED_IDS = ["users", "api_keys", "passkeys", "recovery_codes", "webhook_endpoints", "webhook_messages",
                    "webhook_markers"]


def make_ids_never_reused(database, migrator):
    """Version 10: on SQLite, the tables of NEVER_REUSED_IDS get AUTOINCREMENT ids, each made anew
    with every row and its id (PostgreSQL's sequences never give an id again). No id up to a
    table's highest, nor one that another table's rows still name (rows left by a deletion made
    with the foreign keys off, which a new row of that id would inherit), is given again; one
    deleted above both before this version is unknown, and can be."""
    if isinstance(database, PostgresqlDatabase):
        return
    for table in NEVER_REUSED_IDS:
        if database.table_exists(table):
            ids.make_autoincrement(database, table)
            ids.skip_named_ids(database, table)


def add_key_generation(database, migrator):
    """Version 11: on SQLite, the key generation (keep_key_generation, which every upgrade runs last)."""


def add_mail(database, migrator):
    """Version 12: a verified address (existing accounts' addresses are not verified), the mail
    outbox and the tokens of mailed links (new tables)."""
    if "email_verified_at" not in {column.name for column in database.get_columns("users")}:
        migrate(migrator.add_column("users", "email_verified_at", DateTimeField(null=True)))


def add_organisations(database, migrator):
    """Version 13: organisations own keys, webhook endpoints and the security log's key and webhook
    events; a key records who created it (NULL once that account is deleted); a session its
    current organisation. The columns come here, the organisations and their rows after the
    models' tables (move_into_personal_organisations)."""
    columns = {
        "api_keys": {"org_id": IntegerField(null=True)},
        "webhook_endpoints": {"org_id": IntegerField(null=True)},
        "security_events": {"org_id": IntegerField(null=True)},
        "sessions": {"org_id": IntegerField(null=True)},
    }
    for table, wanted in columns.items():
        if database.table_exists(table):
            have = {column.name for column in database.get_columns(table)}
            migrate(*(migrator.add_column(table, name, field) for name, field in wanted.items() if name not in have))
    for table in ("api_keys", "security_events"):
        if database.table_exists(table):
            with ids.sequence_kept(database, table):
                migrate(migrator.drop_not_null(table, "user_id"))


def add_webhook_rotation(database, migrator):
    """Version 14: an endpoint's previous signing secret during a rotation's overlap; the end of a
    message's lease; the resends of messages (a new table)."""
    columns = {
        "webhook_endpoints": {"sealed_previous_secret": TextField(null=True),
                              "previous_until": DateTimeField(null=True)},
        "webhook_messages": {"claimed_until": DateTimeField(null=True)},
    }
    for table, wanted in columns.items():
        if database.table_exists(table):
            have = {column.name for column in database.get_columns(table)}
            migrate(*(migrator.add_column(table, name, field) for name, field in wanted.items() if name not in have))


def add_leak_reports(database, migrator):
    """Version 15: who reported a key revoked as leaked ("github", or "api" for POST
    /api/v1/keys/revoke) and where GitHub found it. A key revoked as leaked before takes who from
    its security log line, which names GitHub when GitHub reported it; where is not known."""
    if "leak_report" not in {column.name for column in database.get_columns("api_keys")}:
        migrate(migrator.add_column("api_keys", "leak_report", CharField(null=True, max_length=8)),
                migrator.add_column("api_keys", "leak_url", TextField(null=True)))
    if not database.table_exists("security_events"):
        return
    # A line ends with its key's id and display prefix (then GitHub's words): another key's line ends
    # with its own, whatever its key's name says.
    param = database.param
    line = f"{param} || '(id ' || api_keys.id || ', ' || api_keys.display_prefix || '...)' || {param}"
    for report, ending in (("github", " reported by GitHub"), ("api", "")):
        database.execute_sql(
            f"UPDATE api_keys SET leak_report = {param} WHERE revoked_at IS NOT NULL AND leak_report IS NULL "
            "AND EXISTS (SELECT 1 FROM security_events e WHERE e.event = 'key.revoked_as_leaked' "
            f"AND e.detail LIKE {line})", (report, "%", ending))


def add_mail_caps(database, migrator):
    """Version 16: which mails count in an address's hourly cap (the mails before count in none)."""
    if database.table_exists("mail_messages"):
        if "capped_address" not in {column.name for column in database.get_columns("mail_messages")}:
            migrate(migrator.add_column("mail_messages", "capped_address", CharField(max_length=254, null=True)))


def add_endpoint_controls(database, migrator):
    """Version 17: an endpoint's description, and who paused it when; the first KiB of each
    attempt's answer."""
    columns = {
        "webhook_endpoints": {"description": CharField(null=True, max_length=200),
                              "paused_at": DateTimeField(null=True),
                              "paused_by": CharField(null=True, max_length=40)},
        "webhook_attempts": {"answer": TextField(null=True)},
    }
    for table, wanted in columns.items():
        if database.table_exists(table):
            have = {column.name for column in database.get_columns(table)}
            migrate(*(migrator.add_column(table, name, field) for name, field in wanted.items() if name not in have))


def add_former_slugs(database, migrator):
    """Version 18: the slugs renamed organisations had, kept 30 days (a new table)."""


def add_imported_keys(database, migrator):
    """Version 19: keys another system issued, brought in by their hash (a new table)."""


def add_credits_ledger(database, migrator):
    """Version 20: the credits each hour's and day's requests spent (0 for the counts before)."""
    for table in ("usage_hours", "usage_days"):
        # A database from before version 5 gets usage_days from the model, with the column.
        if database.table_exists(table) and "credits" not in {column.name for column in database.get_columns(table)}:
            migrate(migrator.add_column(table, "credits", IntegerField(default=0, constraints=[SQL("DEFAULT 0")])))


def add_billing(database, migrator):
    """Version 21: billing customers, the usage clock and the billing outbox, new tables only."""


# The api_keys columns a usage flush writes: no request's admission reads them.
USAGE_COLUMNS = ("total_requests", "last_used_at")


def keep_key_generation(database):
    """SQLite: a counter that moves, in the same transaction, with every change to a key that its
    admission reads (every column but USAGE_COLUMNS; credits only when they go up, as a grant
    does, never with a spend that lowers them), and with every deletion of one. keys/keycache.py
    keeps keys while it stands still, where any commit at all (a usage flush) would otherwise
    make every kept key stale. Made again from the table's columns on each upgrade, so a column
    added later is watched too."""
    if isinstance(database, PostgresqlDatabase):
        return
    database.execute_sql("CREATE TABLE IF NOT EXISTS key_generation (generation INTEGER NOT NULL)")
    if database.execute_sql("SELECT 1 FROM key_generation").fetchone() is None:
        database.execute_sql("INSERT INTO key_generation (generation) VALUES (1)")
    watched = [column.name for column in database.get_columns("api_keys")
               if column.name not in (*USAGE_COLUMNS, "credits_remaining")]
    changed = " OR ".join(f'NEW."{name}" IS NOT OLD."{name}"' for name in watched)
    credits_rose = ('(NEW.credits_remaining IS NOT OLD.credits_remaining '
                    'AND NOT coalesce(NEW.credits_remaining < OLD.credits_remaining, 0))')
    bump = "BEGIN UPDATE key_generation SET generation = generation + 1; END"
    for trigger in ("api_key_changed", "api_key_deleted"):
        database.execute_sql(f"DROP TRIGGER IF EXISTS {trigger}")
    database.execute_sql(f"CREATE TRIGGER api_key_changed AFTER UPDATE ON api_keys "
                         f"WHEN {changed} OR {credits_rose} {bump}")
    database.execute_sql(f"CREATE TRIGGER api_key_deleted AFTER DELETE ON api_keys {bump}")
    # A new imported key declares a start that every worker's form check must learn (keys/imported.py).
    database.execute_sql("DROP TRIGGER IF EXISTS imported_key_added")
    if database.table_exists("imported_keys"):
        database.execute_sql(f"CREATE TRIGGER imported_key_added AFTER INSERT ON imported_keys {bump}")


# STEPS[n - 1] brings a database from version n to n + 1. Version 1 is the first release's schema.
STEPS = [add_key_lifecycle, add_account_protection, add_key_allow_ips, add_usage_breakdown,
         keep_totp_setups_with_their_session, add_usage_writers, add_metering, add_webhooks,
         make_ids_never_reused, add_key_generation, add_mail, add_organisations, add_webhook_rotation,
         add_leak_reports,
         add_mail_caps, add_endpoint_controls, add_former_slugs, add_imported_keys,
         add_credits_ledger, add_billing]
LATEST = len(STEPS) + 1
# FILLS[n] runs, once the models' tables exist, for a database that was below version n.
FILLS = {5: schemafills.copy_hours_into_days, 13: schemafills.move_into_personal_organisations}


def upgrade(database, models, after=()):
    """Bring the database to LATEST and create what is missing; return (version before, LATEST).
    A database without tables is created at LATEST; one with tables but no version is the first
    release's. `after` runs last, inside the same transaction (indexes the models do not name)."""
    if current_version(database) == LATEST:
        # Nothing to write: a read-only database (or a second worker) starts without a lock.
        return LATEST, LATEST
    with database.connection_context(), foreign_keys_off(database), lock(database):
        database.execute_sql("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
        row = database.execute_sql("SELECT version FROM schema_version").fetchone()
        if row is not None:
            before = row[0]
        else:
            before = 1 if database.table_exists("api_keys") else LATEST
            database.execute_sql("INSERT INTO schema_version (version) VALUES (%d)" % before)
        if before > LATEST:
            raise RuntimeError(f"The database is at schema version {before}, newer than this code's {LATEST}.")
        postgresql = isinstance(database, PostgresqlDatabase)
        migrator = PostgresqlMigrator(database) if postgresql else SqliteMigrator(database)
        for step in STEPS[before - 1:]:
            step(database, migrator)
        # New tables and indexes come from the models, once their columns exist.
        database.create_tables(models, safe=True)
        for version, fill in FILLS.items():
            if before < version <= LATEST:
                fill(database)
        for extra in after:
            extra(database)
        database.execute_sql("UPDATE schema_version SET version = %d" % LATEST)
    if before < LATEST:
        log.info("Upgraded the database from schema version %d to %d.", before, LATEST)
    return before, LATEST


def current_version(database):
    """The recorded schema version, or None before there is one."""
    with database.connection_context():
        if not database.table_exists("schema_version"):
            return None
        row = database.execute_sql("SELECT version FROM schema_version").fetchone()
        return row[0] if row else None


@contextlib.contextmanager
def foreign_keys_off(database):
    """SQLite: no foreign-key action or check during the upgrade, which makes tables anew (dropping
    one would delete its children's rows by ON DELETE CASCADE). SQLite ignores the pragma inside a
    transaction, so it is set around it. Every row keeps its id and the other tables name the
    table, so no foreign key breaks."""
    if isinstance(database, PostgresqlDatabase):
        yield
        return
    (enforced,) = database.execute_sql("PRAGMA foreign_keys").fetchone()
    database.execute_sql("PRAGMA foreign_keys = OFF")
    try:
        yield
    finally:
        database.execute_sql(f"PRAGMA foreign_keys = {int(enforced)}")


def lock(database):
    """A transaction that holds the schema to itself until it ends."""
    if isinstance(database, PostgresqlDatabase):
        transaction = database.atomic()

        class Locked:
            def __enter__(self):
                transaction.__enter__()
                database.execute_sql("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK_ID,))

            def __exit__(self, *exc):
                return transaction.__exit__(*exc)

        return Locked()
    # SQLite: take the write lock at BEGIN; the others wait on busy_timeout.
    return database.atomic("IMMEDIATE")
