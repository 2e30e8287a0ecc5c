"""The address pages with Flask's test client, their mails through a real SMTP server: sign-up's
link, "Send again", a change to a new address; each link's GET changes nothing and its form acts
once; refused links, wrong passwords, injected headers, caps per account and per IP."""

import datetime
import re

import pytest
from appconfig import TEST_TIERS
from flask import g
from limits import RateLimitItemPerMinute
from webforms import page

from accounts import emailaddress, emailtokens, securitylog, throttles, users
from accounts.emailtokens import EmailToken
from mail import sender
from mail.models import MailMessage
from models import User, utcnow

LINK = re.compile(r"https://api\.example\.com(/email/(?:verify|change)/[A-Za-z0-9_-]{43})")
PASSWORD = "correct horse battery"


@pytest.fixture
def app(make_app, database_url, smtp):
    """conftest's app, mailing through the test's SMTP server."""
    app = make_app({"DATABASE_URL": database_url, "RATELIMIT_STORAGE_URL": "memory://", "RATE_LIMIT_TIERS": TEST_TIERS,
                    "TESTING": True, "WTF_CSRF_ENABLED": False, "MAIL_URL": smtp.url,
                    "PUBLIC_URL": "https://api.example.com"})
    with app.app_context():
        yield app


def delivered(app, smtp, count, to=None):
    """The mails the SMTP server holds (to that address) once the outbox's due ones are sent."""
    sender.send_due(app)
    return smtp.wait_for(count, to=to)


def link_of(mail):
    """The path of the one link a mail carries, the same in its text and its HTML."""
    [path] = set(LINK.findall(mail.text))
    assert set(LINK.findall(mail.html)) == {path}
    return path


def flashes(response):
    return re.findall(r'<p class="flash[^"]*"[^>]*>(.*?)</p>', page(response), re.S)


def events(name):
    return [event.detail for user in User.select() for event in securitylog.recent(user.id) if event.event == name]


def alice():
    return User.get(User.username == "alice")


def sign_up(client, username="bob"):
    response = client.post("/signup", data={"username": username, "email": f"{username}@example.com",
                                            "password": "long enough pass"})
    assert response.status_code == 302
    return User.get(User.username == username)


def test_sign_up_mails_a_link_whose_page_changes_nothing_and_whose_form_confirms(app, client, smtp):
    bob = sign_up(client)
    [mail] = delivered(app, smtp, 1)
    assert (mail.to, mail.subject) == ("bob@example.com", "Confirm your email address")
    assert "long enough pass" not in mail.text + mail.html and 'name="viewport"' in mail.html
    path = link_of(mail)
    profile = page(client.get("/settings/profile"))
    assert "Not verified" in profile and "Send again" in profile
    for _ in range(2):  # a mail scanner, then the person
        shown = client.get(path)
        assert shown.status_code == 200 and "Confirm my address" in page(shown) and "bob@example.com" in page(shown)
    assert User.get_by_id(bob.id).email_verified_at is None and events("user.email_verified") == []
    assert EmailToken.get().used_at is None
    confirmed = client.post(path)
    assert (confirmed.status_code, confirmed.headers["Location"]) == (302, "/settings/profile")
    profile = client.get("/settings/profile")
    assert "The address bob@example.com is confirmed." in flashes(profile)
    assert "Verified" in page(profile) and "Not verified" not in page(profile) and "Send again" not in page(profile)
    assert User.get_by_id(bob.id).email_verified_at is not None and events("user.email_verified") == ["bob@example.com"]
    again = client.post(path)
    assert again.status_code == 410 and "This link was used already" in page(again)
    assert "Nothing was changed." in page(again) and events("user.email_verified") == ["bob@example.com"]


def test_a_verify_link_works_without_a_log_in_and_logs_no_one_in(app, client, smtp):
    bob = sign_up(client)
    client.post("/logout")
    path = link_of(delivered(app, smtp, 1)[0])
    response = client.post(path)
    assert (response.status_code, response.headers["Location"]) == (302, "/login")
    assert "The address bob@example.com is confirmed." in flashes(client.get("/login"))
    assert client.get("/settings/profile").status_code == 302
    assert User.get_by_id(bob.id).email_verified_at is not None


