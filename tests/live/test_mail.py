"""Mail from the real service (both run modes): a notice sent through a real SMTP server by the
serving process, a mail server that is down and comes back (nothing lost), a stop or a crash with a
mail pending, and the console backend's lines in the log."""

import contextlib
import signal
import sqlite3

import pytest
import requests
from liveserver import make_key, service_env, serving, start_server, wait_for
from services import rows


def confirmed_key(env):
    """A key of carol, whose address is confirmed (`users create` leaves it unconfirmed, and an
    unconfirmed address gets no notice)."""
    secret = make_key(env)
    with contextlib.closing(sqlite3.connect(env["DATABASE_URL"].removeprefix("sqlite:///"))) as connection, connection:
        connection.execute("UPDATE users SET email_verified_at = '2026-01-01 00:00:00'")
    return secret


def revoke_as_leaked(server, secret):
    response = requests.post(server.base + "/api/v1/keys/revoke", headers={"X-API-Key": secret}, timeout=10)
    assert response.status_code == 200, response.text


def mail_rows(env):
    return rows(env["DATABASE_URL"], "SELECT state, attempts, error FROM mail_messages")


def test_a_notice_goes_through_the_smtp_server_in_each_run_mode(tmp_path, run_mode, smtp):
    env = service_env(tmp_path, MAIL_URL=smtp.url, PUBLIC_URL="https://api.example.com")
    secret = confirmed_key(env)
    with serving(tmp_path, env, run_mode) as server:
        revoke_as_leaked(server, secret)
        [mail] = smtp.wait_for(1, to="carol@example.com")
    assert mail.subject == "An API key was revoked: it was found in public"
    assert '"free key"' in mail.text and "https://api.example.com/settings/security" in mail.text
    assert secret[8:] not in mail.raw.decode()
    assert mail_rows(env) == [("sent", 1, None)]


def test_a_mail_server_that_is_down_delays_a_mail_and_loses_nothing(tmp_path, smtp):
    smtp.stop()
    env = service_env(tmp_path, MAIL_URL=smtp.url, PUBLIC_URL="https://api.example.com",
                      MAIL_RETRY_SCHEDULE="1s,1s,1s,1s,1s,1s,1s,1s,1s,1s")
    secret = confirmed_key(env)
    with serving(tmp_path, env) as server:
        revoke_as_leaked(server, secret)
        server.wait_for_output("The mail server refused the connection.")
        smtp.start()
        [mail] = smtp.wait_for(1, to="carol@example.com")
    assert mail.subject == "An API key was revoked: it was found in public"
    [(state, attempts, _)] = mail_rows(env)
    assert state == "sent" and attempts >= 2


@pytest.mark.parametrize("stop", ["SIGTERM", "SIGKILL"])
def test_a_mail_pending_through_a_stop_or_a_crash_is_sent_by_the_next_start(tmp_path, smtp, stop):
    smtp.stop()
    # 10 s: the stop comes between two attempts, on a loaded machine too (a process killed in the
    # middle of an attempt leaves its mail to the lease's end: tests/unit/mail/test_sender.py).
    env = service_env(tmp_path, MAIL_URL=smtp.url, PUBLIC_URL="https://api.example.com", MAIL_RETRY_SCHEDULE="10s")
    secret = confirmed_key(env)
    server = start_server(tmp_path, env)
    try:
        revoke_as_leaked(server, secret)
        wait_for(lambda: mail_rows(env) and mail_rows(env)[0][2] is not None)
        server.stop(getattr(signal, stop))
    finally:
        server.stop()
    assert [(state, attempts) for state, attempts, _ in mail_rows(env)] == [("pending", 1)]
    smtp.start()
    with serving(tmp_path, env):
        [mail] = smtp.wait_for(1, to="carol@example.com")
    assert mail.subject == "An API key was revoked: it was found in public"
    assert [(state, attempts) for state, attempts, _ in mail_rows(env)] == [("sent", 2)]


def test_the_console_backend_writes_each_mail_to_the_log(tmp_path, run_mode):
    env = service_env(tmp_path, PUBLIC_URL="https://api.example.com")
    env.pop("MAIL_URL", None)
    secret = confirmed_key(env)
    with serving(tmp_path, env, run_mode) as server:
        revoke_as_leaked(server, secret)
        output = server.wait_for_output("Mail to carol@example.com | Your keys: https://api.example.com/settings/security")
    assert "MAIL_URL is console: each mail, its links included, is written to this log" in output
    assert "Mail to carol@example.com (MAIL_URL is console: written here, not sent): An API key was revoked" in output
    assert mail_rows(env) == [("sent", 1, None)]
