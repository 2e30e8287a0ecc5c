"""Answers kept while nothing is committed (store/kept.py): the mark moves with a commit of this
connection or of another process, an answer may end at a time of its own, the entries are bounded,
and a database without such a mark keeps nothing."""

import contextlib
import sqlite3
import time

from peewee import DatabaseProxy

from store.connections import open_database
from store.kept import KeptAnswers, commit_mark, sqlite_mark


@contextlib.contextmanager
def sqlite_database(tmp_path):
    database = open_database(f"sqlite:///{tmp_path / 'kept.db'}")
    database.execute_sql("CREATE TABLE numbers (n INTEGER)")
    try:
        yield database
    finally:
        database.close()


def counting(answer, until=None):
    """read() for KeptAnswers.get that gives the answer and counts its calls in .reads."""
    def read():
        read.reads += 1
        return answer, until

    read.reads = 0
    return read


def test_an_answer_is_read_again_after_a_commit_of_this_connection_or_another(tmp_path):
    with sqlite_database(tmp_path) as database:
        kept, read = KeptAnswers(database, 10), counting("answer")
        assert [kept.get("question", read) for _ in range(3)] == ["answer"] * 3 and read.reads == 1
        database.execute_sql("INSERT INTO numbers VALUES (1)")
        kept.get("question", read)
        assert read.reads == 2
        with contextlib.closing(sqlite3.connect(tmp_path / "kept.db")) as other_process, other_process:
            other_process.execute("INSERT INTO numbers VALUES (2)")
        kept.get("question", read)
        kept.get("question", read)
        assert read.reads == 3


def test_a_mark_tells_commits_apart_and_reads_through_a_proxy(tmp_path):
    with sqlite_database(tmp_path) as database:
        proxy = DatabaseProxy()
        proxy.initialize(database)
        before = commit_mark(proxy)
        assert commit_mark(database) == before
        database.execute_sql("UPDATE numbers SET n = 1")  # no row: nothing changed
        assert commit_mark(database) == before
        database.execute_sql("INSERT INTO numbers VALUES (1)")
        assert commit_mark(database) != before


def test_an_answer_that_ends_at_a_time_is_read_again_from_then(tmp_path):
    with sqlite_database(tmp_path) as database:
        kept, read = KeptAnswers(database, 10), counting("answer", until=time.time() + 0.2)
        kept.get("question", read)
        kept.get("question", read)
        assert read.reads == 1
        time.sleep(0.25)
        kept.get("question", read)
        assert read.reads == 2


def test_no_more_than_size_answers_are_kept(tmp_path):
    with sqlite_database(tmp_path) as database:
        kept = KeptAnswers(database, 2)
        reads = {question: counting(question) for question in "abc"}
        for question in "abcabc":
            assert kept.get(question, reads[question]) == question
        assert len(kept.entries) == 2
        assert [reads[question].reads for question in "abc"] == [1, 1, 2]


def test_a_database_without_a_mark_keeps_nothing():
    class OtherDatabase:
        """Not SQLite: PostgreSQL, say, where another process's commit cannot be seen cheaply."""

    kept, read = KeptAnswers(OtherDatabase(), 10), counting("answer")
    assert commit_mark(OtherDatabase()) is None
    assert [kept.get("question", read) for _ in range(3)] == ["answer"] * 3 and read.reads == 3


def test_nothing_is_kept_from_inside_a_transaction_that_may_yet_roll_back(tmp_path):
    """Attacker's review: a greenlet's transaction on the connection every greenlet shares, rolled
    back after another read inside it, moves neither counter; what was read must not outlive it."""
    with sqlite_database(tmp_path) as database:
        kept = KeptAnswers(database, 10)

        def count():
            return database.execute_sql("SELECT count(*) FROM numbers").fetchone()[0], None

        with database.atomic() as transaction:
            database.execute_sql("INSERT INTO numbers VALUES (1)")
            assert kept.get("how many", count) == 1
            transaction.rollback()
        assert kept.get("how many", count) == 0


def test_a_request_s_one_look_still_sees_its_own_writes(tmp_path):
    """A request that holds its look at data_version (looks) reads it once; its own commits move
    the mark through total_changes, and another connection's show from the next request's look."""
    with sqlite_database(tmp_path) as database:
        connection, looks = database.connection(), {}
        traced = []
        connection.set_trace_callback(traced.append)
        before = sqlite_mark(connection, looks)
        assert sqlite_mark(connection, looks) == before
        database.execute_sql("INSERT INTO numbers VALUES (1)")
        assert sqlite_mark(connection, looks) != before
        assert traced.count("PRAGMA data_version") == 1
        with contextlib.closing(sqlite3.connect(tmp_path / "kept.db")) as other_process, other_process:
            other_process.execute("INSERT INTO numbers VALUES (2)")
        held = sqlite_mark(connection, looks)
        assert sqlite_mark(connection, {}) != held
        assert sqlite_mark(connection) != held
