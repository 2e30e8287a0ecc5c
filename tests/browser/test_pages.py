"""Every page a user can reach, in headless Chromium against the real server (the Procfile's gunicorn):
axe-core (WCAG 2.2 AA and best practice, target size included) finds nothing at 390 and 1280 px; at
390 px nothing is wider than the phone, no checkbox or radio button sits on another line than its
label, and an endpoint's path wraps only at a slash; at both sizes key rows, buttons, charts and
totals line up."""

import itertools
import time
from pprint import pformat

import pyotp
import pytest
import requests
from browsing import AXE, DESKTOP, PATH_BROKEN, PATHS, PHONE, TOO_WIDE, axe_violations, create_key, require, sign_up
from webhookreceiver import receiving

try:
    from playwright.sync_api import expect
except ImportError:
    pass

usernames = (f"{name}{n or ''}" for n in itertools.count() for name in ("dana", "erin", "finn", "gale"))
SHOWN_IN_DOCS = "Security tab with a new key's secret"
# How long a test event's first attempt may take to show on a loaded machine (the contract: 5 s).
ATTEMPT_DEADLINE_MS = 30_000


@pytest.fixture(scope="module")
def receiver():
    """A webhook receiver the Security tab's endpoints point at, for the module's server."""
    with receiving() as receiver:
        yield receiver


@pytest.fixture(scope="module")
def server_settings(receiver):
    return {"WEBHOOK_ALLOW_PRIVATE": "1"}


@pytest.fixture(scope="module")
def server(server, receiver):
    """The module's server, with server.receiver."""
    server.receiver = receiver
    return server


def new_context(browser, server, viewport):
    """A fresh browser context at the viewport's size. http://localhost is a secure context, where
    passkeys can be added; the CSP is bypassed so that axe-core can be injected."""
    return browser.new_context(base_url=server.base.replace("127.0.0.1", "localhost"), viewport=viewport,
                               bypass_csp=True)


@pytest.fixture
def open_page(browser, server):
    """open_page(viewport): a page of a fresh browser context (new_context)."""
    contexts = []

    def open_page(viewport):
        contexts.append(new_context(browser, server, viewport))
        return contexts[-1].new_page()

    yield open_page
    for context in contexts:
        context.close()


@pytest.fixture(scope="module")
def walks(browser, server, screenshots):
    """walks(viewport): what one walk through every page at that size found, {"axe": {page: violations},
    "layout": {page: problems}} (walk's). Each size is walked once a module, for axe-core's test and
    the layout test of that size: a walk that failed fails each test that asks for it."""
    walked, contexts = {}, []

    def walks(viewport):
        if viewport["width"] not in walked:
            contexts.append(new_context(browser, server, viewport))
            try:
                walked[viewport["width"]] = walk(contexts[-1].new_page(), server, screenshots)
            except Exception as error:
                walked[viewport["width"]] = error
        if isinstance(walked[viewport["width"]], Exception):
            raise walked[viewport["width"]]
        return walked[viewport["width"]]

    yield walks
    for context in contexts:
        context.close()


def walk(page, server, screenshots):
    """Go to every page (every_page) at the page's size; return what axe-core found on each (unless
    axe-core is missing: None) and what that size's layout checks (LAYOUT) found."""
    check_layout = LAYOUT[page.viewport_size["width"]]
    found = {"axe": {} if AXE.exists() else None, "layout": {}}
    for name in every_page(page, server):
        page.wait_for_load_state("load")
        if problems := check_layout(page, name, screenshots):
            found["layout"][name] = problems
        if found["axe"] is not None and (violations := axe_violations(page)):
            found["axe"][name] = violations
    return found


