"""The tests' own Redis (tests/support/services.py): without TEST_REDIS_URL a redis-server of each test
process's own, never the machine's, and gone with the process; with it, a database a worker. And the
app fixture's database (tests/conftest.py): the schema an app builds, holding nothing of the last test.
And the instances a test starts together: none left running when a later one fails to start."""

import json
import os
import socket
import subprocess
import sys

import liveserver
import psycopg
import pytest
import services
from liveserver import ROOT, service_env, start_instances, wait_for
from services import rows

from accounts import users
from models import db
from orgs import keyactions

# A test process's first Redis, and every address it connected to for it (Python's audit events
# see each connect, whoever makes it).
FIRST_REDIS = """
import json, sys
reached = []
sys.addaudithook(lambda event, args: reached.append(args[1]) if event == "socket.connect" else None)
import services
try:
    url, refused = services.redis_url(), None
except BaseException as error:  # pytest's skip, or its failure under CI=true
    url, refused = None, str(error)
print(json.dumps({"url": url, "refused": refused, "reached": [list(a) for a in reached]}), flush=True)
sys.stdin.read()
"""


def answers(address):
    try:
        socket.create_connection(address, timeout=2).close()
        return True
    except OSError:
        return False


def test_without_test_redis_url_a_test_process_starts_its_own_redis_which_ends_with_it():
    env = {name: value for name, value in os.environ.items() if name != "TEST_REDIS_URL"}
    env["PYTHONPATH"] = str(ROOT / "tests" / "support")
    process = subprocess.Popen([sys.executable, "-c", FIRST_REDIS], env=env, cwd=ROOT, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    try:
        report = json.loads(process.stdout.readline())
    finally:
        # Killed, as a test run can be: nothing it started may outlive it.
        process.kill()
        process.wait(timeout=60)
    if report["refused"] is not None:
        assert report["reached"] == []
        services.unavailable(report["refused"])
    own = services.redis_address(report["url"])
    assert own[1] != 6379
    # It reached no server but its own: not the machine's Redis, whose databases a developer uses.
    assert {tuple(address) for address in report["reached"]} == {own}
    wait_for(lambda: not answers(own))


def test_the_redis_of_test_redis_url_gives_each_worker_a_database_counting_down_from_its_own(monkeypatch):
    host, port = services.redis_address(services.redis_database())
    monkeypatch.setattr(services, "GIVEN_REDIS_URL", f"redis://:secret@{host}:{port}/15")
    given = []
    for worker in (0, 1, 5):
        monkeypatch.setattr(services, "WORKER", worker)
        given.append(services.redis_database())
    assert given == [f"redis://:secret@{host}:{port}/{database}" for database in (15, 14, 10)]
    monkeypatch.setattr(services, "WORKER", 16)
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "20")
    with pytest.raises(pytest.fail.Exception) as failed:
        services.redis_database()
    assert str(failed.value) == ("TEST_REDIS_URL names database 15, and each pytest-xdist worker takes one, "
                                 "counting down from it: gw16 has none. Name database 19 or higher.")


def test_a_url_through_a_proxy_keeps_its_user_password_and_database():
    assert services.via("redis://:secret@cache.internal:6380/12", 4000) == "redis://:secret@127.0.0.1:4000/12"
    assert services.via("postgresql://app:pw@db:5433/apitest_1", 4001) == "postgresql://app:pw@127.0.0.1:4001/apitest_1"
    assert services.via("redis://127.0.0.1:6379/3", 4002) == "redis://127.0.0.1:4002/3"


def schema_of(database_url):
    """What a database's tables, columns, indexes and constraints are, and the rows of the schema's version."""
    if database_url.startswith("sqlite"):
        return rows(database_url, "SELECT type, name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' "
                                  "ORDER BY name"), rows(database_url, "SELECT * FROM schema_version")
    import services

    return rows(database_url, services.SCHEMA_FINGERPRINT), rows(database_url, "SELECT * FROM schema_version")


def test_the_app_fixture_s_database_is_the_one_an_app_builds_and_holds_nothing_of_the_last_test(app, database_url,
                                                                                                 tmp_path):
    """tests/conftest.py builds the app fixture's schema once and copies or empties it for each test."""
    import services
    from appconfig import build_schema

    prepared = schema_of(database_url)
    user = users.create_user("alice", "alice@example.com", "correct horse battery")
    keyactions.issue_key(user, "key", "development")
    if database_url.startswith("sqlite"):
        fresh = f"sqlite:///{tmp_path}/fresh.db"
        build_schema(fresh)
        assert schema_of(fresh) == prepared
        return
    db.close()
    emptied = services.postgres_url_as_built(build_schema)
    assert schema_of(emptied) == prepared
    assert rows(emptied, "SELECT count(*) FROM users") == [(0,)]
    assert rows(emptied, "SELECT nextval('users_id_seq')") == [(1,)]
    with psycopg.connect(emptied, autocommit=True) as connection:
        connection.execute("UPDATE schema_version SET version = 1")
    assert schema_of(services.postgres_url_as_built(build_schema)) == prepared
    with psycopg.connect(emptied, autocommit=True) as connection:
        connection.execute("DROP TABLE schema_version")
    assert schema_of(services.postgres_url_as_built(build_schema)) == prepared
    build_schema(services.postgres_url())
    assert schema_of(emptied) == prepared


def test_instances_started_before_one_that_fails_are_stopped(tmp_path, monkeypatch):
    started = []
    start_procfile = liveserver.start_procfile

    def second_fails(tmp_path, env):
        if started:
            raise AssertionError("server did not start")
        started.append(start_procfile(tmp_path, env))
        return started[-1]

    monkeypatch.setattr(liveserver, "start_procfile", second_fails)
    with pytest.raises(AssertionError, match="server did not start"):
        start_instances(tmp_path, service_env(tmp_path))
    assert started[0].process.poll() is not None
