"""A user's path through the web application in headless Chromium (Debian's, driven by Python
Playwright) against the real server in both run modes (gunicorn, and `python app.py`'s fallback):
get a key, see it once, use it, revoke it; then the playground's REST calls, clock and echo; a
key's page with its charts at 1280 and 390 px; axe-core (WCAG 2.2 AA) on the Security tab and the
key page. With UPDATE_SCREENSHOTS=1 the run saves the screenshots of docs/web-app-and-keys.md to
docs/ (tests/browser/test_pages.py saves the two of the Security tab with a new secret); otherwise to a temporary
folder, so a test run leaves the checkout clean."""

import time

import pytest
import requests
from browsing import COPY_DEADLINE_MS, CREATE, axe_run, create_key, expect_clipboard, sign_up, strict_page
from contract import DOCUMENT

try:
    from playwright.sync_api import expect
except ImportError:
    pass

WCAG_22_AA = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa", "wcag22aa"]


@pytest.fixture(scope="module")
def server_mode(run_mode):
    return run_mode


@pytest.fixture
def page(browser, server):
    with strict_page(browser, base_url=server.base, viewport={"width": 1280, "height": 800}) as page:
        page.context.grant_permissions(["clipboard-read", "clipboard-write"])
        yield page


def protected_test(server, secret):
    return requests.get(server.base + "/api/v1/protected/test", headers={"X-API-Key": secret}, timeout=5)


def test_get_a_key_see_it_once_use_it_and_revoke_it(page, server):
    sign_up(page, "dana")
    secret = create_key(page, "Browser key")
    assert secret.startswith("sk_live_")
    page.get_by_role("button", name="Copy").click()
    expect(page.get_by_role("button", name="Copied")).to_be_visible(timeout=COPY_DEADLINE_MS)
    expect_clipboard(page, secret)

    assert protected_test(server, secret).status_code == 200
    page.reload()
    expect(page.locator("table.keys tbody tr", has_text="Browser key")).to_be_visible()
    expect(page.get_by_label("Secret key")).to_have_count(0)
    assert secret not in page.content()

    row = page.locator("table.keys tbody tr", has_text="Browser key")
    row.get_by_text("Revoke", exact=True).click()
    row.get_by_role("button", name="Yes, revoke").click()
    page.get_by_text("Revoked (1)").click()  # revoked keys are folded away
    revoked = page.locator("table.keys tbody tr", has_text="Browser key")
    expect(revoked.get_by_text("Revoked", exact=True)).to_be_visible()
    refused = protected_test(server, secret)
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "invalid_api_key"


def test_playground_calls_rest_ticks_the_clock_echoes_and_shows_a_refusal(page, screenshots):
    sign_up(page, "erin")
    secret = create_key(page, "Playground key")
    page.get_by_role("link", name="Try it in the playground").click()
    expect(page.get_by_label("API key")).to_have_value(secret)

    page.get_by_role("button", name="GET /api/v1/usage/stats").click()
    expect(page.locator("#rest-status")).to_have_text("200 OK")
    expect(page.locator("#rest-headers")).to_contain_text("x-ratelimit-remaining:")
    expect(page.locator("#rest-body")).to_contain_text('"api_key_name": "Playground key"')

    page.get_by_role("button", name="Open").click()
    expect(page.locator("#time-state")).to_have_text("Connected with key “Playground key”.")
    clock = page.locator("#clock")
    expect(clock).not_to_have_text("--:--:--")
    first = clock.text_content()
    expect(clock).not_to_have_text(first)

    page.get_by_label("Message").fill("hello from the browser")
    page.get_by_role("button", name="Send").click()
    expect(page.locator("#echo-log")).to_contain_text("hello from the browser")
    page.get_by_label("Message").fill("and again")
    page.get_by_role("button", name="Send").click()
    newest = page.locator("#echo-log li").first
    expect(newest).to_contain_text("and again")
    assert newest.evaluate("item => item.value") == 2  # newest first, numbered from the top down
    page.screenshot(path=screenshots / "playground.png", full_page=True)

    page.get_by_role("button", name="Close").click()
    expect(page.locator("#time-state")).to_have_text("Closed (code 1000).")
    page.get_by_label("API key").fill("sk_test_" + "x" * 40)
    page.get_by_role("button", name="Open").click()
    expect(page.locator("#time-state")).to_contain_text("Refused: the server did not accept this key")
    expect(clock).to_have_text("--:--:--")


