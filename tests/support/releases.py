"""Databases made by an earlier release's own code: the fourth release's (schema version 12, made by
tests/fixtures/make_release4.py), with the secrets it gave and what its command line printed."""

import contextlib
import json
import sqlite3
from pathlib import Path

import psycopg

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
RELEASE4 = json.loads((FIXTURES / "release4.json").read_text())
# Each secret of release4.json's and the status its /api/v1/protected/test answers with, there and here.
RELEASE4_ANSWERS = {"alice live": 200, "alice refill": 200, "bob expiring": 200, "bob expired": 401,
                    "carol rolled": 200, "carol previous": 200, "dave live": 200, "dave revoked": 401,
                    "erin gone": 401}


def load_release4(database_url, tmp_path):
    """Fill the empty database at database_url with the fourth release's; return (its URL, what
    release4.json says of it)."""
    if database_url.startswith("sqlite"):
        # As `sqlite3 .dump` wrote it (a .db file is local state).
        path = tmp_path / "release4.db"
        with contextlib.closing(sqlite3.connect(path)) as connection:
            connection.executescript((FIXTURES / "release4.sqlite.sql").read_text())
        return f"sqlite:///{path}", RELEASE4["sqlite"]
    with psycopg.connect(database_url, autocommit=True) as connection:
        connection.execute((FIXTURES / "release4.sql").read_text())
        connection.execute("SET search_path TO public")
    return database_url, RELEASE4["postgresql"]
