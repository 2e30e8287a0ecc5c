"""The forgotten password's pages with Flask's test client, mails through a real SMTP server, on
SQLite and PostgreSQL: the whole flow, and each attack on it (which addresses have accounts, by the
answer or its time; links guessed, reused, voided, expired or fetched by a scanner; a reset that
would skip two-factor log-in; headers injected through the address; floods per account and per IP)."""

import logging
import re
import time

import pytest
from limits import RateLimitItemPerMinute
from twofactorsteps import code_at, enable, is_logged_in
from webforms import Fields, page

from accounts import emailtokens, recovery, throttles, users
from accounts.emailtokens import EmailToken
from mail import outbox, sender
from mail.models import MailMessage
from models import SecurityEvent, Session, User, utcnow
from ops import logs
from web import recovery as recovery_pages

PASSWORD = "correct horse battery"
NEW_PASSWORD = "a brand new passphrase"
LINK = re.compile(r"https?://[^/\s]+(/password/reset/[A-Za-z0-9_-]+)")
SENT = "If an account has the address"


@pytest.fixture
def app(make_app, database_url, smtp, monkeypatch):
    """The conftest app's settings, mailing through the test's SMTP server; answers to a request for
    a link come at once (the wait is its own test's subject)."""
    monkeypatch.setattr(recovery_pages, "ANSWER_SECONDS", 0)
    app = make_app({"DATABASE_URL": database_url, "RATELIMIT_STORAGE_URL": "memory://", "TESTING": True,
                    "WTF_CSRF_ENABLED": False, "MAIL_URL": smtp.url})
    with app.app_context():
        yield app


def ask(client, address="alice@example.com"):
    return client.post("/password/forgot", data={"email": address})


def mailed_path(app, smtp, to="alice@example.com", count=1):
    """Send what is due; return the path of the link in the count-th mail to that address."""
    sender.send_due(app)
    mail = smtp.wait_for(count, to=to)[count - 1]
    assert mail.subject == "Reset your password"
    path = LINK.search(mail.text)[1]
    assert path in mail.html
    return path


def token_of(path):
    return path.rpartition("/")[2]


def password_hash():
    return User.get(User.username == "alice").password_hash


def test_the_login_page_links_the_forgotten_password(client):
    html = page(client.get("/login"))
    assert '<a href="/password/forgot">Forgot your password?</a>' in html
    form = page(client.get("/password/forgot"))
    assert 'name="email"' in form and 'type="email"' in form


def test_a_link_by_mail_sets_the_password_after_a_fetch_that_changed_nothing(app, client, smtp, user):
    other_browser = app.test_client()
    other_browser.post("/login", data={"username": "alice", "password": PASSWORD})
    response = ask(client)
    assert response.status_code == 200 and SENT in page(response)
    path = mailed_path(app, smtp)
    [mail] = smtp.mails
    assert "alice" in mail.text and PASSWORD not in mail.text and mail.to == "alice@example.com"

    before = (password_hash(), Session.select().count(), SecurityEvent.select().count())
    for _ in range(2):  # a mail scanner, then the owner
        shown = client.get(path)
        assert shown.status_code == 200 and 'name="new_password"' in page(shown)
        assert shown.headers["Referrer-Policy"] == "strict-origin" and shown.headers["Cache-Control"] == "no-store"
    assert (password_hash(), Session.select().count(), SecurityEvent.select().count()) == before
    assert EmailToken.get().used_at is None

    response = client.post(path, data={"new_password": NEW_PASSWORD})
    assert response.status_code == 302 and response.headers["Location"] == "/login"
    assert "Your password is set" in page(client.get("/login"))
    assert not is_logged_in(other_browser) and not is_logged_in(client)
    assert client.post("/login", data={"username": "alice", "password": PASSWORD}).status_code == 400
    assert client.post("/login", data={"username": "alice", "password": NEW_PASSWORD}).status_code == 302
    events = [event.event for event in SecurityEvent.select().order_by(SecurityEvent.id)]
    assert events.count("user.password_reset_requested") == 1 and events.count("user.password_reset") == 1


def answer(response):
    return response.status_code, page(response), response.headers.get("Set-Cookie")


def test_known_unknown_and_capped_addresses_get_the_same_answer(app, client, smtp, user):
    known = answer(ask(client))
    unknown = answer(ask(client, "nobody@example.com"))
    assert known == unknown[:1] + (unknown[1].replace("nobody@example.com", "alice@example.com"),) + unknown[2:]
    assert known[0] == 200 and known[2] is None
    for _ in range(2):
        ask(client)
    assert answer(ask(client)) == known  # the fourth in an hour: nothing sent, the same answer
    sender.send_due(app)
    assert len(smtp.wait_for(3)) == 3
    time.sleep(0.3)
    assert len(smtp.mails) == 3 and MailMessage.select().count() == 3


