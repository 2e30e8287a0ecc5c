"""The browser every module of this folder drives, where the runs save their screenshots, the pages
opened on each module's `server` (tests/support/serverfixtures.py), and the SMTP server of the
modules that follow mails."""

import os

import pytest
from browsing import CHROMIUM, CHROMIUM_ARGS, DOCS, require
from mailserver import mail_server

try:
    from playwright.sync_api import expect, sync_playwright
except ImportError:
    sync_playwright = None


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory):
    """Where the module's tests save their screenshots: docs/ with UPDATE_SCREENSHOTS=1, else a
    temporary folder (of the module's: a walk shared by its tests saves there too)."""
    return DOCS if os.environ.get("UPDATE_SCREENSHOTS") == "1" else tmp_path_factory.mktemp("screenshots")


@pytest.fixture(scope="module")
def browser():
    require(sync_playwright is not None, "Python Playwright is not installed (pip install -r requirements-dev.txt)")
    require(os.access(CHROMIUM, os.X_OK), "Chromium is missing (apt-get install chromium-headless-shell)")
    # An expect() waits for its condition and returns once it holds: 30 s instead of Playwright's
    # 5 s, for a loaded machine (reset for the next module).
    expect.set_options(timeout=30_000)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()
    expect.set_options(timeout=None)


@pytest.fixture(scope="module")
def server(browser, server):
    """The module's server, started once the browser is there (a missing browser skips first)."""
    return server


@pytest.fixture
def open_page(browser, server):
    """open_page(viewport, **options): a page of a fresh browser context on the module's server (the
    CSP bypassed for axe-core unless options say bypass_csp=False; other options are Playwright's)."""
    contexts = []

    def open_page(viewport, **options):
        contexts.append(browser.new_context(base_url=server.base, viewport=viewport, **{"bypass_csp": True, **options}))
        return contexts[-1].new_page()

    yield open_page
    for context in contexts:
        context.close()


@pytest.fixture(scope="module")
def smtp():
    """One SMTP server for a module's mails (the module's server is started with its address)."""
    with mail_server() as server:
        yield server
