"""The SQL of the hot path (credits included) and of the usage flush, written once per database."""

from peewee import SqliteDatabase


class Statements:
    """The SQL of the hot path, written once per database because building a peewee query costs
    far more than running it."""

    def __init__(self, database):
        p = database.param
        # One indexed lookup finds a key by its secret or by its rolled-out previous one (SQLite
        # and PostgreSQL each use both indexes); expiry and grace are checked on the row.
        self.find_active_key = (
            "SELECT id, org_id, user_id, name, key_type, rate_limit_tier, display_prefix, expires_at, scopes, "
            "key_hash, previous_expires_at, allow_ips, rate_limits, credits_remaining, "
            "credits_refill_amount, credits_refill_interval, credits_refilled_for FROM api_keys "
            f"WHERE (key_hash = {p} OR previous_key_hash = {p}) "
            "AND revoked_at IS NULL"
        )
        self.secret_is_active = (
            f"SELECT 1 FROM api_keys WHERE (key_hash = {p} OR (previous_key_hash = {p} AND previous_expires_at > {p})) "
            f"AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > {p})"
        )
        # One credit spent (metering/credits.py), a refill that is due applied first: the current
        # month's and day's starts are the parameters of each `due`, then the key's id.
        due = ("credits_refill_amount IS NOT NULL AND (credits_refilled_for IS NULL OR credits_refilled_for < "
               f"CASE credits_refill_interval WHEN 'month' THEN {p} ELSE {p} END)")
        self.spend_credit = (
            f"UPDATE api_keys SET credits_remaining = CASE WHEN {due} THEN credits_refill_amount "
            "ELSE credits_remaining END - 1, "
            f"credits_granted = CASE WHEN {due} THEN credits_refill_amount ELSE credits_granted END, "
            f"credits_refilled_for = CASE WHEN {due} THEN CASE credits_refill_interval WHEN 'month' THEN {p} "
            f"ELSE {p} END ELSE credits_refilled_for END "
            f"WHERE id = {p} AND CASE WHEN {due} THEN credits_refill_amount ELSE credits_remaining END > 0 "
            "RETURNING credits_remaining, credits_granted, credits_refilled_for")
        self.credits_of = ("SELECT credits_remaining, credits_refill_amount, credits_refill_interval, "
                           f"credits_refilled_for FROM api_keys WHERE id = {p} AND credits_remaining IS NOT NULL")
        self.total_requests = f"SELECT total_requests FROM api_keys WHERE id = {p}"
        self.credits_spent_on = f"SELECT sum(credits) FROM usage_days WHERE api_key_id = {p} AND day = {p}"
        self.add_usage = (
            f"UPDATE api_keys SET total_requests = total_requests + {p}, last_used_at = {p} "
            f"WHERE id = {p}"
        )
        self.mark_usage_written = (
            f"INSERT INTO usage_writers (writer, sequence, written_at) VALUES ({p}, {p}, {p}) "
            "ON CONFLICT (writer) DO UPDATE SET sequence = excluded.sequence, written_at = excluded.written_at")
        self.usage_written = f"SELECT sequence FROM usage_writers WHERE writer = {p}"
        # SQLite locks the whole database for a write; PostgreSQL locks rows, in the order asked.
        self.lock_keys = None if isinstance(database, SqliteDatabase) else (
            f"SELECT id FROM api_keys WHERE id = ANY({p}) ORDER BY id FOR NO KEY UPDATE")
        # Qualified, because PostgreSQL finds a bare `requests` ambiguous next to `excluded`. A key
        # deleted with its account since it was counted is skipped, not a failed flush; the WHERE
        # also tells SQLite that ON CONFLICT is not part of the SELECT.
        for table, period in (("usage_hours", "hour"), ("usage_days", "day")):
            setattr(self, f"add_{table}", (
                f"INSERT INTO {table} (api_key_id, {period}, endpoint, status, requests, credits) "
                f"SELECT {p}, {p}, {p}, {p}, {p}, {p} WHERE EXISTS (SELECT 1 FROM api_keys WHERE id = {p}) "
                f"ON CONFLICT (api_key_id, {period}, endpoint, status) DO UPDATE "
                f"SET requests = {table}.requests + excluded.requests, credits = {table}.credits + excluded.credits"))
