"""The forgotten password on the real server in both run modes (the Procfile's gunicorn, and
`python app.py`'s fallback server), on SQLite and PostgreSQL, its mails through a real SMTP server:
the whole flow, two-factor log-in after a reset, and the attacks (which addresses have accounts;
links reused, voided, expired or garbage; floods per account and per IP; headers through the
address; tokens in the server's log). Each browser has its own client address (X-Forwarded-For
behind TRUSTED_PROXIES=1)."""

import re
import sqlite3

import psycopg
import pytest
import requests
from liveserver import PASSWORD, Browser, usernames
from mailserver import mail_server
from serverfixtures import each_run_mode, env_on_each_database, mailing
from services import rows
from twofactorsteps import code_at
from webforms import Fields

NEW_PASSWORD = "a brand new passphrase"
LINK = re.compile(r"https?://[^/\s]+(/password/reset/([A-Za-z0-9_-]+))")
SENT = "If an account has the address"
# Every token mailed in this module: none may reach the server's log.
tokens_seen = []


@pytest.fixture(scope="module")
def smtp():
    with mail_server() as server:
        yield server


env = env_on_each_database
server_mode = each_run_mode


@pytest.fixture(scope="module")
def server_settings(smtp):
    return mailing(smtp, TRUSTED_PROXIES="1")


@pytest.fixture(scope="module")
def server_log_check():
    def no_token_logged(output):
        assert tokens_seen and not any(token in output for token in tokens_seen)
        # The access lines are there, each link's token redacted.
        assert 'GET /password/reset/[redacted] HTTP/1.1" 200' in output
        assert 'POST /password/reset/[redacted] HTTP/1.1" 302' in output
    return no_token_logged


def ask(browser, address):
    return browser.post("/password/forgot", {"email": address})


def mailed_link(smtp, address, count=1):
    """The path of the link in the count-th mail to the address, once it has arrived."""
    mail = smtp.wait_for(count, to=address, subject="Reset your password")[count - 1]
    assert mail.subject == "Reset your password" and PASSWORD not in mail.text
    path, token = LINK.search(mail.text).groups()
    assert path in mail.html
    tokens_seen.append(token)
    return path


def reset(browser, path, password=NEW_PASSWORD):
    # The CSRF token from a page every browser gets (a link that cannot be used shows no form).
    return browser.post(path, {"new_password": password}, form_page="/password/forgot")


def execute(database_url, sql):
    """Change the server's database from outside it (the clock moved: an hour gone by)."""
    if database_url.startswith("sqlite"):
        with sqlite3.connect(database_url.removeprefix("sqlite:///")) as connection:
            connection.execute(sql)
        return
    with psycopg.connect(database_url) as connection:
        connection.execute(sql)


def account(server):
    """A new account, logged out; return (its browser, its address)."""
    browser = Browser(server).signup()
    browser.post("/logout", form_page="/settings/profile")
    return browser, f"{browser.username}@example.com"


def test_a_mailed_link_sets_the_password_and_ends_every_session(server, smtp):
    owner = Browser(server).signup()
    address = f"{owner.username}@example.com"
    elsewhere = owner.copy()
    assert elsewhere.logged_in()
    stranger = Browser(server)
    response = ask(stranger, address)
    assert response.status_code == 200 and SENT in response.text
    path = mailed_link(smtp, address)

    scanner = requests.get(server.base + path, timeout=30)  # a mail scanner fetches the link
    assert scanner.status_code == 200 and 'name="new_password"' in scanner.text
    assert elsewhere.logged_in()
    assert Browser(server).login(owner.username).status_code == 302  # the old password still works

    browser = Browser(server)
    assert browser.get(path).status_code == 200
    response = reset(browser, path)
    assert response.status_code == 302 and response.headers["Location"] == "/login"
    assert not elsewhere.logged_in() and not owner.logged_in()
    assert Browser(server).login(owner.username).status_code == 400
    fresh = Browser(server)
    assert fresh.login(owner.username, NEW_PASSWORD).status_code == 302 and fresh.logged_in()
    assert reset(Browser(server), path, "yet another passphrase").status_code == 410


def test_a_repetition_that_differs_changes_nothing_and_the_link_still_works(server, smtp):
    browser, address = account(server)
    ask(Browser(server), address)
    path = mailed_link(smtp, address)
    response = browser.post(path, {"new_password": NEW_PASSWORD, "repeat_new_password": NEW_PASSWORD + "?"})
    assert response.status_code == 400
    form = Fields(response.text)
    assert "The two passwords differ" in form.texts["field-error"] and "repeat_new_password" in form.invalid()
    assert Browser(server).login(browser.username).status_code == 302  # the old password still works
    response = browser.post(path, {"new_password": NEW_PASSWORD, "repeat_new_password": NEW_PASSWORD})
    assert response.status_code == 302 and response.headers["Location"] == "/login"
    assert Browser(server).login(browser.username, NEW_PASSWORD).status_code == 302


def test_after_a_reset_log_in_still_asks_for_the_second_factor(server, smtp):
    browser = Browser(server).signup()
    address = f"{browser.username}@example.com"
    page = browser.post("/settings/security/2fa/setup", form_page="/settings/security").text
    secret = re.search(r'data-totp-secret="([A-Z2-7]+)"', page)[1]
    assert browser.post("/settings/security/2fa/enable", {"code": code_at(secret)},
                        form_page="/settings/security").status_code == 200
    ask(Browser(server), address)
    assert reset(Browser(server), mailed_link(smtp, address)).status_code == 302
    assert not browser.logged_in()
    response = browser.login(browser.username, NEW_PASSWORD)
    assert response.status_code == 302 and response.headers["Location"] == "/login/2fa"
    assert not browser.logged_in()
    assert browser.post("/login/2fa", {"code": code_at(secret, 1)}).status_code == 302 and browser.logged_in()