@pytest.mark.parametrize("address, sentence", [
    ("bob<eve@example.com", "That address cannot be mailed"),
    ("bob@example.com\r\nBcc: eve@example.com", "cannot contain control characters"),
    ("bob@example.com\nBcc: eve@example.com", "cannot contain control characters"),
])
def test_sign_up_with_an_address_no_header_may_carry_creates_nothing(app, client, smtp, address, sentence):
    response = client.post("/signup", data={"username": "bob", "email": address, "password": "long enough pass"})
    assert response.status_code == 400 and sentence in page(response)
    assert User.select().count() == 0 and EmailToken.select().count() == 0 and MailMessage.select().count() == 0


@pytest.mark.parametrize("purpose", ["verify", "change"])
@pytest.mark.parametrize("token", ["nope", "A" * 43, "A" * 1_000_000, "A" * 42 + "%0a"])
def test_a_link_that_is_not_ours_is_a_404_that_changes_nothing(app, logged_in, purpose, token):
    emailaddress.new_verify_token(alice())
    for method in ("get", "post"):
        response = getattr(logged_in, method)(f"/email/{purpose}/{token}")
        assert response.status_code == 404
        assert "This link is not one this service sent" in page(response) and token not in page(response)
    assert alice().email_verified_at is None and EmailToken.get().used_at is None


def test_a_used_voided_or_expired_link_says_which_and_changes_nothing(app, client, smtp):
    bob = sign_up(client)
    first = link_of(delivered(app, smtp, 1)[0])
    assert client.post("/settings/profile/email/verify").status_code == 302
    second = link_of(delivered(app, smtp, 2)[1])
    (EmailToken.update(expires_at=utcnow() - datetime.timedelta(seconds=1))
     .where(EmailToken.token_hash == emailtokens.hashed(second.rsplit("/", 1)[1])).execute())
    for path, status, sentence in [(first, 410, "A newer link was sent since"),
                                   (second, 410, "This link has expired: it worked for 7 days.")]:
        for method in ("get", "post"):
            response = getattr(client, method)(path)
            assert response.status_code == status and sentence in page(response), (path, method)
            assert "Nothing was changed." in page(response) and "Send again" in page(response)
    assert User.get_by_id(bob.id).email_verified_at is None
    assert EmailToken.select().where(EmailToken.used_at.is_null(False)).count() == 0


def test_send_again_mails_a_fresh_link_that_voids_the_older_and_stops_at_the_cap(app, logged_in, smtp):
    paths = []
    for n in range(1, emailaddress.MAILS_PER_HOUR + 1):
        response = logged_in.post("/settings/profile/email/verify")
        assert (response.status_code, response.headers["Location"]) == (302, "/settings/profile")
        assert ("A new link was mailed to alice@example.com. It works for 7 days; the earlier ones no longer do."
                in flashes(logged_in.get("/settings/profile")))
        paths.append(link_of(delivered(app, smtp, n)[-1]))
    refused = logged_in.post("/settings/profile/email/verify")
    assert refused.status_code == 429
    assert "3 links were mailed in the last hour; use the newest, or try again later." in flashes(refused)
    assert len(delivered(app, smtp, 3)) == 3 and MailMessage.select().count() == 3
    assert [logged_in.get(path).status_code for path in paths] == [410, 410, 200]


def test_send_again_counts_against_the_ip_allowance(app, logged_in, smtp, monkeypatch):
    monkeypatch.setattr(throttles, "LOGIN_FAILURES_PER_IP", RateLimitItemPerMinute(1))
    assert logged_in.post("/settings/profile/email/verify").status_code == 302
    refused = logged_in.post("/settings/profile/email/verify")
    assert refused.status_code == 429 and int(refused.headers["Retry-After"]) > 0
    assert "Too many requests from this address." in page(refused)
    assert MailMessage.select().count() == 1
    other_ip = logged_in.post("/settings/profile/email/verify", environ_base={"REMOTE_ADDR": "10.0.0.9"})
    assert other_ip.status_code == 302


def test_a_confirmed_address_is_not_sent_a_link(app, logged_in):
    User.update(email_verified_at=utcnow()).execute()
    profile = page(logged_in.get("/settings/profile"))
    assert "Verified" in profile and "Send again" not in profile
    response = logged_in.post("/settings/profile/email/verify")
    assert response.status_code == 400 and "Your address is already confirmed." in flashes(response)
    assert MailMessage.select().count() == 0


@pytest.mark.parametrize("path", ["/settings/profile/email/verify", "/settings/profile/email"])
def test_the_forms_need_a_log_in(client, path):
    response = client.post(path, data={"password": PASSWORD, "email": "new@example.com"})
    assert (response.status_code, response.headers["Location"]) == (302, f"/login?next={path}")
    assert MailMessage.select().count() == 0