def test_the_playground_keeps_a_key_typed_before_its_script_arrives(page):
    held = []
    sign_up(page, "finn")
    secret = create_key(page, "Typed early")
    page.route("**/static/playground.js", lambda route: held.append(route))  # late, as on a loaded machine
    page.goto("/playground", wait_until="commit")
    page.get_by_label("API key").fill(secret)
    call = page.get_by_role("button", name="GET /api/v1/usage/stats")
    # A button that does nothing until the script comes is never offered.
    expect(call).to_be_disabled()
    while not held:
        page.wait_for_timeout(50)
    held.pop().continue_()
    page.unroute("**/static/playground.js")
    call.click()
    expect(page.locator("#rest-status")).to_have_text("200 OK")
    expect(page.get_by_label("API key")).to_have_value(secret)


# Clipboards that answer badly: none at all (a page served over http from another host than
# localhost), and one whose promise never settles while the synchronous copy is refused.
NO_CLIPBOARD = "Object.defineProperty(Navigator.prototype, 'clipboard', {get: () => undefined});"
STUCK_CLIPBOARD = """document.execCommand = () => false;
Object.defineProperty(Navigator.prototype, 'clipboard', {get: () => ({writeText: () => new Promise(() => {})})});"""


def test_copy_and_try_it_are_offered_only_once_they_work(page):
    held = []
    # The page's script is late, as on a loaded machine.
    page.route("**/static/security.js", lambda route: held.append(route))
    sign_up(page, "kira")
    page.get_by_role("navigation", name="Profile Settings").get_by_role("link", name="Security").click()
    page.get_by_label("Name", exact=True).fill("Late script")
    page.get_by_role("button", name=CREATE).click()
    expect(page.get_by_text("This is the only time the secret is shown")).to_be_visible()
    expect(page.get_by_label("Secret key")).to_be_visible()
    # A button that does nothing until the script comes is never offered.
    expect(page.get_by_role("button", name="Copy")).to_have_count(0)
    # Nor a link that would open the playground without the key it promises.
    expect(page.get_by_role("link", name="Try it in the playground")).to_have_count(0)
    while not held:
        page.wait_for_timeout(50)
    held.pop().continue_()
    page.unroute("**/static/security.js")
    secret = page.get_by_label("Secret key").input_value()
    page.get_by_role("button", name="Copy").click()
    expect(page.get_by_role("button", name="Copied")).to_be_visible(timeout=COPY_DEADLINE_MS)
    expect_clipboard(page, secret)
    page.get_by_role("link", name="Try it in the playground").click()
    expect(page.get_by_label("API key")).to_have_value(secret)


@pytest.mark.parametrize("clipboard", [NO_CLIPBOARD, STUCK_CLIPBOARD], ids=["none", "never answers"])
def test_copy_answers_whatever_the_clipboard_does(page, clipboard):
    sign_up(page, f"lee{len(clipboard)}")
    page.add_init_script(clipboard)
    secret = create_key(page, "Copied by hand")
    page.get_by_role("button", name="Copy").click()
    field = page.get_by_label("Secret key")
    if clipboard == NO_CLIPBOARD:
        expect(page.get_by_role("button", name="Copied")).to_be_visible(timeout=COPY_DEADLINE_MS)
        reader = page.context.new_page()  # this context's clipboard, read where the API is left alone
        reader.goto("/")
        expect_clipboard(reader, secret)
    else:  # the secret is selected in its field, where Ctrl+C copies it
        expect(page.get_by_role("button", name="Selected: press Ctrl+C")).to_be_visible(timeout=COPY_DEADLINE_MS)
        expect(field).to_be_focused()
        assert field.evaluate("f => f.value.slice(f.selectionStart, f.selectionEnd)") == secret


PHONE = {"width": 390, "height": 844}


def fits(page, width):
    """The page's width in CSS pixels once laid out: no sideways scrolling when it is <= width."""
    page.wait_for_load_state("load")
    return page.evaluate("document.documentElement.scrollWidth") <= width


