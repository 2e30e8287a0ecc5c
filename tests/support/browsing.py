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


# axe-core's rule sets: WCAG 2.2 AA and best practice (target size included).
AXE_TAGS = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa", "wcag22aa", "best-practice"]


def axe_violations(page):
    """axe-core's violations on the page as it is (its context must bypass the CSP to let axe-core
    in): [(rule, impact, [target, ...]), ...]."""
    require(AXE.exists(), "axe-core is not installed (npm ci --prefix tests/axe)")
    page.add_script_tag(path=str(AXE))
    result = page.evaluate("tags => axe.run(document, {runOnly: {type: 'tag', values: tags}})", AXE_TAGS)
    return [(violation["id"], violation["impact"], [node["target"] for node in violation["nodes"]])
            for violation in result["violations"]]


# What reaches past the right edge of the window: [description, ...].
TOO_WIDE = """() => {
  const width = document.documentElement.clientWidth;
  const found = [];
  if (document.documentElement.scrollWidth > width) found.push(`the page is ${document.documentElement.scrollWidth} px wide`);
  for (const e of document.body.querySelectorAll('*')) {
    const box = e.getBoundingClientRect();
    if (box.width && box.right > width + 0.5) found.push(`${e.tagName.toLowerCase()}${e.id ? '#' + e.id : ''} reaches ${Math.round(box.right)} px`);
  }
  return found;
}"""
