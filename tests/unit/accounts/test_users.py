"""Accounts with Flask's test client and in-process: idle sessions, the pending secret at rest,
password hashing off the event loop and at its configured cost, the key-creation throttle, file
modes and settings."""

import datetime
import hashlib
import logging
import os
import stat
import sys
import threading

import gevent
import pytest
from limits import RateLimitItemPerHour
from peewee import SqliteDatabase
from twofactorsteps import code_at, enable, is_logged_in
from webforms import SECRET_PATTERN, create_key, page
from werkzeug.security import generate_password_hash

import app as service
import auth
from accounts import sessions, throttles, users
from models import ApiKey, Session, User, db
from ops import logs
from orgs import keyactions, organisations
from store.connections import protect_sqlite_files

# The highest niceness, the lowest priority, on Linux and the BSDs.
LOWEST_PRIORITY = 19


def test_the_common_password_list_is_well_stocked():
    common = users.common_passwords()
    assert len(common) >= 10_000
    assert {"123456", "password", "qwerty", "iloveyou"} <= common


def test_an_idle_session_expires_and_is_pruned_at_the_next_login(logged_in, user):
    assert logged_in.get("/settings/profile").status_code == 200
    stale = utcnow_minus(days=sessions.SESSION_IDLE_DAYS, seconds=1)
    Session.update(last_seen_at=stale).execute()
    assert logged_in.get("/settings/profile").status_code == 302
    logged_in.post("/login", data={"username": "alice", "password": "correct horse battery"})
    assert Session.select().where(Session.last_seen_at == stale).count() == 0
    assert Session.select().count() == 1


def test_an_active_session_is_kept_alive(logged_in):
    almost_idle = utcnow_minus(days=sessions.SESSION_IDLE_DAYS - 1)
    Session.update(last_seen_at=almost_idle).execute()
    assert logged_in.get("/settings/profile").status_code == 200
    assert Session.get().last_seen_at > utcnow_minus(minutes=1)


def utcnow_minus(**delta):
    return datetime.datetime.now(datetime.UTC).replace(tzinfo=None) - datetime.timedelta(**delta)


def test_the_pending_secret_is_encrypted_at_rest_and_gone_once_shown(logged_in):
    response = logged_in.post("/settings/security/keys", data={"name": "Web key", "type": "production"})
    assert response.status_code == 302
    sealed = Session.get().pending_secret
    assert sealed is not None and "sk_live_" not in sealed
    secret = SECRET_PATTERN.search(page(logged_in.get("/settings/security")))[1]
    assert secret[8:] not in sealed
    assert Session.get().pending_secret is None
    assert auth.authenticate(secret).name == "Web key"


def test_key_creation_in_the_web_application_is_throttled_per_account(logged_in, runner, monkeypatch):
    monkeypatch.setattr(throttles, "KEY_CREATIONS_PER_ACCOUNT", RateLimitItemPerHour(2))
    create_key(logged_in, "one")
    create_key(logged_in, "two")
    response = logged_in.post("/settings/security/keys", data={"name": "three", "type": "production"})
    assert response.status_code == 429
    assert "Too many keys created in the last hour; try again in 60 minutes." in page(response)
    result = runner.invoke(args=["keys", "create", "alice", "--name", "cli", "--type", "development"])
    assert result.exit_code == 0, result.output


def test_the_key_cap_follows_max_keys_per_user(app, user):
    app.config["MAX_KEYS_PER_USER"] = 2
    first, _ = keyactions.issue_key(user, "one", "development")
    keyactions.issue_key(user, "two", "development")
    with pytest.raises(keyactions.KeyCapReached, match="An organisation may hold 2 active keys"):
        keyactions.issue_key(user, "three", "development")
    keyactions.revoke_key(first)
    keyactions.issue_key(user, "three", "development")


@pytest.mark.parametrize("value", ["0", "-1", "many", "2.5"])
def test_max_keys_per_user_must_be_a_positive_whole_number(value):
    with pytest.raises(ValueError, match="MAX_KEYS_PER_USER must be a whole number of at least 1"):
        service.load_config({"MAX_KEYS_PER_USER": value})