def test_every_page_fits_a_phone(browser, server):
    context = browser.new_context(base_url=server.base, viewport=PHONE)
    page = context.new_page()
    try:
        page.goto("/playground")
        expect(page.get_by_text("Log in first: that page belongs to your account.")).to_be_visible()
        for path in ("/", "/signup", "/login", "/no-such-page", "/docs"):
            page.goto(path)
            assert fits(page, PHONE["width"]), path
        username = "a_rather_long_username_x"
        page.goto("/signup")
        page.get_by_label("Username").fill(username)
        page.get_by_label("Email").fill("a.rather.long.email.address.for.a.phone@subdomain.example-domain.com")
        page.get_by_label("Password").fill("a long password")
        page.get_by_role("button", name="Create account").click()
        expect(page.get_by_role("heading", name="Profile Settings")).to_be_visible()
        assert fits(page, PHONE["width"]), "Security after sign-up"
        secret = create_key(page, "A key with a rather long name, to see it wrap on a phone")
        assert fits(page, PHONE["width"]), "Security with the new secret"
        assert page.get_by_label("Secret key").input_value() == secret
        page.reload()
        assert fits(page, PHONE["width"]), "Security with keys"
        row = page.locator("table.keys tbody tr", has_text="A key with a rather long name")
        row.get_by_text("Revoke", exact=True).click()
        expect(row.get_by_role("button", name="Yes, revoke")).to_be_in_viewport()
        page.goto("/playground")
        assert fits(page, PHONE["width"]), "playground"
    finally:
        context.close()


def test_the_api_reference_shows_every_endpoint_of_openapi_json(page):
    page.goto("/")
    page.get_by_role("link", name="API reference").click()
    expect(page.get_by_role("heading", name="API reference", level=1)).to_be_visible()
    operations = [(method.upper(), path, operation) for path, item in DOCUMENT["paths"].items()
                  for method, operation in item.items()]
    expect(page.locator("article.operation")).to_have_count(len(operations))
    contents = page.get_by_role("navigation", name="On this page")
    for method, path, operation in operations:
        article = page.locator(f'article.operation[data-method="{method}"][data-path="{path}"]')
        expect(article.get_by_role("heading", level=3)).to_have_text(f"{method} {path}")
        expect(article.locator(".summary")).to_have_text(operation["summary"])
        statuses = article.locator('td[data-label="Status"]')
        expect(statuses).to_have_text(list(operation["responses"]))
        contents.get_by_role("link", name=f"{method} {path}").click()
        expect(article.get_by_role("heading", level=3)).to_be_in_viewport()


def test_change_the_password_and_delete_the_account(page, server):
    sign_up(page, "gale")
    page.get_by_role("navigation", name="Profile Settings").get_by_role("link", name="Profile").click()
    page.get_by_label("Current password").fill("a long password")
    page.get_by_label("New password").fill("an even longer password")
    page.get_by_role("button", name="Change password").click()
    expect(page.get_by_text("Your password is changed")).to_be_visible()
    page.get_by_text("Delete this account").click()
    page.get_by_label("Password", exact=True).fill("an even longer password")
    page.get_by_role("button", name="Yes, delete my account").click()
    expect(page.get_by_text("Your account is deleted")).to_be_visible()
    expect(page.get_by_role("navigation", name="Main").get_by_role("link", name="Log in")).to_be_visible()