def every_page(page, server):
    """Go to every page a user can reach, in every state worth a look; yield each one's name once it
    is shown. A new account each time, so the walk can be made at several sizes."""
    for path, name in [("/", "landing"), ("/docs", "API reference"), ("/login", "log-in"),
                       ("/signup", "sign-up"), ("/no-such-page", "page not found")]:
        page.goto(path)
        yield name
    username = next(usernames)
    sign_up(page, username)
    page.goto("/settings/profile")
    yield "profile"

    page.goto("/settings/members")
    yield "Members tab"
    page.get_by_label("Email address").fill(f"{username}.friend@example.com")
    page.get_by_role("button", name="Send invitation").click()
    expect(page.get_by_label("Invitation link")).to_be_visible()
    yield "Members tab with an invitation's link"

    page.goto("/settings/security")
    expect(page.get_by_role("heading", name=f"Create the first key of {username}")).to_be_visible()
    yield "Security tab without keys"

    page.get_by_role("button", name="Set up an authenticator app").click()
    secret = page.locator("[data-totp-secret]").get_attribute("data-totp-secret")
    yield "two-factor set-up"
    page.get_by_label("Code from the app").fill(pyotp.TOTP(secret).now())
    page.get_by_role("button", name="Turn on").click()
    expect(page.locator(".recovery-code")).to_have_count(10)
    yield "recovery codes"

    cdp = page.context.new_cdp_session(page)
    cdp.send("WebAuthn.enable")
    cdp.send("WebAuthn.addVirtualAuthenticator", {"options": {
        "protocol": "ctap2", "transport": "internal", "hasResidentKey": True, "hasUserVerification": True,
        "isUserVerified": True, "automaticPresenceSimulation": True}})
    page.goto("/settings/security")
    page.locator("#passkey-name").fill("Laptop")
    page.locator("#add-passkey").click()
    expect(page.locator(".passkey")).to_have_text("Laptop")

    create_key(page, "Old script")
    page.get_by_label("Name", exact=True).fill("Nightly report")
    page.get_by_label("Expires in").select_option("30d")
    page.get_by_label("usage:read").uncheck()
    page.get_by_label("Allowed IP addresses").fill("127.0.0.0/8\n::1")
    page.get_by_label("Requests in all").fill("500")
    page.get_by_label("Refill").fill("1000/month")
    page.get_by_role("button", name="Create New API Key").click()
    expect(page.get_by_text("This is the only time the secret is shown")).to_be_visible()
    yield "Security tab with a new key's secret"

    row = page.locator("table.keys tbody tr", has_text="Nightly report")
    row.get_by_text("Roll", exact=True).click()
    row.get_by_role("button", name="Roll the secret").click()
    key = page.get_by_label("Secret key").input_value()
    for path in ["/api/v1/protected/test"] * 3 + ["/api/v1/user/me", "/api/v1/usage/history"]:
        requests.get(server.base + path, headers={"X-API-Key": key}, timeout=5)
    row = page.locator("table.keys tbody tr", has_text="Old script")
    row.get_by_text("Revoke", exact=True).click()
    row.get_by_role("button", name="Yes, revoke").click()
    page.get_by_text("Revoked (1)").click()
    page.locator("table.keys tbody tr", has_text="Nightly report").get_by_text("Roll", exact=True).click()
    yield "Security tab with keys, a roll form open"

    page.get_by_role("navigation", name="Profile Settings").get_by_role("link", name="Webhooks").click()
    expect(page.get_by_role("heading", name=f"Webhooks of {username}")).to_be_visible()
    path = f"/{username}"
    page.get_by_label("Endpoint URL").fill(server.receiver.url + path)
    expect(page.get_by_role("radio", name="All events")).to_be_checked()
    expect(page.get_by_role("checkbox", name="usage.threshold")).to_be_hidden()
    page.get_by_role("radio", name="Chosen events").check()
    page.get_by_role("checkbox", name="key.revoked", exact=True).check()
    yield "Webhooks tab with the webhook form's chosen events"
    page.get_by_role("radio", name="All events").check()
    page.get_by_role("button", name="Add endpoint").click()
    expect(page.locator("#webhooks article.webhook .hint")).to_have_text("Events: all, including those added later")
    server.receiver.secrets[path] = page.get_by_label("Signing secret").input_value()
    yield "Webhooks tab with a webhook endpoint's secret"
    page.get_by_role("button", name="Send test event").click()
    expect(page.get_by_label("Signing secret")).to_have_count(0)  # shown once
    # The page's script shows the attempt once it is made (within a few seconds; more on a busy machine).
    expect(page.locator("#webhooks tr.attempt").first).to_contain_text("HTTP 204", timeout=ATTEMPT_DEADLINE_MS)
    [delivery] = server.receiver.received(path)
    assert delivery.error is None and delivery.verified["type"] == "webhook.test"
    yield "Webhooks tab with a webhook endpoint's attempts"
    article = page.locator("#webhooks article.webhook")
    article.locator("tr.attempt").first.get_by_role("button", name="Resend").click()
    expect(page.get_by_text(f"{delivery.message_id} is being sent again")).to_be_visible()
    article.get_by_text("Rotate secret", exact=True).click()
    article.get_by_label("The old secret signs too").select_option("1h")
    article.get_by_role("button", name="Rotate the secret").click()
    server.receiver.secrets[path] = page.get_by_label("Signing secret").input_value()
    expect(page.get_by_text("each delivery carries two signatures")).to_be_visible()
    yield "Webhooks tab with a rotated webhook secret"
    page.goto("/settings/webhooks")
    expect(article).to_contain_text("The secret was rotated: the old one signs each delivery too until")
    article.get_by_text("Recover failed messages", exact=True).click()
    yield "Webhooks tab with the webhook recover form open"

    page.goto("/settings/security")
    page.locator("table.keys tbody tr", has_text="Nightly report").get_by_role("link", name="Nightly report").click()
    chart = page.locator("figure", has=page.get_by_role("heading", name="Requests per hour, last 24 hours"))
    deadline = time.monotonic() + 60  # counts reach the page within a second (or a few, on a busy machine)
    while time.monotonic() < deadline:
        if chart.locator("svg rect.insufficient_scope").count():
            break
        page.wait_for_timeout(250)
        page.reload()
    expect(chart.locator("svg rect.success")).to_have_count(1)
    expect(chart.locator("svg rect.insufficient_scope")).to_have_count(1)
    # Four counted requests spent four credits; the 403 spent none.
    expect(page.locator("#credits")).to_contain_text("496 left; set to 1000 on the 1st of each month, next at")
    yield "a key's page"

    page.get_by_role("link", name="Try it in the playground").click()
    yield "playground"
    page.get_by_label("API key").fill(key)
    page.get_by_role("button", name="GET /api/v1/protected/test").click()
    expect(page.locator("#rest-status")).to_have_text("200 OK")
    yield "playground with an answer"

    page.get_by_role("button", name=f"Log out {username}").click()
    page.goto("/login")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill("a long password")
    page.get_by_role("button", name="Log in", exact=True).click()
    expect(page.get_by_label("Code from your authenticator app, or a recovery code")).to_be_visible()
    yield "log-in's second step"