def test_usage_of_a_key_deleted_with_its_account_does_not_hold_up_the_others(app, user):
    _, kept = keyactions.issue_key(user, "kept", "development")
    other = users.create_user("bob", "bob@example.com", "another long password")
    _, gone = keyactions.issue_key(other, "gone", "development")
    usage = app.extensions["usage"]
    kept_key, gone_key = auth.authenticate(kept), auth.authenticate(gone)
    usage.add(kept_key.id, "/api/v1/protected/test", 200, True)
    usage.add(gone_key.id, "/api/v1/protected/test", 200, True)
    organisations.delete_account(other, "another long password")
    usage.flush()
    assert usage.pending == {}
    assert ApiKey.get_by_id(kept_key.id).total_requests == 1
    assert User.get_or_none(User.username == "bob") is None


def hash_off_the_loop():
    """Run ~0.2 s of scrypt through users.off_the_loop as the server does; return the hashing
    thread's id and niceness, and how often the event loop ran meanwhile."""
    ticks = []

    def tick():
        while True:
            ticks.append(1)
            gevent.sleep(0.001)

    def slow_hash():
        hashlib.scrypt(b"password", salt=b"salt", n=2**15, r=8, p=1, maxmem=64 * 1024 * 1024)
        return threading.get_native_id(), os.getpriority(os.PRIO_PROCESS, 0)

    ticker = gevent.spawn(tick)
    try:
        thread, niceness = users.off_the_loop(slow_hash)
    finally:
        ticker.kill()
    return thread, niceness, len(ticks)


def test_password_hashing_leaves_the_event_loop_free(monkeypatch):
    monkeypatch.setattr(users, "greenlets_share_thread", lambda: True)
    thread, _, ticks = hash_off_the_loop()
    assert thread != threading.get_native_id()
    assert ticks > 20


def test_password_hashing_leaves_the_event_loop_free_at_a_lower_priority(monkeypatch):
    monkeypatch.setattr(users, "greenlets_share_thread", lambda: True)
    # Measured against the caller's own niceness, since suites run under `nice` too: the hashing
    # thread must end up below it in priority, and the caller (the event loop) keep its own.
    own = os.getpriority(os.PRIO_PROCESS, 0)
    if own >= LOWEST_PRIORITY:
        pytest.skip(f"this process already runs at niceness {own}, the lowest priority: no thread can go "
                    "below it (test_password_hashing_leaves_the_event_loop_free still runs)")
    monkeypatch.setattr(users, "HASHING_NICENESS", max(users.HASHING_NICENESS, own + 1))
    thread, niceness, ticks = hash_off_the_loop()
    assert thread != threading.get_native_id()
    assert niceness >= users.HASHING_NICENESS > own
    assert os.getpriority(os.PRIO_PROCESS, 0) == own
    assert ticks > 20


def test_the_instance_folder_is_made_private(tmp_path, monkeypatch):
    folder = tmp_path / "instance"
    folder.mkdir(mode=0o755)
    monkeypatch.setattr(service, "INSTANCE", folder)
    service.make_instance_folder()
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    service.instance_secret_key()
    assert stat.S_IMODE((folder / "secret_key").stat().st_mode) == 0o600


