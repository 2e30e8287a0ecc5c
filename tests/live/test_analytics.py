"""Usage analytics and the data life cycle on the real server (the Procfile's gunicorn), on SQLite
and PostgreSQL: 200, 403 and 429 answers on several endpoints (and a time socket) appear in
usage/history and `usage report` after one flush; `db prune` and the background prune delete a
revoked key with its rows and keep its security-log events; total_requests stays exact."""

import datetime
import json
import re
import sqlite3

import psycopg
import pytest
import requests
import websocket
from clock import clear_of_the_hour
from liveserver import cli, cli_session, serving, stored_total, wait_for
from serverfixtures import env_on_each_database

PROTECTED = "/api/v1/protected/test"
ME = "/api/v1/user/me"
STATS = "/api/v1/usage/stats"
HISTORY = "/api/v1/usage/history"
TIME = "/api/v1/ws/time"


env = env_on_each_database


@pytest.fixture(scope="module")
def server_settings():
    return {"REVOKED_KEY_RETENTION_DAYS": "0"}


@pytest.fixture(scope="module")
def commands(env):
    """The command line on env's database, in one process, for the keys the tests make and revoke
    (what the tests are about, `usage report`, `db prune` and `audit`, runs as `flask` itself)."""
    with cli_session(env) as session:
        session("users", "create", "erin", "--email", "erin@example.com", "--password-stdin",
                stdin="a long password\n")
        yield session


def create(commands, name, *options, owner="erin"):
    """Create a key for the owner (erin); return (its secret, its id)."""
    output = commands("keys", "create", owner, "--name", name, "--type", "production", *options)
    return output.strip().splitlines()[-1], int(re.search(r"\(id (\d+)\)", output)[1])