def ask_change(client, email="New@Example.com", password=PASSWORD, **options):
    return client.post("/settings/profile/email", data={"password": password, "email": email}, **options)


def test_a_change_mails_the_new_address_a_link_and_the_old_a_notice_and_acts_when_followed(app, logged_in, smtp):
    response = ask_change(logged_in)
    assert (response.status_code, response.headers["Location"]) == (302, "/settings/profile")
    profile = logged_in.get("/settings/profile")
    assert flashes(profile) == ["A link was mailed to new@example.com: your address changes when it is followed, "
                                "within 24 hours, logged in as alice. A notice went to alice@example.com."]
    assert "A link was mailed to <strong>new@example.com</strong>" in page(profile)
    assert alice().email == "alice@example.com" and events("user.email_change_requested") == ["to new@example.com"]
    [link] = delivered(app, smtp, 1, to="new@example.com")
    [notice] = delivered(app, smtp, 1, to="alice@example.com")
    assert link.subject == "Confirm your new email address" and "alice" in link.text
    assert notice.subject == "Your email address is being changed" and "new@example.com" in notice.text
    assert "http" not in notice.text and "href" not in notice.html  # nothing there acts on the change
    path = link_of(link)
    for _ in range(2):
        shown = logged_in.get(path)
        assert shown.status_code == 200 and "Use this address" in page(shown) and "new@example.com" in page(shown)
    assert alice().email == "alice@example.com" and events("user.email_changed") == []
    done = logged_in.post(path)
    assert (done.status_code, done.headers["Location"]) == (302, "/settings/profile")
    assert "Your address is now new@example.com. A notice went to alice@example.com." in flashes(
        logged_in.get("/settings/profile"))
    assert alice().email == "new@example.com" and alice().email_verified_at is not None
    assert events("user.email_changed") == ["from alice@example.com to new@example.com"]
    [_, changed] = delivered(app, smtp, 2, to="alice@example.com")
    assert changed.subject == "Your email address was changed" and "new@example.com" in changed.text
    assert "http" not in changed.text and "href" not in changed.html
    again = logged_in.post(path)
    assert again.status_code == 410 and "This link was used already" in page(again)


def test_a_wrong_password_asks_for_nothing_and_counts_as_a_failed_log_in(app, logged_in, smtp):
    for _ in range(throttles.LOGIN_FAILURES_PER_USERNAME_AND_IP.amount):
        response = ask_change(logged_in, password="not the password")
        assert response.status_code == 400 and "The password is not correct." in flashes(response)
    throttled = ask_change(logged_in)
    assert throttled.status_code == 429 and "Too many wrong passwords." in flashes(throttled)[0]
    assert EmailToken.select().count() == 0 and MailMessage.select().count() == 0
    assert events("user.email_change_requested") == []


@pytest.mark.parametrize("email, sentence", [
    ("new@example.com\r\nBcc: eve@example.com", "cannot contain control characters"),
    ("new@example.com\nBcc: eve@example.com", "cannot contain control characters"),
    ("Eve <eve@example.com>", "does not look like an email address"),
    ("new@example.com,eve@example.com", "does not look like an email address"),
    ("new,eve@example.com", "That address cannot be mailed"),
    ('"eve"@example.com', "That address cannot be mailed"),
    ("eve@example.com.", "That address cannot be mailed"),
    ("eve@example..com", "That address cannot be mailed"),
    ("x" * 250 + "@example.com", "does not look like an email address"),
    ("", "does not look like an email address"),
    ("alice@example.com", "That is already your address."),
])
def test_an_address_no_mail_may_go_to_is_refused_and_nothing_is_sent(app, logged_in, email, sentence):
    response = ask_change(logged_in, email)
    assert response.status_code == 400 and sentence in flashes(response)[0]
    assert EmailToken.select().count() == 0 and MailMessage.select().count() == 0
    assert events("user.email_change_requested") == []