def test_an_existing_database_file_open_to_others_is_made_private(tmp_path):
    path = tmp_path / "old.db"
    for name in ("old.db", "old.db-wal"):
        (tmp_path / name).touch(mode=0o644)
        os.chmod(tmp_path / name, 0o644)
    protect_sqlite_files(str(path))
    for name in ("old.db", "old.db-wal"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600


def test_deleting_an_account_deletes_its_sessions_keys_and_user(user, api_key):
    sessions.start_session(user)
    organisations.delete_account(user, "correct horse battery")
    assert Session.select().count() == ApiKey.select().count() == User.select().count() == 0


def test_a_log_in_checked_against_the_old_password_starts_no_session(user):
    checked = users.user_for_login("alice", "correct horse battery")
    users.change_password(User.get_by_id(user.id), "correct horse battery", "a brand new passphrase")
    assert sessions.start_session(checked) is None
    organisations.delete_account(User.get_by_id(user.id), "a brand new passphrase")
    assert sessions.start_session(checked) is None
    assert Session.select().count() == 0


@pytest.mark.parametrize("name", ["evil\u202etxt.exe", "zero\u200bwidth", "line\u2028break", "bom\ufeff"])
def test_invisible_formatting_characters_are_refused_in_names(user, name):
    with pytest.raises(ValueError, match="invisible formatting characters"):
        keyactions.issue_key(user, name, "development")


def test_a_stale_request_cannot_clear_a_newer_pending_secret(user):
    token = sessions.start_session(user)
    sessions.keep_pending_secret(sessions.find_session(token), token, "first")
    stale = sessions.find_session(token)
    sessions.keep_pending_secret(sessions.find_session(token), token, "second")
    assert sessions.take_pending_secret(stale, token) is None
    assert sessions.take_pending_secret(sessions.find_session(token), token) == "second"


def test_the_hashing_queue_is_bounded(monkeypatch):
    monkeypatch.setattr(users, "greenlets_share_thread", lambda: True)
    monkeypatch.setattr(users, "_hashes_waiting", users.HASHING_QUEUE_LIMIT)
    with pytest.raises(users.HashingBusy):
        users.off_the_loop(len, "x")


@pytest.mark.parametrize("value", ["\u00b2", "\u0661"])
def test_max_keys_per_user_refuses_digits_that_are_not_ascii(value):
    with pytest.raises(ValueError, match="MAX_KEYS_PER_USER must be a whole number of at least 1"):
        service.load_config({"MAX_KEYS_PER_USER": value})


def test_tracebacks_are_redacted_too():
    record = logging.LogRecord("app", logging.ERROR, __file__, 1, "Unhandled error on GET %s", ("/x",), None)
    try:
        raise ValueError("bad key sk_live_" + "A" * 40)
    except ValueError:
        record.exc_info = sys.exc_info()
    logs.RedactSecrets().filter(record)
    text = logging.Formatter().format(record)
    assert "A" * 40 not in text and "sk_live_[redacted]" in text


def test_a_request_waiting_for_the_hashing_pool_holds_no_database_connection(user, monkeypatch):
    monkeypatch.setattr(users, "greenlets_share_thread", lambda: True)
    User.get_by_id(user.id)  # the request has its connection now
    users.off_the_loop(len, "x")
    # A pooled PostgreSQL connection went back to the pool before the wait; SQLite's one stays.
    assert db.obj.is_closed() is not isinstance(db.obj, SqliteDatabase)
    assert User.get_by_id(user.id).username == "alice"  # and the request gets one back afterwards


def test_an_account_keeps_its_newest_sessions_and_events_only(user, monkeypatch):
    monkeypatch.setattr(sessions, "MAX_SESSIONS", 3)
    monkeypatch.setattr(users.securitylog, "KEPT", 5)
    tokens = [sessions.start_session(user) for _ in range(6)]
    assert Session.select().where(Session.user == user.id).count() == 3
    assert sessions.find_session(tokens[-1]) is not None and sessions.find_session(tokens[0]) is None
    assert len(users.securitylog.recent(user.id, limit=None)) == 5


def test_an_account_s_own_events_never_push_out_the_organisation_events_it_acted_in(user, monkeypatch):
    """Each log keeps its newest KEPT: the account's own events count in the account's, an
    organisation's (the user their actor, as every key event an upgrade moved) in the organisation's."""
    monkeypatch.setattr(users.securitylog, "KEPT", 3)
    org_id = users.personal_organisation_id(user)
    users.securitylog.record_in(org_id, "key.created", "Kept (id 1)", actor_id=user.id)
    for _ in range(4):
        sessions.start_session(user)
    assert [event.event for event in users.securitylog.recent_in(org_id, limit=None)] == ["key.created"]
    assert [event.event for event in users.securitylog.recent(user.id, limit=None)].count("user.login") == 3


def test_passwords_are_hashed_with_scrypt_at_the_default_cost_unless_set(app):
    assert service.load_config({})["PASSWORD_HASH_COST"] == 32768
    assert service.load_config({"PASSWORD_HASH_COST": "131072"})["PASSWORD_HASH_COST"] == 131072
    app.config["PASSWORD_HASH_COST"] = 32768
    assert users.hash_password("a long password").startswith("scrypt:32768:8:1$")


@pytest.mark.parametrize("value", ["1000", "512", "262144", "0", "cheap", "\u00b2"])
def test_the_password_hash_cost_is_a_power_of_two_within_bounds(value):
    with pytest.raises(ValueError, match="PASSWORD_HASH_COST must be a"):
        service.load_config({"PASSWORD_HASH_COST": value})


def test_a_raised_cost_reaches_a_password_at_its_next_log_in_and_a_lowered_one_never(app, user):
    made = User.get_by_id(user.id).password_hash
    assert made.startswith(f"scrypt:{app.config['PASSWORD_HASH_COST']}:8:1$")
    app.config["PASSWORD_HASH_COST"] *= 2
    assert users.user_for_login("alice", "a wrong password") is None
    assert User.get_by_id(user.id).password_hash == made
    assert users.user_for_login("alice", "correct horse battery").id == user.id
    raised = User.get_by_id(user.id).password_hash
    assert raised.startswith(f"scrypt:{app.config['PASSWORD_HASH_COST']}:8:1$")
    app.config["PASSWORD_HASH_COST"] //= 4
    assert users.user_for_login("alice", "correct horse battery").id == user.id
    assert User.get_by_id(user.id).password_hash == raised


def test_a_hash_of_another_method_is_made_scrypt_at_the_next_log_in(app, user):
    User.update(password_hash=generate_password_hash("correct horse battery", "pbkdf2:sha256:1000")).where(
        User.id == user.id).execute()
    assert users.user_for_login("alice", "correct horse battery").id == user.id
    assert User.get_by_id(user.id).password_hash.startswith(f"scrypt:{app.config['PASSWORD_HASH_COST']}:8:1$")


def test_a_password_changed_while_its_old_hash_is_raised_stays_changed(app, user):
    seen_at_log_in = User.get_by_id(user.id)
    users.change_password(User.get_by_id(user.id), "correct horse battery", "a new long password")
    changed = User.get_by_id(user.id).password_hash
    app.config["PASSWORD_HASH_COST"] *= 2
    users.rehash_if_weaker(seen_at_log_in, "correct horse battery")
    assert User.get_by_id(user.id).password_hash == changed


def raised_at_log_in(app, client, user):
    """Raise the cost and log in through the form; return the response, checking the hash was raised."""
    app.config["PASSWORD_HASH_COST"] *= 2
    response = client.post("/login", data={"username": "alice", "password": "correct horse battery"})
    assert User.get_by_id(user.id).password_hash.startswith(f"scrypt:{app.config['PASSWORD_HASH_COST']}:8:1$")
    return response


def test_the_log_in_that_raises_a_hash_s_cost_logs_in(app, client, user):
    response = raised_at_log_in(app, client, user)
    assert response.status_code == 302 and is_logged_in(client)


def test_the_two_factor_log_in_that_raises_a_hash_s_cost_logs_in(app, logged_in, user):
    secret, _ = enable(logged_in)
    logged_in.post("/logout")
    response = raised_at_log_in(app, logged_in, user)
    assert response.status_code == 302 and response.headers["Location"] == "/login/2fa"
    assert logged_in.post("/login/2fa", data={"code": code_at(secret, 1)}).status_code == 302
    assert is_logged_in(logged_in)


def test_a_full_hashing_pool_leaves_the_hash_for_the_next_log_in(app, user, monkeypatch):
    made = User.get_by_id(user.id).password_hash
    app.config["PASSWORD_HASH_COST"] *= 2
    checked = []

    def busy_after_the_check(function, *args):
        if checked:
            raise users.HashingBusy()
        checked.append(function)
        return function(*args)

    monkeypatch.setattr(users, "off_the_loop", busy_after_the_check)
    assert users.user_for_login("alice", "correct horse battery").id == user.id
    assert User.get_by_id(user.id).password_hash == made