def sql(env, statement, *params):
    """Rows of a statement on the server's database (written with %s)."""
    url = env["DATABASE_URL"]
    if url.startswith("sqlite"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as connection:
            return connection.execute(statement.replace("%s", "?"), params).fetchall()
    with psycopg.connect(url) as connection:
        cursor = connection.execute(statement, params)
        return cursor.fetchall() if cursor.description else []


def recorded(env, kid):
    return sql(env, "SELECT coalesce(sum(requests), 0) FROM usage_hours WHERE api_key_id = %s", kid)[0][0]


def get(server, path, secret):
    return requests.get(server.base + path, headers={"X-API-Key": secret}, timeout=10).status_code


def test_outcomes_on_several_endpoints_appear_after_one_flush(env, commands, tmp_path_factory):
    # Its requests, the hour and day it reads them under and its reports all within one hour: a run
    # that crossed 22:00 found them under 21:00 and read the clock at 22:00. 90 s, well past what
    # the test takes, and with the sleep well within pytest.ini's timeout of 180 s.
    clear_of_the_hour(90)
    # An account of its own: its report below sums every key of it, and the module's other tests
    # use erin's keys today too.
    commands("users", "create", "olga", "--email", "olga@example.com", "--password-stdin", stdin="a long password\n")
    tiny, tiny_id = create(commands, "tiny key", "--tier", "tiny", owner="olga")  # 2 a minute
    narrow, narrow_id = create(commands, "narrow key", "--scopes", "test:read,usage:read,time:stream", owner="olga")
    with serving(tmp_path_factory.mktemp("analytics-log"), env) as server:
        assert [get(server, path, tiny) for path in (PROTECTED, ME, PROTECTED, STATS)] == [200, 200, 429, 429]
        assert [get(server, path, narrow) for path in (ME, PROTECTED, ME)] == [403, 200, 403]
        websocket.create_connection(server.base.replace("http", "ws") + f"{TIME}?api_key={narrow}",
                                    timeout=10).close()
        assert get(server, "/api/v1/status", narrow) == 200  # public: not a keyed request
        # Each worker writes its counts within a second (on an idle machine).
        for kid in (tiny_id, narrow_id):
            wait_for(lambda: recorded(env, kid) == 4)
        response = requests.get(server.base + HISTORY, headers={"X-API-Key": narrow}, timeout=10)
    assert response.status_code == 200
    body = response.json()
    now = datetime.datetime.now(datetime.UTC)
    last, day = body["hourly"][-1], body["daily"][-1]
    expected = {"requests": 4, "by_status": {"101": 1, "200": 1, "403": 2},
                "by_endpoint": {ME: 2, PROTECTED: 1, TIME: 1}}
    assert {name: last[name] for name in expected} == expected
    assert {name: day[name] for name in expected} == expected
    assert last["hour"] == now.strftime("%Y-%m-%dT%H:00:00Z") and day["day"] == now.date().isoformat()
    assert [hour["requests"] for hour in body["hourly"][:-1]] == [0] * 23
    assert [day["requests"] for day in body["daily"][:-1]] == [0] * 29
    # total_requests: the requests that passed scope and limit (not the 429s and 403s; the history
    # request is one).
    assert stored_total(env["DATABASE_URL"], tiny) == 2 and stored_total(env["DATABASE_URL"], narrow) == 3
    report = json.loads(cli(env, "usage", "report", "olga", "--key", str(tiny_id), "--days", "1",
                            "--format", "json"))
    assert report == [{"day": now.date().isoformat(), "requests": 4, "by_status": {"200": 2, "429": 2},
                       "by_endpoint": {ME: 1, PROTECTED: 2, STATS: 1}}]
    table = cli(env, "usage", "report", "olga", "--days", "1", "--format", "csv").splitlines()
    # The account: both keys, with the history request itself counted by the flush at shutdown.
    assert table[1:] == [f"{now.date().isoformat()},9,0,5,2,2,0"]


def test_db_prune_deletes_a_revoked_key_with_its_rows_and_keeps_its_events(env, commands):
    secret, doomed_id = create(commands, "doomed key")
    kept, kept_id = create(commands, "kept key")
    old = datetime.datetime.now(datetime.UTC).replace(tzinfo=None) - datetime.timedelta(days=500)
    for kid in (doomed_id, kept_id):
        sql(env, "INSERT INTO usage_hours (api_key_id, hour, endpoint, status, requests) VALUES (%s, %s, %s, 200, 3)",
            kid, old, PROTECTED)
        sql(env, "INSERT INTO usage_days (api_key_id, day, endpoint, status, requests) VALUES (%s, %s, %s, 200, 3)",
            kid, old.date(), PROTECTED)
    sql(env, "UPDATE api_keys SET total_requests = 3 WHERE id = %s", kept_id)
    commands("keys", "revoke", str(doomed_id))
    output = cli(env, "db", "prune")
    # The kept key's old hour and day, and the doomed key with its hour and day.
    assert output == "Deleted 2 hourly usage rows, 2 daily usage rows, 1 revoked or expired keys and 0 expired " \
                     "sessions.\n"
    assert sql(env, "SELECT count(*) FROM api_keys WHERE id = %s", doomed_id) == [(0,)]
    assert sql(env, "SELECT count(*) FROM usage_hours WHERE api_key_id IN (%s, %s)", doomed_id, kept_id) == [(0,)]
    assert stored_total(env["DATABASE_URL"], kept) == 3
    events = [line.split("\t")[1] for line in cli(env, "audit", "erin").splitlines()
              if f"doomed key (id {doomed_id}, {secret[:12]}..." in line]
    assert events == ["key.revoked", "key.created"]
    assert cli(env, "db", "prune").startswith("Deleted 0 hourly usage rows, 0 daily usage rows, 0 revoked")


def test_the_server_prunes_by_itself(env, commands, tmp_path_factory):
    _, doomed_id = create(commands, "revoked in the background")
    commands("keys", "revoke", str(doomed_id))
    # Another instance pruned a while ago; its lock has run out.
    sql(env, "UPDATE maintenance_locks SET until = %s", datetime.datetime(2000, 1, 1))
    with serving(tmp_path_factory.mktemp("analytics-prune-log"), env) as server:
        live, _ = create(commands, "live key")
        assert get(server, PROTECTED, live) == 200  # the worker's pruner started with its services
        wait_for(lambda: sql(env, "SELECT count(*) FROM api_keys WHERE id = %s", doomed_id) == [(0,)])
        assert get(server, PROTECTED, live) == 200