def test_each_answer_waits_for_the_same_mark_known_or_not(app, client, user, monkeypatch):
    # Loose on purpose: each answer comes no sooner than the mark, whatever the machine's load.
    monkeypatch.setattr(recovery_pages, "ANSWER_SECONDS", 0.25)
    took = {}
    for address in ("alice@example.com", "nobody@example.com"):
        started = time.monotonic()
        assert ask(client, address).status_code == 200
        took[address] = time.monotonic() - started
    assert min(took.values()) >= 0.25, took


@pytest.mark.parametrize("address", [
    "alice@example.com\r\nBcc: eve@example.com", "alice@example.com\nBcc: eve@example.com",
    "eve@example.com>\r\nTo: <alice@example.com", "alice@example.com%0d%0aBcc:eve@example.com",
    "alice@example.com, eve@example.com", "Alice <alice@example.com>", "alice@example.com\x00",
])
def test_an_address_carrying_headers_is_refused_and_mails_nothing(app, client, smtp, user, address):
    response = ask(client, address)
    assert response.status_code == 400
    assert "email address" in page(response) and SENT not in page(response)
    assert MailMessage.select().count() == 0 and EmailToken.select().count() == 0


def test_an_address_no_header_may_carry_is_refused_alike_whether_or_not_an_account_has_it(app, client):
    users.create_user("obrien", 'o"brien@example.com', PASSWORD)
    known, unknown = ask(client, 'o"brien@example.com'), ask(client, 'o"connor@example.com')
    assert known.status_code == unknown.status_code == 400
    assert page(known).replace("brien", "connor") == page(unknown)
    assert EmailToken.select().count() == 0


def test_the_per_ip_login_throttle_counts_every_request_and_refuses_with_a_429(app, client, smtp, user, monkeypatch):
    monkeypatch.setattr(throttles, "LOGIN_FAILURES_PER_IP", RateLimitItemPerMinute(3))
    assert ask(client, "nobody@example.com").status_code == 200
    assert ask(client).status_code == 200
    path = mailed_path(app, smtp)
    assert reset(client, path, "short").status_code == 400
    for refused in (ask(client), reset(client, path)):
        assert refused.status_code == 429 and refused.headers["Retry-After"].isdigit()
        assert "Too many attempts. Try again in" in page(refused)
    assert len(smtp.mails) == 1 and EmailToken.get().used_at is None
    # Another address has its own allowance.
    other = client.post("/password/forgot", data={"email": "alice@example.com"},
                        environ_overrides={"REMOTE_ADDR": "10.1.2.3"})
    assert other.status_code == 200


def reset(client, path, password=NEW_PASSWORD):
    return client.post(path, data={"new_password": password})


@pytest.mark.parametrize("repeated", [NEW_PASSWORD + "!", "", NEW_PASSWORD.upper()])
def test_a_repetition_that_differs_is_refused_on_its_field_and_changes_nothing(app, client, smtp, user, repeated):
    ask(client)
    path = mailed_path(app, smtp)
    form = Fields(page(client.get(path)))
    assert form.inputs["repeat_new_password"]["type"] == "password" and form.focused() == ["new_password"]
    before = (password_hash(), list(EmailToken.select().tuples()), Session.select().count(),
              SecurityEvent.select().count())
    response = client.post(path, data={"new_password": NEW_PASSWORD, "repeat_new_password": repeated})
    assert response.status_code == 400 and response.headers["Referrer-Policy"] == "strict-origin"
    form = Fields(page(response))
    assert " ".join(form.texts["field-error"].split()) == recovery_pages.MISMATCH
    assert form.description("repeat_new_password").startswith(recovery_pages.MISMATCH)
    # Both are typed again (a page never shows a password back): the focus is on the first.
    assert sorted(form.invalid()) == ["new_password", "repeat_new_password"] and form.focused() == ["new_password"]
    assert (password_hash(), list(EmailToken.select().tuples()), Session.select().count(),
            SecurityEvent.select().count()) == before
    # The link still works, with the same password twice.
    response = client.post(path, data={"new_password": NEW_PASSWORD, "repeat_new_password": NEW_PASSWORD})
    assert response.status_code == 302 and response.headers["Location"] == "/login"
    assert client.post("/login", data={"username": "alice", "password": NEW_PASSWORD}).status_code == 302
    # A used link says so, whatever the two fields hold.
    again = client.post(path, data={"new_password": NEW_PASSWORD, "repeat_new_password": repeated})
    assert again.status_code == 410 and "This link was used already" in page(again)


