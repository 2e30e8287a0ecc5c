"""How a process opens its database: on SQLite, a transaction that reads before it writes is not
refused because another process wrote in between."""

import sqlite3

from store.connections import open_database


def test_a_transaction_that_reads_then_writes_outlasts_another_process_s_write(tmp_path):
    """Found by a CI run on a slow machine: `flask webhooks test` reads (is a test event waiting?)
    then writes, and a worker's write in between made SQLite refuse the write at once ("database
    is locked"), without waiting on busy_timeout: a deferred transaction's snapshot was stale."""
    path = tmp_path / "service.db"
    database = open_database(f"sqlite:///{path}")
    database.execute_sql("CREATE TABLE events (name TEXT)")
    other_process = sqlite3.connect(path, timeout=0)
    other_wrote = True
    with database.atomic():
        database.execute_sql("SELECT count(*) FROM events")
        try:
            with other_process:
                other_process.execute("INSERT INTO events VALUES ('theirs')")
        except sqlite3.OperationalError as error:
            assert "locked" in str(error)
            other_wrote = False
        database.execute_sql("INSERT INTO events VALUES ('ours')")
    assert not other_wrote  # the transaction held the write lock from its start
    assert [name for name, in database.execute_sql("SELECT name FROM events")] == ["ours"]
    other_process.close()
    database.close()