def test_known_and_unknown_addresses_get_the_same_answer(server, smtp):
    _, address = account(server)
    browser = Browser(server)
    known, unknown = ask(browser, address), ask(browser, f"no-{next(usernames)}@example.com")
    assert known.status_code == unknown.status_code == 200
    unknown_address = re.search(r"<strong>([^<]+)</strong>", unknown.text)[1]
    assert known.text == unknown.text.replace(unknown_address, address)
    assert "Set-Cookie" not in known.headers and "Set-Cookie" not in unknown.headers
    mailed_link(smtp, address)


def test_a_newer_link_voids_the_older_and_an_expired_one_changes_nothing(server, smtp, env):
    _, address = account(server)
    browser = Browser(server)
    ask(browser, address)
    older = mailed_link(smtp, address)
    ask(browser, address)
    newer = mailed_link(smtp, address, 2)
    for response in (browser.get(older), reset(browser, older)):
        assert response.status_code == 410 and "This link was replaced" in response.text
    execute(env["DATABASE_URL"], f"UPDATE email_tokens SET expires_at = created_at WHERE email = '{address}'")
    for response in (browser.get(newer), reset(browser, newer)):
        assert response.status_code == 410 and "This link has expired" in response.text
    assert Browser(server).login(address.partition("@")[0]).status_code == 302  # the password is as it was


def test_a_password_changed_on_the_profile_tab_ends_the_link_mailed_before(server, smtp):
    owner = Browser(server).signup()
    address = f"{owner.username}@example.com"
    ask(Browser(server), address)
    path = mailed_link(smtp, address)
    changed = owner.post("/settings/profile/password", {"current_password": PASSWORD, "new_password": NEW_PASSWORD},
                         form_page="/settings/profile")
    assert changed.status_code in (200, 302), changed.text
    stranger = Browser(server)
    for response in (stranger.get(path), reset(stranger, path, "the holder's own passphrase")):
        assert response.status_code == 410 and "password was changed after the link was mailed" in response.text
    assert Browser(server).login(owner.username, "the holder's own passphrase").status_code == 400
    assert Browser(server).login(owner.username, NEW_PASSWORD).status_code == 302


def test_guessed_and_garbage_tokens_are_404_and_a_megabyte_one_is_refused_by_the_server(server):
    browser = Browser(server)
    for token in ["A" * 43, "x" * 3000, "%00" * 43, "%E2%80%AE" + "a" * 40, "'%20OR%201=1--" + "a" * 30]:
        assert browser.get(f"/password/reset/{token}").status_code == 404, token
        assert reset(browser, f"/password/reset/{token}", NEW_PASSWORD).status_code == 404, token
    response = requests.get(f"{server.base}/password/reset/{'x' * 1_000_000}", timeout=30)
    assert response.status_code in (414, 431)  # the server refuses the request line before the app
    assert browser.get("/password/forgot").status_code == 200


def test_the_fourth_request_in_an_hour_mails_nothing(server, smtp, env):
    _, address = account(server)
    # A confirmed address: an unconfirmed one's links also count in its cap of 3 mails an hour
    # (mail/addresscap.py), which sign-up's link has begun (tests/unit/mail/test_addresscap.py).
    execute(env["DATABASE_URL"],
            f"UPDATE users SET email_verified_at = '2026-01-01 00:00:00' WHERE email = '{address}'")
    for _ in range(4):
        assert SENT in ask(Browser(server), address).text  # each from another address
    # Written in each request's transaction: what is in the outbox now is all that will be sent.
    assert rows(env["DATABASE_URL"], f"SELECT count(*) FROM mail_messages WHERE recipient = '{address}' "
                                     "AND subject = 'Reset your password'") == [(3,)]
    for count in (1, 2, 3):
        mailed_link(smtp, address, count)
    execute(env["DATABASE_URL"], "UPDATE email_tokens SET created_at = '2000-01-01 00:00:00' "
                                 f"WHERE email = '{address}'")
    ask(Browser(server), address)
    mailed_link(smtp, address, 4)


@pytest.mark.parametrize("address", [
    "{}@example.com\r\nBcc: eve@example.com", "{}@example.com\nBcc: eve@example.com",
    "{}@example.com, eve@example.com", "Eve <{}@example.com>",
])
def test_headers_through_the_address_are_refused_and_mail_nothing(server, smtp, env, address):
    _, own = account(server)
    response = ask(Browser(server), address.format(own.partition("@")[0]))
    assert response.status_code == 400 and "email address" in response.text and SENT not in response.text
    assert rows(env["DATABASE_URL"], f"SELECT count(*) FROM mail_messages WHERE recipient = '{own}' "
                                     "AND subject = 'Reset your password'") == [(0,)]
    assert not [mail for mail in smtp.mails if "eve@example.com" in mail.rcpt_tos or "Bcc" in mail.message]


def test_the_per_ip_login_throttle_counts_each_request_and_answers_429(server, smtp):
    _, address = account(server)
    flooder = Browser(server)
    ask(flooder, address)
    path = mailed_link(smtp, address)
    # The log-in allowance is 20 a minute per address (accounts/throttles.py); that took one.
    for _ in range(19):
        assert ask(flooder, f"no-{next(usernames)}@example.com").status_code == 200
    for refused in (ask(flooder, address), reset(flooder, path)):
        assert refused.status_code == 429 and "Too many attempts. Try again in" in refused.text
        assert refused.headers["Retry-After"].isdigit()
    assert reset(Browser(server), path).status_code == 302  # the link still works from elsewhere
