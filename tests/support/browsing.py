"""Debian's Chromium through Playwright: where it and axe-core are, and a user's first steps on the
pages (sign up, create a key)."""

import re

import services
from liveserver import ROOT

try:
    from playwright.sync_api import expect
except ImportError:
    pass

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
DOCS = ROOT / "docs"
AXE = ROOT / "tests" / "axe" / "node_modules" / "axe-core" / "axe.min.js"
CREATE = re.compile("Create New API Key|Create your first key")


def require(ready, reason):
    """Skip when part of the browser stack is missing; under CI=true that is a failure instead."""
    if not ready:
        services.unavailable(reason)


def sign_up(page, username):
    page.goto("/")
    page.get_by_role("link", name="Sign up").first.click()
    page.get_by_label("Username").fill(username)
    page.get_by_label("Email").fill(f"{username}@example.com")
    page.get_by_label("Password").fill("a long password")
    page.get_by_role("button", name="Create account").click()
    expect(page.get_by_role("heading", name="Profile Settings")).to_be_visible()


def create_key(page, name):
    """From Profile Settings: Security, Create New API Key; return the secret shown once."""
    page.get_by_role("navigation", name="Profile Settings").get_by_role("link", name="Security").click()
    page.get_by_label("Name", exact=True).fill(name)
    page.get_by_label("Production").check()
    page.get_by_role("button", name=CREATE).click()
    expect(page.get_by_text("This is the only time the secret is shown")).to_be_visible()
    return page.get_by_label("Secret key").input_value()
