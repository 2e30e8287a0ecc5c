"""The forgotten password in headless Chromium against the real server (the Procfile's gunicorn),
its mail through a real SMTP server: from the log-in page's link to a new password typed twice (a
repetition that differs refused first), at 390 and 1280 px, each page within the window's width
and clean to axe-core (WCAG 2.2 AA and best practice)."""

import itertools
import re
from pprint import pformat

import pytest
from browsing import PageProblems, sign_up
from serverfixtures import mailing

try:
    from playwright.sync_api import expect
except ImportError:
    pass

PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1280, "height": 800}
LINK = re.compile(r"https?://[^/\s]+(/password/reset/[A-Za-z0-9_-]+)")
MISMATCH = "The two passwords differ: type the same new password in both fields."
usernames = (f"{name}{n}" for n in itertools.count() for name in ("hana", "ivo"))


@pytest.fixture(scope="module")
def server_settings(smtp):
    return mailing(smtp)


@pytest.mark.parametrize("viewport", [PHONE, DESKTOP], ids=["390px", "1280px"])
def test_from_the_login_page_to_a_new_password_every_page_fits_and_axe_finds_nothing(open_page, smtp, viewport):
    username = next(usernames)
    sign_up(open_page(viewport), username)
    page = open_page(viewport)
    found = PageProblems()

    page.goto("/login")
    page.get_by_role("link", name="Forgot your password?").click()
    expect(page.get_by_role("heading", name="Forgot your password?")).to_be_visible()
    found.look(page, "the request form")
    page.get_by_label("Email").fill(f"{username}@example.com")
    page.get_by_role("button", name="Mail me a link").click()
    expect(page.get_by_role("heading", name="Check your mail")).to_be_visible()
    found.look(page, "the answer")

    path = LINK.search(smtp.wait_for(1, to=f"{username}@example.com", subject="Reset your password")[0].text)[1]
    page.goto(path)
    expect(page.get_by_role("heading", name="Choose a new password")).to_be_visible()
    found.look(page, "the reset form")
    new, repeat = page.get_by_label("New password", exact=True), page.get_by_label("Repeat the new password")
    expect(new).to_be_focused()
    new.fill("a brand new passphrase")
    repeat.fill("a brand new passphrase!")
    page.get_by_role("button", name="Set the password").click()
    # Both are typed again (the page shows no password back): the focus on the first, the sentence
    # on the repetition, both described by it.
    expect(new).to_be_focused()
    expect(page.locator("#field-error")).to_have_text(MISMATCH)
    for field in (new, repeat):
        expect(field).to_have_attribute("aria-invalid", "true")
        expect(field).to_have_accessible_description(re.compile("^" + re.escape(MISMATCH)))
    found.look(page, "the reset form, the passwords differing")
    new.fill("a brand new passphrase")
    repeat.fill("a brand new passphrase")
    page.get_by_role("button", name="Set the password").click()
    expect(page.get_by_text("Your password is set")).to_be_visible()
    found.look(page, "the log-in page after the reset")

    page.goto(path)
    expect(page.get_by_role("heading", name="This link was used already")).to_be_visible()
    found.look(page, "a used link")
    page.goto("/login")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill("a brand new passphrase")
    page.get_by_role("button", name="Log in", exact=True).click()
    expect(page.get_by_role("heading", name="Profile Settings")).to_be_visible()
    assert not found, pformat(found, width=120)
