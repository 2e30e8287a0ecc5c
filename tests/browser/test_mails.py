"""Every mail's HTML part in headless Chromium, filled with the longest values a user can give (a
100-character key name without a space, a 254-character address, a long link): nothing wider than
a phone's screen or a desktop window, and nothing axe-core finds."""

from pprint import pformat

import pytest
from browsing import DESKTOP, PHONE, TOO_WIDE, axe_violations

from app import close_app, create_app
from mail import outbox

LONG_ADDRESS = "a" * 64 + "@" + "b" * 180 + ".example.com"
CONTEXT = {
    "username": "a-username-of-32-characters-long",
    "link": "https://api.example.com/password/reset/" + "T" * 21 + "-" + "t" * 21,
    "key": {"key_id": 123456, "key_name": "K" * 100, "key_prefix": "sk_live_AbC4",
            "expires_at": "2026-12-02T10:00:00Z", "source": "github",
            "url": "https://github.com/" + "o" * 39 + "/" + "r" * 100},
    "detail": "P" * 64,
    "email": LONG_ADDRESS,
    "new_email": LONG_ADDRESS,
    "server": "smtp://smtp.example.com:587",
}


@pytest.fixture(scope="module")
def mails(tmp_path_factory):
    """{name: the HTML part} of every mail the service sends."""
    app = create_app({"DATABASE_URL": f"sqlite:///{tmp_path_factory.mktemp('mails')}/mails.db"})
    try:
        with app.test_request_context("/"):
            yield {name: outbox.render(name, **CONTEXT)[1] for name in outbox.SUBJECTS if name != "invitation"}
    finally:
        close_app(app)


@pytest.mark.parametrize("viewport", [PHONE, DESKTOP], ids=["390px", "1280px"])
def test_every_mail_fits_the_screen_and_axe_finds_nothing(browser, mails, viewport):
    context = browser.new_context(viewport=viewport)
    page = context.new_page()
    found = {}
    try:
        for name, html in mails.items():
            page.set_content(html)
            if problems := page.evaluate(TOO_WIDE) + axe_violations(page):
                found[name] = problems
    finally:
        context.close()
    assert found == {}, pformat(found)
