"""Debian's Chromium through Playwright: where it and axe-core are, the two sizes pages are looked at,
axe-core's findings, what is wider than the phone and paths that wrap elsewhere than at a slash, a
user's first steps on the pages (sign up, create a key, turn two-factor log-in on), what a copy
put on the clipboard, and what the Content Security Policy refused."""

import contextlib
import os
import re
import time

import pyotp
import services
from liveserver import ROOT

try:
    from playwright.sync_api import expect
except ImportError:
    pass

# Debian's Chromium: its headless shell (package chromium-headless-shell: the same engine without the
# browser's own windows, as Playwright itself runs headless) where installed, else the browser, which
# takes twice the CPU for the same tests (docs/development.md, "Browser tests").
CHROMIUMS = ["/usr/bin/chromium-headless-shell", "/usr/bin/chromium"]
CHROMIUM = next((path for path in CHROMIUMS if os.access(path, os.X_OK)), CHROMIUMS[0])
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
DOCS = ROOT / "docs"
AXE = ROOT / "tests" / "axe" / "node_modules" / "axe-core" / "axe.min.js"
CREATE = re.compile("Create New API Key|Create the first key")
PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1280, "height": 800}
# Where an endpoint's path is shown: the landing page's list, the reference's headings and contents,
# the playground's buttons.
PATHS = 'td[data-label="Path"] code, article.operation h3, article.socket h3, .toc a, button.call'
# What a person waits for at most after "Copy" on a loaded machine; the page answers at once.
COPY_DEADLINE_MS = 30_000
AXE_TAGS = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa", "wcag22aa", "best-practice"]


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


def csp_refusals(page):
    """The list that the page's console messages refusing something under the Content Security
    Policy are added to, as they come."""
    refused = []
    page.on("console", lambda message: "Content Security Policy" in message.text and refused.append(message.text))
    return refused


@contextlib.contextmanager
def strict_page(browser, **options):
    """A page of a fresh context (Playwright's options), the CSP enforced; once closed, nothing was
    refused under it."""
    context = browser.new_context(**options)
    page = context.new_page()
    refused = csp_refusals(page)
    yield page
    context.close()
    assert refused == []


def turn_on_two_factor(page):
    """From any page of a fresh log-in: set up an authenticator app on the Security tab and turn
    two-factor log-in on; return the recovery codes the page shows once."""
    page.goto("/settings/security")
    page.get_by_role("button", name="Set up an authenticator app").click()
    secret = page.locator("[data-totp-secret]").get_attribute("data-totp-secret")
    page.get_by_label("Code from the app").fill(pyotp.TOTP(secret).now())
    page.get_by_role("button", name="Turn on").click()
    expect(page.locator(".recovery-code")).to_have_count(10)
    return page.locator(".recovery-code").all_inner_texts()


def expect_clipboard(page, text):
    """Wait (up to COPY_DEADLINE_MS) until the context's clipboard, read from page, holds the text."""
    deadline = time.monotonic() + COPY_DEADLINE_MS / 1000
    while (held := page.evaluate("navigator.clipboard.readText()")) != text and time.monotonic() < deadline:
        page.wait_for_timeout(100)
    assert held == text


def painted(page):
    """Return once the page has loaded and drawn a frame since: between a navigation and the new
    page's first frame Chromium has nothing to copy, and a screenshot fails ("Unable to capture
    screenshot", once on a loaded machine)."""
    page.wait_for_load_state("load")
    page.evaluate("() => new Promise(drawn => requestAnimationFrame(() => requestAnimationFrame(drawn)))")


def create_key(page, name):
    """From Profile Settings: Security, Create New API Key; return the secret shown once."""
    page.get_by_role("navigation", name="Profile Settings").get_by_role("link", name="Security").click()
    page.get_by_label("Name", exact=True).fill(name)
    page.get_by_label("Production").check()
    page.get_by_role("button", name=CREATE).click()
    expect(page.get_by_text("This is the only time the secret is shown")).to_be_visible()
    # The page's script shows the Copy button in the same step as it makes "Try it in the
    # playground" hand the secret on: a click before then (a loaded machine) would hand on nothing.
    expect(page.locator("#copy-secret")).to_be_visible()
    return page.get_by_label("Secret key").input_value()


def axe_violations(page):
    """axe-core's violations on the page as it is (its context must bypass the CSP to let axe-core
    in): [(rule, impact, [target, ...]), ...]."""
    ran, violations = axe_run(page, AXE_TAGS)
    assert {"target-size", "scrollable-region-focusable", "color-contrast"} <= ran
    return violations


