"""The rows a schema step moves, once the models' tables exist (store/schema.py's FILLS): each runs
once, in the upgrade's transaction, for a database that was below its version."""

import collections
import logging

from peewee import DateTimeField, PostgresqlDatabase
from playhouse.migrate import PostgresqlMigrator, SqliteMigrator, migrate

from store import ids, slugs

log = logging.getLogger("store.schema")  # the upgrade's lines, whichever file writes them


def copy_hours_into_days(database):
    """Version 5, once usage_days exists: every hourly count so far is also counted in its day."""
    days = collections.Counter()
    for key_id, hour, endpoint, status, requests in database.execute_sql(
            "SELECT api_key_id, hour, endpoint, status, requests FROM usage_hours"):
        day = DateTimeField().python_value(hour).date()
        days[key_id, day, endpoint, status] += requests
    for (key_id, day, endpoint, status), requests in days.items():
        database.execute_sql("INSERT INTO usage_days (api_key_id, day, endpoint, status, requests) "
                             f"VALUES ({', '.join([database.param] * 5)})", (key_id, day, endpoint, status, requests))


def move_into_personal_organisations(database):
    """Version 13, once the organisations' tables exist: every account gets its personal
    organisation (named after the username, the account its owner), which takes the account's
    keys, webhook endpoints and the log's key and webhook events; nothing else changes."""
    param = database.param
    taken = {slug for (slug,) in database.execute_sql("SELECT slug FROM organisations")}
    users = database.execute_sql(
        "SELECT id, username, created_at FROM users WHERE id NOT IN "
        "(SELECT personal_for_id FROM organisations WHERE personal_for_id IS NOT NULL) ORDER BY id").fetchall()
    for user_id, username, created_at in users:
        slug = slugs.first_free(username, taken)
        taken.add(slug)
        database.execute_sql(f"INSERT INTO organisations (name, slug, created_at, personal_for_id) "
                             f"VALUES ({param}, {param}, {param}, {param})", (username, slug, created_at, user_id))
    database.execute_sql(
        "INSERT INTO memberships (org_id, user_id, role, created_at) SELECT id, personal_for_id, 'owner', created_at "
        "FROM organisations WHERE personal_for_id IS NOT NULL AND NOT EXISTS "
        "(SELECT 1 FROM memberships m WHERE m.org_id = organisations.id)")
    personal = "(SELECT o.id FROM organisations o WHERE o.personal_for_id = {table}.user_id)"
    for table, which in (("api_keys", ""), ("webhook_endpoints", ""),
                         ("security_events",
                          " AND (substr(event, 1, 4) = 'key.' OR substr(event, 1, 8) = 'webhook.')")):
        if "user_id" in {column.name for column in database.get_columns(table)}:
            database.execute_sql(f"UPDATE {table} SET org_id = {personal.format(table=table)} "
                                 f"WHERE org_id IS NULL{which}")
    # Rows of an account deleted outside the service (the foreign keys off) belong to no one: they
    # go, with the rows that name them (the foreign keys are off here too), or a pending message of
    # theirs would keep every sender claiming in vain.
    children = {"api_keys": ("usage_hours", "usage_days", "webhook_markers"),
                "webhook_endpoints": ("webhook_messages", "webhook_attempts")}
    for table, named_by in children.items():
        orphans = f"(SELECT id FROM {table} WHERE org_id IS NULL)"
        column = "api_key_id" if table == "api_keys" else "endpoint_id"
        for child in named_by:
            if database.table_exists(child):
                database.execute_sql(f"DELETE FROM {child} WHERE {column} IN {orphans}")
        if gone := database.execute_sql(f"DELETE FROM {table} WHERE org_id IS NULL").rowcount:
            log.warning("Deleted %d rows of %s whose account no longer exists.", gone, table)
    database.execute_sql("DELETE FROM security_events "
                         "WHERE user_id IS NOT NULL AND user_id NOT IN (SELECT id FROM users)")
    postgresql = isinstance(database, PostgresqlDatabase)
    migrator = PostgresqlMigrator(database) if postgresql else SqliteMigrator(database)
    # An endpoint belongs to its organisation alone.
    if "user_id" in {column.name for column in database.get_columns("webhook_endpoints")}:
        with ids.sequence_kept(database, "webhook_endpoints"):
            # legacy: made anew, as SQLite's own DROP COLUMN refuses a column that a foreign key names.
            drop = (migrator.drop_column("webhook_endpoints", "user_id") if postgresql
                    else migrator.drop_column("webhook_endpoints", "user_id", legacy=True))
            migrate(drop)
    if postgresql:
        # SQLite cannot add a constraint to a column; there the service deletes what an organisation holds itself.
        for table, on_delete in (("api_keys", "CASCADE"), ("webhook_endpoints", "CASCADE"),
                                 ("security_events", "CASCADE"), ("sessions", "SET NULL")):
            migrate(migrator.add_foreign_key_constraint(table, "org_id", "organisations", "id", on_delete=on_delete))
        for table in ("api_keys", "webhook_endpoints"):
            migrate(migrator.add_not_null(table, "org_id"))