def test_create_with_expiry_and_scopes_roll_and_revoke(page, server):
    sign_up(page, "hana")
    page.get_by_role("navigation", name="Profile Settings").get_by_role("link", name="Security").click()
    page.get_by_label("Name", exact=True).fill("Lifecycle key")
    page.get_by_label("Production").check()
    page.get_by_label("Expires in").select_option("30d")
    page.get_by_label("user:read").uncheck()
    page.get_by_label("usage:read").uncheck()
    page.get_by_role("button", name=CREATE).click()
    first = page.get_by_label("Secret key").input_value()
    row = page.locator("table.keys tbody tr", has_text="Lifecycle key")
    expect(row).to_contain_text("expires in 30 days")
    assert protected_test(server, first).status_code == 200
    me = requests.get(server.base + "/api/v1/user/me", headers={"X-API-Key": first}, timeout=5)
    assert me.status_code == 403 and me.json()["error"]["code"] == "insufficient_scope"

    row.get_by_text("Roll", exact=True).click()
    row.get_by_label("The current secret stops working").select_option("1h")
    row.get_by_role("button", name="Roll the secret").click()
    expect(page.get_by_text("The new secret of “Lifecycle key”")).to_be_visible()
    second = page.get_by_label("Secret key").input_value()
    assert second != first
    row = page.locator("table.keys tbody tr", has_text="Lifecycle key")
    expect(row).to_contain_text(f"previous secret {first[:12]}... valid until")
    assert protected_test(server, first).status_code == protected_test(server, second).status_code == 200
    expect(page.locator("table.log-table")).to_contain_text("key.rolled")

    row.get_by_role("link", name="Lifecycle key").click()
    expect(page.locator(".key-facts")).to_contain_text("test:read time:stream")
    page.get_by_text("Revoke", exact=True).click()
    page.get_by_role("button", name="Yes, revoke").click()
    page.get_by_text("Revoked (1)").click()
    row = page.locator("table.keys tbody tr", has_text="Lifecycle key")
    expect(row.get_by_text("Revoked", exact=True)).to_be_visible()
    expect(row).not_to_contain_text("previous secret")
    assert protected_test(server, first).status_code == protected_test(server, second).status_code == 401


def axe_violations(page):
    """axe-core's WCAG 2.2 AA violations on the page as it is: [(rule, [target, ...]), ...]."""
    return [(rule, targets) for rule, _, targets in axe_run(page, WCAG_22_AA)[1]]


def test_a_keys_page_charts_its_requests_by_outcome_at_1280_and_390_px(browser, server, screenshots):
    # The service's CSP allows no inline script: this context lets axe-core in, and nothing else differs.
    context = browser.new_context(base_url=server.base, viewport={"width": 1280, "height": 800}, bypass_csp=True)
    page = context.new_page()
    try:
        sign_up(page, "ivy")
        expect(page.get_by_role("heading", name="Create the first key of ivy")).to_be_visible()
        assert axe_violations(page) == []
        secret = create_key(page, "Charted key")
        statuses = [requests.get(server.base + path, headers={"X-API-Key": secret}, timeout=5).status_code
                    for path in ["/api/v1/protected/test"] * 3 + ["/api/v1/user/me", "/api/v1/usage/stats"]]
        assert statuses == [200] * 5
        page.reload()
        page.get_by_role("link", name="Charted key").click()
        expect(page.get_by_role("heading", name="Charted key", level=2)).to_be_visible()
        hour = page.locator("figure", has=page.get_by_role("heading", name="Requests per hour, last 24 hours"))
        # Counts reach the page within a second or two of the requests (a flush may take some of them,
        # and a loaded machine longer). The last hour holds all five once the page shows them.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if hour.locator("svg rect.success").count() and "5" in hour.locator("table tbody tr").last.inner_text():
                break
            page.wait_for_timeout(250)
            page.reload()
        expect(hour.locator("svg rect.success")).to_have_count(1)
        expect(hour.locator("table tbody tr")).to_have_count(24)
        expect(hour.locator("table tbody tr").last).to_contain_text("5")
        endpoints = page.locator("figure", has=page.get_by_role("heading", name="By endpoint, last 24 hours"))
        expect(endpoints.locator("svg text").first).to_have_text("/api/v1/protected/test")
        assert axe_violations(page) == []
        page.screenshot(path=screenshots / "key-page.png", full_page=True)

        page.set_viewport_size(PHONE)
        wide = page.evaluate("""[...document.querySelectorAll('body *')]
            .filter(e => e.getBoundingClientRect().right > 390)
            .map(e => e.tagName + '.' + e.className + ' ' + Math.round(e.getBoundingClientRect().right)).slice(0, 8)""")
        assert fits(page, PHONE["width"]), f"key page: {wide}"
        box = hour.locator("svg").bounding_box()
        assert 300 <= box["width"] <= PHONE["width"]
        assert axe_violations(page) == []
        page.screenshot(path=screenshots / "phone-key-page.png", full_page=True)
        page.get_by_role("link", name="Security", exact=True).first.click()
        assert fits(page, PHONE["width"]), "Security"
        assert axe_violations(page) == []
        page.screenshot(path=screenshots / "phone-security-keys.png", full_page=True)
        page.set_viewport_size({"width": 1280, "height": 800})
        page.screenshot(path=screenshots / "security-keys.png", full_page=True)
    finally:
        context.close()
