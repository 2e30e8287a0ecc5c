"""Refused forms in headless Chromium against the real server (the Procfile's gunicorn), mail on:
sign-up, log-in and the Profile tab's password, address and deletion forms each come back with the
focus on the field that is wrong, that field invalid and described by the sentence, which shows in
the window between the field's label and the field; at 390 and 1280 px, nothing wider than the page
and nothing axe-core finds (tests/browser/test_password_reset.py does the reset link's form)."""

import itertools
import re
from pprint import pformat

import pytest
from browsing import AXE, DESKTOP, PHONE, PageProblems, require
from serverfixtures import mailing

try:
    from playwright.sync_api import expect
except ImportError:
    pass

PASSWORD = "a long password"
COMMON = "That password is one of the most common passwords; choose another."
WRONG = "The password is not correct."
usernames = (f"{name}{n}" for n in itertools.count() for name in ("tara", "ugo"))


@pytest.fixture(scope="module")
def server_settings(smtp):
    return mailing(smtp)


def expect_refused(page, field_id, sentence, *also_invalid):
    """The focus on the field, invalid and described by the sentence shown (in the window) above it."""
    field = page.locator(f"#{field_id}")
    expect(field).to_be_focused()
    for invalid in [field_id, *also_invalid]:
        expect(page.locator(f"#{invalid}")).to_have_attribute("aria-invalid", "true")
        expect(page.locator(f"#{invalid}")).to_have_accessible_description(re.compile("^" + re.escape(sentence)))
    error = page.locator("#field-error")
    expect(error).to_have_text(sentence)
    expect(error).to_be_in_viewport()
    assert error.bounding_box()["y"] < field.bounding_box()["y"]


@pytest.mark.parametrize("viewport", [PHONE, DESKTOP], ids=["390px", "1280px"])
def test_each_refusal_focuses_the_field_that_is_wrong(open_page, viewport):
    require(AXE.exists(), "axe-core is not installed (npm ci --prefix tests/axe)")
    page = open_page(viewport)
    found = PageProblems()

    username = next(usernames)
    page.goto("/signup")
    expect(page.get_by_label("Username")).to_be_focused()
    page.get_by_label("Username").fill(username)
    page.get_by_label("Email").fill(f"{username}@example.com")
    page.get_by_label("Password").fill("iloveyou")
    page.get_by_role("button", name="Create account").click()
    expect_refused(page, "password", COMMON)
    expect(page.get_by_label("Username")).to_have_value(username)
    found.look(page, "sign-up with a common password")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Create account").click()
    expect(page.get_by_role("heading", name="Profile Settings")).to_be_visible()

    page.get_by_role("button", name=f"Log out {username}").click()
    page.goto("/login")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill("not the password")
    page.get_by_role("button", name="Log in", exact=True).click()
    expect_refused(page, "password", "The username or password is incorrect.", "username")
    found.look(page, "log-in with a wrong password")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in", exact=True).click()
    expect(page.get_by_role("heading", name="Profile Settings")).to_be_visible()

    page.goto("/settings/profile")
    expect(page.locator(":focus")).to_have_count(0)
    page.get_by_label("Current password").fill("not the password")
    page.get_by_label("New password").fill("a newer long password")
    page.get_by_role("button", name="Change password").click()
    expect_refused(page, "current-password", "The current password is not correct.")
    found.look(page, "a password change with a wrong current password")
    page.get_by_label("Current password").fill(PASSWORD)
    page.get_by_label("New password").fill("iloveyou")
    page.get_by_role("button", name="Change password").click()
    expect_refused(page, "new-password", COMMON)

    page.get_by_label("New email address").fill(f"{username}.new@example.com")
    page.get_by_label("Your password").fill("not the password")
    page.get_by_role("button", name="Send the link").click()
    expect_refused(page, "email-password", WRONG)
    expect(page.get_by_label("New email address")).to_have_value(f"{username}.new@example.com")
    found.look(page, "an address change with a wrong password")

    page.get_by_text("Delete this account").click()
    page.get_by_label("Password", exact=True).fill("not the password")
    page.get_by_role("button", name="Yes, delete my account").click()
    expect_refused(page, "delete-password", WRONG)
    found.look(page, "a deletion with a wrong password")
    assert not found, pformat(found, width=120)
