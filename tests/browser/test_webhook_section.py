"""The Webhooks tab's endpoints in headless Chromium against the real server: Send test event comes
back to its endpoint, gives way to a line while the test is on its way, and shows the attempt and
itself again without a reload (and on reload without script);
an endpoint's Edit form, Pause and Resume, fitting 390 and 1280 px with axe-core clean; on a phone,
an endpoint with 12 attempts shows its newest 5 and a page as short as with 5. With
UPDATE_SCREENSHOTS=1 it saves docs/webhooks-tab.png and docs/phone-webhooks-tab.png."""

import itertools
import threading
import time

import pytest
from browsing import DESKTOP, PHONE, PageProblems, painted, sign_up
from liveserver import wait_for
from webhookreceiver import receiving

try:
    from playwright.sync_api import expect
except ImportError:
    pass

usernames = (f"hook{n}" for n in itertools.count())
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


def add_endpoint(page, server):
    """Sign up, add an endpoint pointing at the receiver from the Security tab, and reload the tab
    (the secret's panel gone); return the endpoint's article."""
    username = next(usernames)
    sign_up(page, username)
    page.goto("/settings/webhooks")
    page.get_by_label("Endpoint URL").fill(f"{server.receiver.url}/{username}")
    page.get_by_role("button", name="Add endpoint").click()
    server.receiver.secrets[f"/{username}"] = page.get_by_label("Signing secret").input_value()
    page.goto("/settings/webhooks")
    return page.locator("article.webhook")


def test_send_test_event_stays_at_the_endpoint_and_shows_its_attempt_without_a_reload(open_page, server):
    page = open_page({**DESKTOP, "height": 500})  # a window the endpoint's article starts below
    article = add_endpoint(page, server)
    assert article.evaluate("a => a.getBoundingClientRect().top + scrollY") > 500  # below the fold
    loads = []
    page.on("load", lambda loaded: loads.append(loaded.url))
    # The receiver answers once the waiting event's status has been seen: on a slow machine the
    # attempt was recorded before the page came back, and the page rightly showed no status.
    status_seen, answer = threading.Event(), server.receiver.answer
    server.receiver.answer = lambda delivery: answer(delivery) if status_seen.wait(ATTEMPT_DEADLINE_MS / 1000) else 503
    try:
        article.get_by_role("button", name="Send test event").click()
        page.wait_for_load_state("load")
        endpoint_id = article.get_attribute("id")
        assert page.url.endswith(f"/settings/webhooks#{endpoint_id}")
        expect(article).to_be_focused()  # the next Tab goes on from the endpoint, not from the top
        expect(article.get_by_role("heading", level=3)).to_be_in_viewport()
        expect(article.get_by_role("status")).to_contain_text("A test event")
        # Not offered while the test is on its way (it would be refused): a line says why instead.
        expect(article.get_by_role("button", name="Send test event")).to_have_count(0)
        expect(article.locator(".waiting-test")).to_contain_text("A test event is on its way")
        status_seen.set()
    finally:
        server.receiver.answer = answer
    expect(article.locator("tr.attempt")).to_have_count(1, timeout=ATTEMPT_DEADLINE_MS)
    expect(article.locator("tr.attempt")).to_contain_text("webhook.test")
    expect(article.locator("tr.attempt")).to_contain_text("HTTP 204")
    expect(article.get_by_role("status")).to_have_count(0)
    expect(article.get_by_role("button", name="Send test event")).to_be_visible()
    expect(article.locator(".waiting-test")).to_have_count(0)
    assert len(loads) == 1, loads  # the redirect after the button, and no reload since
    expect(article.get_by_role("heading", level=3)).to_be_in_viewport()


def test_without_script_the_test_event_returns_to_the_endpoint_and_its_attempt_shows_on_reload(browser, server):
    context = browser.new_context(base_url=server.base, viewport={**DESKTOP, "height": 500}, java_script_enabled=False)
    try:
        page = context.new_page()
        article = add_endpoint(page, server)
        article.get_by_role("button", name="Send test event").click()
        assert page.url.endswith(f"/settings/webhooks#{article.get_attribute('id')}")
        expect(article.get_by_role("heading", level=3)).to_be_in_viewport()
        expect(article).to_be_focused()
        # Without script the page stays as drawn: a delivery quicker than the redirect already shows
        # its attempt, else the hint says to reload.
        if not article.locator("tr.attempt").count():
            expect(article).to_contain_text("reload the page if your browser runs no script")
        deadline = time.monotonic() + ATTEMPT_DEADLINE_MS / 1000
        while not article.locator("tr.attempt").count() and time.monotonic() < deadline:
            page.wait_for_timeout(250)
            page.reload()
        expect(article.locator("tr.attempt")).to_contain_text("HTTP 204")
        expect(article.get_by_role("button", name="Send test event")).to_be_visible()
    finally:
        context.close()


@pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=["1280px", "390px"])
def test_an_endpoint_is_edited_paused_and_resumed_through_forms_that_fit_and_pass_axe(open_page, server, screenshots,
                                                                                     viewport):
    page = open_page(viewport)
    article = add_endpoint(page, server)
    article.get_by_text("Edit", exact=True).click()
    painted(page)
    page.screenshot(path=screenshots / f"{'phone-' if viewport is PHONE else ''}webhooks-tab.png", full_page=True)
    expect(article.get_by_label("Endpoint URL")).to_have_value(article.locator("code.url").inner_text())
    problems = PageProblems()
    problems.look(page, "an endpoint's Edit form")
    article.get_by_role("radio", name="Chosen events").check()
    article.get_by_role("checkbox", name="key.revoked", exact=True).check()
    article.get_by_label("Description (optional)").fill("Revocations for the audit trail")
    article.get_by_role("button", name="Save changes").click()
    expect(page.get_by_role("status").first).to_contain_text("Changed events and description of the webhook endpoint.")
    expect(article).to_contain_text("Revocations for the audit trail")
    expect(article.locator("p.hint").first).to_have_text("Events: key.revoked")

    article.get_by_role("button", name="Pause").click()
    expect(article).to_contain_text("Paused by hook")
    expect(article.get_by_role("button", name="Send test event")).to_have_count(0)
    problems.look(page, "a paused endpoint")
    article.get_by_role("button", name="Resume").click()
    expect(article.get_by_role("button", name="Send test event")).to_be_visible()
    assert problems == {}


def send_tests(commands, endpoint_id, count):
    """Send count test events from the command line, each once the one before is no longer pending
    (should the server's sender have claimed it first, the next would be refused)."""
    for _ in range(count):
        commands("webhooks", "test", endpoint_id)
        wait_for(lambda: not commands("webhooks", "messages", endpoint_id, "--state", "pending"))


def test_on_a_phone_an_endpoint_with_many_attempts_shows_its_newest_five_and_stays_short(open_page, server, commands):
    page = open_page(PHONE)
    article = add_endpoint(page, server)
    endpoint_id = article.get_attribute("id").removeprefix("webhook-")
    send_tests(commands, endpoint_id, 5)
    page.reload()
    expect(article.locator("tr.attempt")).to_have_count(5)
    five = page.evaluate("document.documentElement.scrollHeight")
    send_tests(commands, endpoint_id, 7)
    page.reload()
    expect(article.locator("table.attempts").first.locator("tr.attempt")).to_have_count(5)
    older = article.locator("details.older-attempts")
    expect(older.locator("summary")).to_have_text("7 older attempts")
    expect(older.locator("tr.attempt")).to_have_count(7)
    expect(older.locator("tr.attempt").first).to_be_hidden()
    log = article.get_by_role("link", name="Message log")
    expect(log).to_be_visible()
    # Seven attempts more add the folded list's one line, not seven cards (each over 200 px here).
    twelve = page.evaluate("document.documentElement.scrollHeight")
    assert twelve - five < 100, (five, twelve)
    problems = PageProblems()
    problems.look(page, "an endpoint with 12 attempts")
    older.locator("summary").click()
    expect(older.locator("tr.attempt").first).to_be_visible()
    problems.look(page, "its older attempts unfolded")
    log.click()
    expect(page.locator("table.messages tbody tr")).to_have_count(12)
    assert problems == {}


@pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=["1280px", "390px"])
def test_the_message_log_and_a_message_fit_and_pass_axe(open_page, server, screenshots, viewport):
    page = open_page(viewport)
    article = add_endpoint(page, server)
    article.get_by_role("button", name="Send test event").click()
    expect(article.locator("tr.attempt")).to_contain_text("HTTP 204", timeout=ATTEMPT_DEADLINE_MS)
    article.get_by_role("link", name="Message log").click()
    expect(page.get_by_role("heading", level=2)).to_contain_text("Messages to")
    row = page.locator("table.messages tbody tr")
    expect(row).to_have_count(1)
    expect(row).to_contain_text("webhook.test")
    expect(row).to_contain_text("delivered")
    problems = PageProblems()
    problems.look(page, "the message log")
    prefix = "phone-" if viewport is PHONE else ""
    painted(page)
    page.screenshot(path=screenshots / f"{prefix}webhook-messages.png", full_page=True)
    row.locator("a.message-id").click()
    expect(page.locator("pre.body").first).to_contain_text('"type": "webhook.test"')
    expect(page.get_by_role("heading", name="Attempt 1,")).to_be_visible()
    expect(page.locator("section.attempt-detail")).to_contain_text("HTTP 204")
    problems.look(page, "a message")
    painted(page)
    page.screenshot(path=screenshots / f"{prefix}webhook-message.png", full_page=True)
    assert problems == {}
