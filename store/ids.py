"""Integer ids that no second row is given: PostgreSQL's sequences never go back, but SQLite gives a
new row max(id) + 1, the id of a deleted newest row, unless the key is AUTOINCREMENT (sqlite_sequence
then keeps the highest id the table ever had)."""

import contextlib
import re

from peewee import SQL, AutoField, NodeList, SqliteDatabase

# The primary key as peewee's AutoField writes it on SQLite, followed by the next column or the end.
PLAIN_ID = re.compile(r'"id" INTEGER NOT NULL PRIMARY KEY(?=\s*[,)])')


class IdField(AutoField):
    """An integer primary key never given to a second row: AUTOINCREMENT on SQLite (playhouse's
    AutoIncrementField would write the keyword on PostgreSQL as well, which refuses it)."""

    def ddl(self, ctx):
        ddl = super().ddl(ctx)
        database = self.model._meta.database
        if isinstance(getattr(database, "obj", database), SqliteDatabase):  # obj: behind a DatabaseProxy
            return NodeList((ddl, SQL("AUTOINCREMENT")))
        return ddl


def make_autoincrement(database, table):
    """Make an existing SQLite table's "id" AUTOINCREMENT, keeping every row with its id, and the
    table's indexes and triggers (nothing to do when it already is). SQLite cannot change a column,
    so the table is made anew ("Making Other Kinds Of Table Schema Changes" in SQLite's ALTER TABLE
    page). The caller holds a transaction and has turned the foreign keys off before it: dropping
    the old table would otherwise delete its children's rows by their ON DELETE CASCADE."""
    (sql,) = database.execute_sql("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?",
                                  (table,)).fetchone()
    if "AUTOINCREMENT" in sql.upper():
        return
    columns, count = PLAIN_ID.subn('"id" INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT', sql[sql.index("("):])
    if count != 1:
        raise RuntimeError(f"The table {table} has no id column as this service makes it; it cannot be upgraded.")
    # Dropping the table drops its indexes and triggers: made again from their own statements.
    extras = [row[0] for row in database.execute_sql(
        "SELECT sql FROM sqlite_master WHERE tbl_name = ? AND type IN ('index', 'trigger') AND sql IS NOT NULL",
        (table,))]
    new = f"{table}__autoincrement"
    database.execute_sql(f'CREATE TABLE "{new}" {columns}')
    # Explicit ids set sqlite_sequence to the highest copied: an id freed below it is never given.
    database.execute_sql(f'INSERT INTO "{new}" SELECT * FROM "{table}"')
    database.execute_sql(f'DROP TABLE "{table}"')
    # The new table takes the old one's name (never the other way round): the other tables'
    # REFERENCES name the table, and a renamed old table would take them along.
    database.execute_sql(f'ALTER TABLE "{new}" RENAME TO "{table}"')
    for statement in extras:
        database.execute_sql(statement)


@contextlib.contextmanager
def sequence_kept(database, table):
    """SQLite: keep the table's sqlite_sequence through a change that makes the table anew (playhouse's
    migrator drops and adds NOT NULL and columns so): the new table's would start from its highest
    row, and an id deleted above it could be given again."""
    if not isinstance(database, SqliteDatabase) or not database.table_exists("sqlite_sequence"):
        yield
        return
    row = database.execute_sql("SELECT seq FROM sqlite_sequence WHERE name = ?", (table,)).fetchone()
    yield
    if row is not None and database.execute_sql(
            "UPDATE sqlite_sequence SET seq = max(seq, ?) WHERE name = ?", (row[0], table)).rowcount == 0:
        database.execute_sql("INSERT INTO sqlite_sequence (name, seq) VALUES (?, ?)", (table, row[0]))


def skip_named_ids(database, table):
    """Move the table's sqlite_sequence past every id that another table's foreign keys name: a row
    deleted with the foreign keys off leaves its children naming it, and a new row given its id
    would inherit them (a deleted account's keys, say)."""
    named = [0]
    for (other,) in database.execute_sql("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall():
        for reference in database.execute_sql(f'PRAGMA foreign_key_list("{other}")').fetchall():
            # (id, seq, table, from, to, ...): the referring column of other, the table it names.
            if reference[2] == table:
                (highest,) = database.execute_sql(f'SELECT max("{reference[3]}") FROM "{other}"').fetchone()
                named.append(highest or 0)
    highest = max(named)
    if database.execute_sql("UPDATE sqlite_sequence SET seq = max(seq, ?) WHERE name = ?",
                            (highest, table)).rowcount == 0 and highest:
        database.execute_sql("INSERT INTO sqlite_sequence (name, seq) VALUES (?, ?)", (table, highest))