# axe-core on 22 pages and states, walked once for this test and the layout test of its size.
@pytest.mark.timeout(360)
@pytest.mark.parametrize("viewport", [PHONE, DESKTOP], ids=["390px", "1280px"])
def test_axe_finds_nothing_on_any_page(walks, viewport):
    require(AXE.exists(), "axe-core is not installed (npm ci --prefix tests/axe)")
    found = walks(viewport)["axe"]
    assert not found, pformat(found, width=120)


# Each visible checkbox and radio button whose label's first letter is not on the box's line.
LABEL_APART = """() => {
  const apart = [];
  for (const input of document.querySelectorAll('input[type=checkbox], input[type=radio]')) {
    const box = input.getBoundingClientRect();
    // Chromium lays out a closed <details>'s content too, at a width it is never shown at.
    if (!box.width || input.closest('details:not([open])')) continue;
    const label = input.labels[0];
    if (!label) { apart.push(`${input.name}=${input.value} has no label`); continue; }
    const texts = [];
    const walker = document.createTreeWalker(label, NodeFilter.SHOW_TEXT);
    for (let node; (node = walker.nextNode());) if (node.data.trim()) texts.push(node);
    const after = texts.filter(node => input.compareDocumentPosition(node) & Node.DOCUMENT_POSITION_FOLLOWING);
    const text = after[0] || texts[texts.length - 1];
    const range = document.createRange();
    const start = text.data.search(/\\S/);
    range.setStart(text, start);
    range.setEnd(text, start + 1);
    const letter = range.getBoundingClientRect();
    if (!(letter.top < box.bottom && letter.bottom > box.top))
      apart.push(`“${label.textContent.trim()}”: box at y ${Math.round(box.top)},`
                 + ` label at y ${Math.round(letter.top)}`);
  }
  return apart;
}"""

