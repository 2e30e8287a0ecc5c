"""The keyed GETs that answer from what the database held at its last commit (store/kept.py):
user/me, usage/stats and usage/history read nothing on SQLite when asked again before anything is
committed, and see every commit, of this connection or of another (a command, another worker),
from the next request."""

import threading
import time

import pytest

from metering import usage
from models import ApiKey, UsageHour, User, db, start_of_hour, utcnow
from orgs import keyactions

KEPT = ["/api/v1/user/me", "/api/v1/usage/stats", "/api/v1/usage/history"]


def elsewhere(app, change):
    """Commit change() on another connection, as another process would: a thread has its own."""
    failures = []

    def run():
        try:
            with app.app_context(), db.connection_context(), db.atomic():
                change()
        except Exception as error:
            failures.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert not failures, failures


def traced(send):
    """Every statement send() had this thread's SQLite connection run."""
    seen = []
    connection = db.connection()
    connection.set_trace_callback(seen.append)
    try:
        send()
    finally:
        connection.set_trace_callback(None)
    return seen


def statements_of(send):
    """What send() had this thread's SQLite connection run, but for the look at its commit counter."""
    return [statement for statement in traced(send) if statement != "PRAGMA data_version"]


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("path", KEPT)
def test_asked_again_before_a_commit_it_reads_nothing(app, client, user, pro_key, path):
    def send():
        assert client.get(path, headers={"X-API-Key": pro_key}).status_code == 200

    send()
    assert statements_of(send) == []
    elsewhere(app, lambda: User.update(email="alice@example.net").where(User.id == user.id).execute())
    assert statements_of(send) != []
    assert statements_of(send) == []


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("path", ["/api/v1/protected/test", *KEPT])
def test_a_keyed_get_looks_at_the_commit_counter_once(client, pro_key, path):
    """The key cache and the kept answer share the request's one look (ops/note.py's data_versions):
    SQLite takes and drops a lock (two fcntl calls) for each."""
    def send():
        assert client.get(path, headers={"X-API-Key": pro_key}).status_code == 200

    send()
    assert traced(send).count("PRAGMA data_version") == 1


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_request_through_flask_looks_at_each_read(client, pro_key):
    """Only a plain request (serving/fastlane.py) holds its look; through Flask (an Origin header
    sends it there) each read looks again, as everything outside a request does."""
    def send():
        assert client.get("/api/v1/user/me", headers={"X-API-Key": pro_key, "Origin": "https://elsewhere.example"}
                          ).status_code == 200

    send()
    assert traced(send).count("PRAGMA data_version") == 2


def test_user_me_sees_each_change_committed_elsewhere_from_the_next_request(app, client, user, pro_key):
    def me():
        return client.get("/api/v1/user/me", headers={"X-API-Key": pro_key}).get_json()

    assert (me()["username"], me()["api_key_count"]) == ("alice", 1)
    elsewhere(app, lambda: User.update(username="alicia").where(User.id == user.id).execute())
    assert me()["username"] == "alicia"
    added = []
    elsewhere(app, lambda: added.append(keyactions.issue_key(user, "second", "production")[0]))
    assert me()["api_key_count"] == 2
    elsewhere(app, lambda: keyactions.revoke_key(added[0]))
    assert me()["api_key_count"] == 1


def test_user_me_stops_counting_a_key_when_it_expires(client, user, pro_key):
    keyactions.issue_key(user, "brief", "production", expires_in=1.5)
    headers = {"X-API-Key": pro_key}
    assert client.get("/api/v1/user/me", headers=headers).get_json()["api_key_count"] == 2
    brief = ApiKey.get(ApiKey.name == "brief")
    time.sleep(max(0.0, (brief.expires_at - utcnow()).total_seconds()) + 0.05)
    # Nothing was committed since: only the clock tells.
    assert client.get("/api/v1/user/me", headers=headers).get_json()["api_key_count"] == 1


def test_usage_stats_adds_what_is_flushed_elsewhere_to_what_is_pending_here(app, client, pro_key):
    headers = {"X-API-Key": pro_key}

    def total():
        return client.get("/api/v1/usage/stats", headers=headers).get_json()["total_requests"]

    assert total() == 1
    assert total() == 2
    elsewhere(app, lambda: ApiKey.update(total_requests=ApiKey.total_requests + 10).execute())
    assert total() == 13
    app.extensions["usage"].flush()
    assert total() == 14


def test_usage_history_shows_an_hour_written_elsewhere(app, client, pro_key):
    headers = {"X-API-Key": pro_key}

    def this_hour():
        return client.get("/api/v1/usage/history", headers=headers).get_json()["hourly"][-1]["requests"]

    assert this_hour() == 0
    key_id = ApiKey.get(ApiKey.name == "Alice live").id
    elsewhere(app, lambda: UsageHour.create(api_key=key_id, hour=start_of_hour(utcnow()), endpoint="/elsewhere",
                                       status=200, requests=5))
    assert this_hour() == 5
    app.extensions["usage"].flush()
    assert this_hour() == 7


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_request_s_held_look_still_sees_its_own_process_s_flush(app, user):
    """A flush moves counts from pending into the database. A request that looked at the commit
    counter before the flush committed on another connection (a thread's, where gevent has not
    patched threading) holds that look: the total kept before must not meet the pending after."""
    key_id = keyactions.issue_key(user, "held", "production")[0].id
    counter = usage.UsageCounter(db.obj, interval=3600)
    looks = {}
    counter.written_counts.looks = lambda: looks

    def add(count):
        for _ in range(count):
            counter.add(key_id, "/api/v1/usage/stats", 200, True)

    def flush_on_its_own_connection():
        with db.connection_context():
            counter.flush()

    add(2)
    counter.flush()
    assert counter.total(key_id) == 2
    add(3)
    assert counter.total(key_id) == 5
    flusher = threading.Thread(target=flush_on_its_own_connection)
    flusher.start()
    flusher.join()
    assert not counter.pending
    assert counter.total(key_id) == 5
