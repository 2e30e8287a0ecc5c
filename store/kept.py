"""Answers read from the database, kept in a process while nothing has been committed to it since:
a keyed GET that asks the same question as the request before it answers without a database read.

SQLite tells cheaply whether anything was committed since a connection last looked: its
`PRAGMA data_version` moves with another connection's commit, its `total_changes` with its own
writes (not its own schema changes, which the service makes only as it starts, before anything is
kept). Nothing as cheap tells that of PostgreSQL, where another process may have committed: there
nothing is kept and every answer is read."""

import time

from peewee import DatabaseProxy, SqliteDatabase


def sqlite_mark(connection, looks=None):
    """(connection, its data_version, its total_changes). looks: {connection: data_version} of a
    request that reads the data_version once (ops/note.py's data_versions), or None to read it
    now. Its total_changes is read now either way, so that its own writes move the mark."""
    if looks is None:
        return connection, connection.execute("PRAGMA data_version").fetchone()[0], connection.total_changes
    data_version = looks.get(connection)
    if data_version is None:
        data_version = looks[connection] = connection.execute("PRAGMA data_version").fetchone()[0]
    return connection, data_version, connection.total_changes


def commit_mark(database, looks=None):
    """What equals an earlier mark only when nothing was committed to the database in between, by
    any connection: (this thread's connection, its data_version, its total_changes) for SQLite;
    None for another database, whose marks tell nothing."""
    if isinstance(database, DatabaseProxy):
        database = database.obj
    if not isinstance(database, SqliteDatabase):
        return None
    # The connection itself belongs in the mark: data_version counts per connection (threads,
    # outside gevent, each have their own).
    return sqlite_mark(database.connection(), looks)


class KeptAnswers:
    """At most `size` answers, each kept under the commit mark it was read after, and used while
    the mark is unchanged and the clock is before the time its read gave (when an answer depends on
    the time too: a key expiring). Entries of an older mark are dropped as a new one is seen."""

    def __init__(self, database, size, looks=lambda: None):
        self.database = database
        self.size = size
        # The request's data_versions (sqlite_mark's looks), read by each get.
        self.looks = looks
        self.mark = None
        self.entries = {}

    def forget(self):
        """Drop every answer: for a change the marks cannot tell, such as a commit of this process
        on another connection while a request holds its look (sqlite_mark's looks)."""
        self.entries = {}

    def get(self, question, read):
        """The answer to a question: kept, or read(), which returns (the answer, the time.time()
        from which it may no longer hold, or None: only a commit changes it)."""
        mark = commit_mark(self.database, self.looks())
        # Inside a transaction (a greenlet's, on the connection every greenlet shares), what is read
        # may yet be rolled back, which moves neither counter.
        if mark is None or mark[0].in_transaction:
            return read()[0]
        if mark != self.mark:
            # Each entry carries its mark as well: threads outside gevent see different marks.
            self.entries = {}
            self.mark = mark
        entry = self.entries.get(question)
        if entry is not None and entry[0] == mark and (entry[2] is None or time.time() < entry[2]):
            return entry[1]
        # The mark was taken before the read: after a commit in between, the next look reads again.
        answer, until = read()
        if question in self.entries or len(self.entries) < self.size:
            self.entries[question] = (mark, answer, until)
        return answer