# What should line up and does not: a key table row whose cells do not end on one line (a cell that is
# not a table cell), the key page's buttons of different heights, a chart alone in a part of its row,
# the account's totals of different widths.
MISALIGNED = """() => {
  const found = [];
  const box = e => e.getBoundingClientRect();
  for (const row of document.querySelectorAll('table.keys tbody tr')) {
    if (getComputedStyle(row).display !== 'table-row' || !box(row).height) continue;
    const bottoms = [...row.children].map(cell => Math.round(box(cell).bottom));
    if (new Set(bottoms).size > 1) found.push(`a key row's cells end at ${bottoms.join(', ')} px`);
  }
  const buttons = [...document.querySelectorAll('.key-actions > details > summary, .key-actions > a')];
  const heights = buttons.map(button => Math.round(box(button).height));
  if (new Set(heights).size > 1) found.push(`the key page's buttons are ${heights.join(', ')} px high`);
  for (const grid of document.querySelectorAll('.charts')) {
    const right = box(grid).right;
    const rows = new Map();
    for (const chart of grid.children) {
      const top = Math.round(box(chart).top);
      rows.set(top, Math.max(rows.get(top) || 0, box(chart).right));
    }
    for (const [top, end] of rows)
      if (end < right - 1) found.push(`a row of charts ends at ${Math.round(end)} of ${Math.round(right)} px`);
  }
  const widths = [...document.querySelectorAll('.totals > div')].map(card => Math.round(box(card).width));
  if (new Set(widths).size > 1) found.push(`the totals' cards are ${widths.join(', ')} px wide`);
  return found;
}"""


# A card's cell whose label (drawn over the cell's left side) reaches below its card: an empty cell
# is no higher than its padding unless the style makes it a line high.
LABEL_OUTSIDE = """() => {
  const found = [];
  for (const cell of document.querySelectorAll('table.cards td[data-label]')) {
    const card = cell.closest('tr');
    if (getComputedStyle(cell).display !== 'block' || !card.getBoundingClientRect().height) continue;
    const label = getComputedStyle(cell, '::before');
    const bottom = cell.getBoundingClientRect().top + parseFloat(getComputedStyle(cell).paddingTop)
      + parseFloat(label.height);
    const cardBottom = card.getBoundingClientRect().bottom;
    if (bottom > cardBottom + 0.5)
      found.push(`the label “${cell.dataset.label}” ends ${Math.round(bottom - cardBottom)} px below its card`);
  }
  return found;
}"""

# A secret shown once in a font where l, I and 1 may look alike.
PROPORTIONAL_SECRETS = """() => [...document.querySelectorAll('.copy-row textarea')]
  .filter(field => !/monospace/.test(getComputedStyle(field).fontFamily))
  .map(field => `#${field.id} is in ${getComputedStyle(field).fontFamily}`)"""


def phone_layout(page, name, screenshots):
    """What is wider than the phone, a box apart from its label, a path broken, misaligned, a card's
    label outside it or a secret in a proportional font on the page (and the docs' screenshot)."""
    if name == SHOWN_IN_DOCS:  # down to the list of keys
        bottom = page.evaluate(
            "document.getElementById('keys-heading').closest('section').getBoundingClientRect().bottom + scrollY")
        page.screenshot(path=screenshots / "phone-security-tab.png", full_page=True,
                        clip={"x": 0, "y": 0, "width": PHONE["width"], "height": bottom + 16})
    return (page.evaluate(TOO_WIDE) + page.evaluate(LABEL_APART) + page.evaluate(PATH_BROKEN, PATHS)
            + page.evaluate(MISALIGNED) + page.evaluate(LABEL_OUTSIDE) + page.evaluate(PROPORTIONAL_SECRETS))


def desktop_layout(page, name, screenshots):
    """What is misaligned or a secret in a proportional font on the page (and the docs' screenshot)."""
    if name == SHOWN_IN_DOCS:
        page.screenshot(path=screenshots / "security-tab.png", full_page=True)
    return page.evaluate(MISALIGNED) + page.evaluate(PROPORTIONAL_SECRETS)


# Each size's layout checks, by its width.
LAYOUT = {PHONE["width"]: phone_layout, DESKTOP["width"]: desktop_layout}


def test_every_page_fits_a_phone_with_labels_beside_their_boxes_and_paths_whole(walks):
    found = walks(PHONE)["layout"]
    assert not found, pformat(found, width=120)


def test_at_1280_px_key_rows_buttons_and_charts_line_up(walks):
    found = walks(DESKTOP)["layout"]
    assert not found, pformat(found, width=120)