@pytest.mark.parametrize("why, status, heading", [
    ("used", 410, "This link was used already"),
    ("voided", 410, "This link was replaced"),
    ("expired", 410, "This link has expired"),
    ("address changed", 410, "This link no longer works"),
    ("unknown", 404, "This link is not known"),
])
def test_a_link_that_cannot_be_used_says_why_and_changes_nothing(app, client, smtp, user, why, status, heading):
    ask(client)
    path = mailed_path(app, smtp)
    if why == "used":
        assert reset(client, path).status_code == 302
    elif why == "voided":
        ask(client)
    elif why == "expired":
        EmailToken.update(expires_at=utcnow()).execute()
    elif why == "address changed":
        User.update(email="alice@elsewhere.example").execute()
    else:
        path = path[:-4] + ("AAAA" if not path.endswith("AAAA") else "BBBB")
    before = (password_hash(), list(EmailToken.select().tuples()), SecurityEvent.select().count())
    for response in (client.get(path), reset(client, path, "yet another passphrase")):
        assert response.status_code == status
        assert f"<h1>{heading}</h1>" in page(response) and 'href="/password/forgot"' in page(response)
        assert response.headers["Referrer-Policy"] == "strict-origin"
    assert (password_hash(), list(EmailToken.select().tuples()), SecurityEvent.select().count()) == before


@pytest.mark.parametrize("token", [
    "x" * 1_000_000, "%00" * 43, "%E2%80%AE" + "a" * 40, "a" * 42, "..%2F..%2Fsettings", "'%20OR%201=1--" + "a" * 30,
    "%F0%9F%94%91" * 11,
])
def test_guessed_and_garbage_tokens_are_404_without_a_lookup(app, client, user, monkeypatch, token):
    def no_lookup(*args, **kwargs):
        raise AssertionError("looked up")

    monkeypatch.setattr(EmailToken, "get_or_none", no_lookup)
    before = password_hash()
    for response in (client.get(f"/password/reset/{token}"), reset(client, f"/password/reset/{token}")):
        assert response.status_code == 404
    assert password_hash() == before


def test_a_reset_never_skips_two_factor_login(app, client, smtp, user):
    client.post("/login", data={"username": "alice", "password": PASSWORD})
    secret, recovery_codes = enable(client)
    stranded = app.test_client()  # half logged in before the reset: the old password's pending log-in
    assert stranded.post("/login", data={"username": "alice", "password": PASSWORD}).headers["Location"] == "/login/2fa"
    ask(client)
    assert reset(client, mailed_path(app, smtp)).status_code == 302
    assert not is_logged_in(client)
    response = client.post("/login", data={"username": "alice", "password": NEW_PASSWORD})
    assert response.status_code == 302 and response.headers["Location"] == "/login/2fa"
    assert not is_logged_in(client)
    assert client.post("/login/2fa", data={"code": recovery_codes[0]}).status_code == 302 and is_logged_in(client)
    # Its code is right, but the password it was checked against is no longer the account's.
    response = stranded.post("/login/2fa", data={"code": code_at(secret, 1)})
    assert response.status_code == 302 and response.headers["Location"] == "/login"
    assert not is_logged_in(stranded)


def test_the_reset_form_passes_the_csrf_check_over_https_with_the_origin_alone(app, client, smtp, user):
    ask(client)
    path = mailed_path(app, smtp)
    app.config["WTF_CSRF_ENABLED"] = True
    https = {"base_url": "https://localhost"}
    form = page(client.get(path, **https))
    token = re.search(r'name="csrf_token" value="([^"]+)"', form)[1]
    # What a browser sends under the page's Referrer-Policy: strict-origin.
    response = client.post(path, data={"new_password": NEW_PASSWORD, "csrf_token": token},
                           headers={"Referer": "https://localhost/"}, **https)
    assert response.status_code == 302 and EmailToken.get().used_at is not None


@pytest.mark.parametrize("link", ["https://api.example.com/login", None])
def test_the_reset_notice_has_its_text_with_or_without_a_link(app, link):
    with app.test_request_context():
        text, html = outbox.render("password_reset_done", username="alice", link=link)
    for part in (text, html):
        assert "alice" in part and "was reset" in part and "None" not in part
        assert (link in part) if link else "Log in with" not in part
    assert outbox.SUBJECTS["password_reset_done"] == "Your password was reset"


def test_the_stored_token_is_a_hash_and_the_mail_is_sealed(app, client, smtp, user):
    ask(client)
    row = MailMessage.get()
    token = token_of(mailed_path(app, smtp))
    assert EmailToken.get().token_hash == emailtokens.hashed(token)
    assert token not in row.sealed_parts and token not in str(list(EmailToken.select().tuples()))


def test_with_mail_url_console_the_link_is_written_to_the_log_whole_and_works(make_app, database_url, caplog):
    # The contract's console writes each mail to the log, links included: the log's redaction of
    # API keys (any run of 32 letters and digits) must leave a reset link's token whole.
    app = make_app({"DATABASE_URL": database_url, "RATELIMIT_STORAGE_URL": "memory://", "TESTING": True,
                    "WTF_CSRF_ENABLED": False, "MAIL_URL": "console"})
    client = app.test_client()
    with app.app_context():
        users.create_user("alice", "alice@example.com", PASSWORD)
        for _ in range(recovery.MAILS_PER_HOUR):
            with caplog.at_level(logging.INFO, logger="mail.transport"):
                assert ask(client).status_code == 200
                sender.send_due(app)
            path = LINK.findall(logs.redact(caplog.text))[-1]
        assert reset(client, path).status_code == 302
