"""The recovery codes' page in headless Chromium against the real server (the Procfile's gunicorn),
its Content-Security-Policy enforced: "Copy" puts the ten codes shown on the clipboard and says
"Copied", from the keyboard and the mouse, or leaves them selected for Ctrl+C when the clipboard
does not answer; "Download" saves them as recovery-codes-<username>.txt, made from the page (a
data: address, never asked of the server), with the page's script or without; at 390 and 1280 px,
nothing wider than the page and nothing axe-core finds."""

import itertools
from pathlib import Path
from pprint import pformat

import pytest
from browsing import (
    AXE,
    COPY_DEADLINE_MS,
    DESKTOP,
    PHONE,
    TOO_WIDE,
    axe_violations,
    csp_refusals,
    expect_clipboard,
    require,
    sign_up,
    turn_on_two_factor,
)

try:
    from playwright.sync_api import expect
except ImportError:
    pass

usernames = (f"{name}{n}" for n in itertools.count() for name in ("rita", "sam"))
# A clipboard whose promise never settles while the synchronous copy is refused.
STUCK_CLIPBOARD = """document.execCommand = () => false;
Object.defineProperty(Navigator.prototype, 'clipboard', {get: () => ({writeText: () => new Promise(() => {})})});"""


# Every code this module's pages showed: none may reach the server's log.
shown = []


@pytest.fixture(scope="module")
def server_log_check():
    def no_code_logged(output):
        assert shown and not any(code in output for code in shown)
    return no_code_logged


def codes_page(open_page, viewport, **options):
    """A page of a fresh context, the CSP enforced and the clipboard allowed; what the CSP refused
    in page.blocked."""
    page = open_page(viewport, bypass_csp=False, accept_downloads=True, **options)
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    page.blocked = csp_refusals(page)
    return page


def downloaded(page, link, username):
    """Follow the Download link; return the file's lines, once its name is checked."""
    with page.expect_download() as download:
        link()
    assert download.value.suggested_filename == f"recovery-codes-{username}.txt"
    assert download.value.url.startswith("data:text/plain")
    return Path(download.value.path()).read_text(encoding="utf-8").splitlines()


def assert_codes_file(lines, codes, username):
    shown.extend(codes)
    assert username in lines[0] and lines[-len(codes):] == codes
    assert [line for line in lines if line in codes] == codes


@pytest.mark.parametrize("viewport", [PHONE, DESKTOP], ids=["390px", "1280px"])
def test_copy_and_download_give_the_codes_shown_from_the_keyboard_and_the_mouse(open_page, viewport):
    page = codes_page(open_page, viewport)
    username = next(usernames)
    sign_up(page, username)
    codes = turn_on_two_factor(page)
    assert len(set(codes)) == 10

    # The keyboard: from the codes, Tab reaches Copy, Enter copies; Tab again reaches Download.
    # Copy is hidden until the deferred script shows it: Tab before then would skip it.
    expect(page.get_by_role("button", name="Copy")).to_be_visible()
    page.locator("#recovery-codes").focus()
    page.keyboard.press("Tab")
    expect(page.get_by_role("button", name="Copy")).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.get_by_role("button", name="Copied")).to_be_visible(timeout=COPY_DEADLINE_MS)
    expect(page.get_by_role("button", name="Copied")).to_be_focused()
    expect_clipboard(page, "\n".join(codes))
    page.keyboard.press("Tab")
    expect(page.get_by_role("link", name="Download")).to_be_focused()
    assert_codes_file(downloaded(page, lambda: page.keyboard.press("Enter"), username), codes, username)

    # The mouse, with something else on the clipboard meanwhile.
    page.evaluate("navigator.clipboard.writeText('something else')")
    page.get_by_role("button", name="Copied").click()
    expect_clipboard(page, "\n".join(codes))
    assert_codes_file(downloaded(page, page.get_by_role("link", name="Download").click, username), codes, username)
    assert page.blocked == []
    assert codes == page.locator(".recovery-code").all_inner_texts()  # the page, untouched


def test_without_a_clipboard_copy_leaves_the_codes_selected_for_ctrl_c(open_page):
    page = codes_page(open_page, DESKTOP)
    sign_up(page, next(usernames))
    page.add_init_script(STUCK_CLIPBOARD)
    codes = turn_on_two_factor(page)
    page.get_by_role("button", name="Copy").click()
    expect(page.get_by_role("button", name="Selected: press Ctrl+C")).to_be_visible(timeout=COPY_DEADLINE_MS)
    expect(page.locator("#recovery-codes")).to_be_focused()
    selected = page.evaluate("getSelection().toString()")
    assert [line.strip() for line in selected.splitlines() if line.strip()] == codes


def test_without_the_script_download_still_works_and_copy_is_not_offered(open_page):
    page = codes_page(open_page, DESKTOP, java_script_enabled=False)
    username = next(usernames)
    sign_up(page, username)
    codes = turn_on_two_factor(page)
    expect(page.get_by_role("button", name="Copy")).to_have_count(0)
    assert_codes_file(downloaded(page, page.get_by_role("link", name="Download").click, username), codes, username)


@pytest.mark.parametrize("viewport", [PHONE, DESKTOP], ids=["390px", "1280px"])
def test_the_codes_page_fits_and_axe_finds_nothing(open_page, viewport):
    require(AXE.exists(), "axe-core is not installed (npm ci --prefix tests/axe)")
    page = open_page(viewport)
    sign_up(page, next(usernames))
    turn_on_two_factor(page)
    expect(page.get_by_role("button", name="Copy")).to_be_visible()
    problems = page.evaluate(TOO_WIDE) + axe_violations(page)
    page.get_by_role("button", name="Copy").click()
    expect(page.get_by_role("button", name="Copied")).to_be_visible(timeout=COPY_DEADLINE_MS)
    problems += page.evaluate(TOO_WIDE) + axe_violations(page)
    assert not problems, pformat(problems, width=120)
