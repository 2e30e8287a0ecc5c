"""Passkeys in headless Chromium against the real gunicorn server, with a virtual authenticator (the
DevTools Protocol's WebAuthn domain): register one on the Security tab, log in with it alone from
the log-in page, use it as the second factor after the password, remove it. Served and visited as
http://localhost, a secure context where the browser does WebAuthn."""

import re

import pytest
from browsing import sign_up, strict_page, turn_on_two_factor

try:
    from playwright.sync_api import expect
except ImportError:
    pass


@pytest.fixture
def page(browser, server):
    with strict_page(browser, base_url=server.base.replace("127.0.0.1", "localhost")) as page:
        yield page


def add_authenticator(page):
    """A platform authenticator that keeps discoverable credentials and verifies its user; return
    (the DevTools session, its id)."""
    cdp = page.context.new_cdp_session(page)
    cdp.send("WebAuthn.enable")
    added = cdp.send("WebAuthn.addVirtualAuthenticator", {"options": {
        "protocol": "ctap2", "transport": "internal", "hasResidentKey": True, "hasUserVerification": True,
        "isUserVerified": True, "automaticPresenceSimulation": True}})
    return cdp, added["authenticatorId"]


def log_out(page, username):
    page.get_by_role("button", name=f"Log out {username}").click()
    expect(page.get_by_role("link", name="Log in").first).to_be_visible()


def security_log(page):
    page.goto("/settings/security")
    return page.locator(".log-table").inner_text()


def test_a_passkey_registers_logs_in_alone_serves_as_second_factor_and_is_removed(page):
    cdp, authenticator = add_authenticator(page)
    sign_up(page, "paula")
    page.goto("/settings/security")
    page.locator("#passkey-name").fill("Laptop")
    page.locator("#add-passkey").click()
    expect(page.locator(".passkey")).to_have_text("Laptop")
    credentials = cdp.send("WebAuthn.getCredentials", {"authenticatorId": authenticator})["credentials"]
    assert len(credentials) == 1 and credentials[0]["isResidentCredential"]
    assert "user.passkey_added" in security_log(page)

    # Alone, from the log-in page: no username, no password.
    log_out(page, "paula")
    page.goto("/login")
    page.locator("#passkey-login").click()
    expect(page.get_by_role("heading", name="Profile Settings")).to_be_visible()
    assert "user.passkey_login" in security_log(page)

    # As the second factor, once TOTP is on.
    turn_on_two_factor(page)
    log_out(page, "paula")
    page.goto("/login")
    page.get_by_label("Username").fill("paula")
    page.get_by_label("Password").fill("a long password")
    page.get_by_role("button", name="Log in", exact=True).click()
    expect(page.get_by_role("heading", name="Two-factor authentication")).to_be_visible()
    page.locator("#passkey-second-factor").click()
    expect(page.get_by_role("heading", name="Profile Settings")).to_be_visible()
    count = cdp.send("WebAuthn.getCredentials", {"authenticatorId": authenticator})["credentials"][0]["signCount"]
    assert count >= 2  # each use signed with a higher count, which the server checked and stored

    page.goto("/settings/security")
    page.locator(".passkey").locator("..").get_by_text("Remove", exact=True).click()
    page.get_by_label("Your password").fill("a long password")
    page.get_by_role("button", name="Yes, remove").click()
    expect(page.locator(".passkey")).to_have_count(0)
    assert "user.passkey_removed" in security_log(page)

    # Removed: the authenticator still holds the credential, but the server no longer knows it.
    log_out(page, "paula")
    page.goto("/login")
    page.locator("#passkey-login").click()
    expect(page.locator("#passkey-error")).to_contain_text("not registered")
    assert re.search(r"/login$", page.url)


def test_a_passkey_button_is_offered_only_once_its_script_has_arrived(page):
    held = []
    add_authenticator(page)
    sign_up(page, "quinn")
    page.route("**/static/passkeys.js", lambda route: held.append(route))  # late, as on a loaded machine
    page.goto("/settings/security", wait_until="commit")
    page.locator("#passkey-name").fill("Phone")
    expect(page.locator("#add-passkey")).to_be_disabled()
    while not held:
        page.wait_for_timeout(50)
    held.pop().continue_()
    page.unroute("**/static/passkeys.js")
    page.locator("#add-passkey").click()
    expect(page.locator(".passkey")).to_have_text("Phone")