def test_another_accounts_address_is_answered_as_any_other_and_refused_when_followed(app, logged_in, smtp):
    users.create_user("bob", "bob@example.com", "another long password")
    free, taken = ask_change(logged_in, "free@example.com"), ask_change(logged_in, "bob@example.com")
    assert free.status_code == taken.status_code == 302
    said = flashes(logged_in.get("/settings/profile"))
    assert [sentence.replace("free@", "bob@") for sentence in said[:1]] == said[1:]
    [link] = delivered(app, smtp, 1, to="bob@example.com")
    assert len(delivered(app, smtp, 2, to="alice@example.com")) == 2  # a notice for each
    path = link_of(link)
    for method in ("get", "post"):
        response = getattr(logged_in, method)(path)
        assert response.status_code == 409 and "That address now belongs to another account" in page(response)
    assert alice().email == "alice@example.com" and events("user.email_changed") == []


def test_the_answer_does_not_tell_a_free_address_from_a_taken_one(app, logged_in):
    users.create_user("bob", "bob@example.com", "another long password")
    answers = []
    for email in ("bob@example.com", "zed@example.com"):
        response = ask_change(logged_in, email, follow_redirects=True)
        # Less the pending change's expiry, to the microsecond.
        answers.append((response.status_code, re.sub(r"<time.*?</time>", "", page(response).replace(email, "ADDRESS"))))
        EmailToken.delete().execute()  # the pending change's line, and the cap, start afresh
    assert answers[0] == answers[1]


def test_a_change_link_needs_the_accounts_own_log_in(app, client, logged_in, smtp):
    ask_change(logged_in)
    path = link_of(delivered(app, smtp, 1, to="new@example.com")[0])
    client.post("/logout")
    g.pop("csrf_token", None)
    shown = client.get(path)
    assert shown.status_code == 200 and f'href="/login?next={path}"' in page(shown)
    assert "Use this address" not in page(shown)
    response = client.post(path)
    assert (response.status_code, response.headers["Location"]) == (302, f"/login?next={path}")
    users.create_user("bob", "bob@example.com", "another long password")
    client.post("/login", data={"username": "bob", "password": "another long password"})
    for method in ("get", "post"):
        response = getattr(client, method)(path)
        assert response.status_code == 403 and "This link belongs to another account" in page(response)
    assert alice().email == "alice@example.com" and User.get(User.username == "bob").email == "bob@example.com"
    client.post("/logout")
    client.post("/login", data={"username": "alice", "password": PASSWORD})
    assert client.post(path).status_code == 302 and alice().email == "new@example.com"


def test_asking_for_changes_is_capped_per_account(app, logged_in, smtp):
    for n in range(emailaddress.MAILS_PER_HOUR):
        assert ask_change(logged_in, f"new{n}@example.com").status_code == 302
    refused = ask_change(logged_in, "one-more@example.com")
    assert refused.status_code == 429
    assert "3 changes were asked for in the last hour; use the newest link, or try again later." in flashes(refused)
    assert MailMessage.select().count() == 2 * emailaddress.MAILS_PER_HOUR


def test_asking_for_changes_counts_against_the_ip_allowance(app, logged_in, monkeypatch):
    monkeypatch.setattr(throttles, "LOGIN_FAILURES_PER_IP", RateLimitItemPerMinute(2))
    assert ask_change(logged_in, "one@example.com").status_code == 302
    assert ask_change(logged_in, "two@example.com").status_code == 302
    assert ask_change(logged_in, "three@example.com").status_code == 429
    assert MailMessage.select().count() == 4


def test_with_mail_off_no_link_is_made_and_the_forms_say_why(make_app, database_url):
    app = make_app({"DATABASE_URL": database_url, "RATELIMIT_STORAGE_URL": "memory://", "TESTING": True,
                    "WTF_CSRF_ENABLED": False, "MAIL_URL": "off"})
    with app.app_context():
        client = app.test_client()
        sign_up(client)
        assert EmailToken.select().count() == 0
        profile = page(client.get("/settings/profile"))
        assert "This service sends no mail" in profile and "Send again" not in profile and "New email" not in profile
        for path in ("/settings/profile/email/verify", "/settings/profile/email"):
            response = client.post(path, data={"password": "long enough pass", "email": "new@example.com"})
            assert response.status_code == 400 and "This service sends no mail" in flashes(response)[0]
        assert EmailToken.select().count() == 0


def test_a_link_s_form_needs_the_csrf_token(app, client, smtp):
    sign_up(client)
    path = link_of(delivered(app, smtp, 1)[0])
    app.config["WTF_CSRF_ENABLED"] = True
    response = client.post(path, headers={"Accept": "text/html"})
    assert response.status_code == 400 and "CSRF" in page(response)
    assert User.get(User.username == "bob").email_verified_at is None