def axe_run(page, tags):
    """Run axe-core's rules of tags on the page as it is, injecting it unless the document has it
    already; return (the set of rules that ran, [(rule, impact, [target, ...]), ...] violated)."""
    require(AXE.exists(), "axe-core is not installed (npm ci --prefix tests/axe)")
    # A click that follows a link returns once the new page starts loading, before it has a <head>
    # to take the script (CI met "Cannot read properties of null (reading 'appendChild')").
    page.wait_for_load_state("load")
    if not page.evaluate("() => typeof axe === 'object'"):
        page.add_script_tag(path=str(AXE))
    ran, violations = page.evaluate(AXE_RUN, tags)
    return set(ran), [(rule, impact, targets) for rule, impact, targets in violations]


# axe-core's run, with only what axe_run returns leaving the page. Only violations are listed node
# by node: every node passed (thousands on the reference) cost a CSS selector each, and the whole
# result took longer to hand to Python than the rules took to run.
AXE_RUN = """async tags => {
  const result = await axe.run(document, {runOnly: {type: 'tag', values: tags}, resultTypes: ['violations']});
  const ran = ['passes', 'violations', 'incomplete', 'inapplicable']
    .flatMap(outcome => result[outcome].map(rule => rule.id));
  return [ran, result.violations.map(rule => [rule.id, rule.impact, rule.nodes.map(node => node.target)])];
}"""


class PageProblems(dict):
    """What each page looked at had wider than the phone or against axe-core, by the page's name:
    a test looks at every page of its path, then asserts that the dict is empty."""

    def look(self, page, name):
        page.wait_for_load_state("load")
        if problems := page.evaluate(TOO_WIDE) + axe_violations(page):
            self[name] = problems

# Elements wider than the phone, or reaching past its right edge, unless inside a box that clips them
# (a region meant to scroll sideways, or a visually hidden one) or a closed <details>; and boxes that scroll sideways
# without being meant to (not focusable: cut at the edge for a keyboard or a glance).
TOO_WIDE = """() => {
  const width = document.documentElement.clientWidth;
  const label = e => e.tagName.toLowerCase() + (e.id ? '#' + e.id : '') + [...e.classList].map(c => '.' + c).join('');
  const clipped = e => {
    for (let box = e.parentElement; box && box !== document.body; box = box.parentElement) {
      if (getComputedStyle(box).overflowX !== 'visible' && box.getBoundingClientRect().right <= width + 0.5)
        return true;
    }
    return false;
  };
  // Chromium lays out a closed <details>'s content too, at a width it is never shown at.
  const folded = e => e.closest('details:not([open])') && !e.closest('summary');
  const found = [];
  const pageWidth = document.documentElement.scrollWidth;
  if (pageWidth > width) found.push(`the page is ${pageWidth} px wide`);
  for (const e of document.body.querySelectorAll('*')) {
    if (folded(e)) continue;
    const box = e.getBoundingClientRect();
    if (box.width && box.right > width + 0.5 && !clipped(e))
      found.push(`${label(e)} reaches ${Math.round(box.right)} px`);
    const style = getComputedStyle(e);
    if (/auto|scroll/.test(style.overflowX) && e.scrollWidth > e.clientWidth + 1 && e.tabIndex < 0)
      found.push(`${label(e)} scrolls sideways (${e.scrollWidth} px in ${e.clientWidth}) but is not focusable`);
  }
  return found;
}"""


# Each visible path (PATHS) that goes to a new line anywhere but beside a slash or a "?", or at a space.
PATH_BROKEN = """selector => {
  const broken = [];
  for (const element of document.querySelectorAll(selector)) {
    if (!element.getBoundingClientRect().width) continue;
    const letters = [];
    const walker = document.createTreeWalker(element, NodeFilter.SHOW_TEXT);
    for (let node; (node = walker.nextNode());) {
      for (let i = 0; i < node.length; i++) {
        const range = document.createRange();
        range.setStart(node, i);
        range.setEnd(node, i + 1);
        const box = range.getClientRects()[0];
        if (box && box.width) letters.push({letter: node.data[i], top: box.top, bottom: box.bottom});
      }
    }
    for (let i = 1; i < letters.length; i++) {
      const [before, after] = [letters[i - 1], letters[i]];
      const newLine = after.top >= before.bottom - 1;
      if (newLine && !/[\\/?\\s]/.test(before.letter) && !/[\\/?\\s]/.test(after.letter))
        broken.push(`${letters.map(l => l.letter).join('')}`
                    + ` breaks after “${letters.slice(0, i).map(l => l.letter).join('')}”`);
    }
  }
  return broken;
}"""
