"""A key's Edit form in headless Chromium at 1280 and 390 px: reached from the key's page, showing the
key as it is, fitting the width and clean under axe-core; a change made through it lands on the key
page with what changed, and the API answers as changed from the next request. With
UPDATE_SCREENSHOTS=1 it saves docs/key-edit.png and docs/phone-key-edit.png."""

import pytest
import requests
from browsing import DESKTOP, PHONE, PageProblems, create_key, painted, sign_up

try:
    from playwright.sync_api import expect
except ImportError:
    pass


@pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=["1280px", "390px"])
def test_a_key_is_changed_from_its_page_through_a_form_that_fits_and_passes_axe(open_page, server, screenshots,
                                                                                 viewport):
    page = open_page(viewport)
    username = f"edith{viewport['width']}"
    sign_up(page, username)
    secret = create_key(page, "Build server")
    me = requests.get(server.base + "/api/v1/user/me", headers={"X-API-Key": secret}, timeout=10)
    assert me.status_code == 200

    page.get_by_role("link", name="Build server").click()
    page.get_by_role("link", name="Edit", exact=True).click()
    expect(page.get_by_role("heading", name=f"Edit “Build server” of {username}")).to_be_visible()
    expect(page.get_by_label("Name")).to_have_value("Build server")
    expect(page.get_by_label("Tier")).to_have_value("free")
    expect(page.get_by_role("checkbox", name="user:read")).to_be_checked()
    problems = PageProblems()
    problems.look(page, "the edit form")
    painted(page)
    prefix = "phone-" if viewport is PHONE else ""
    page.screenshot(path=screenshots / f"{prefix}key-edit.png", full_page=True)

    page.get_by_label("Name").fill("Build server (CI)")
    page.get_by_role("checkbox", name="user:read").uncheck()
    page.get_by_label("Expiry").select_option("7d")
    page.get_by_role("button", name="Save changes").click()
    expect(page.get_by_role("status")).to_contain_text(
        "Changed name, scopes and expiry of “Build server (CI)”. It expires")
    expect(page.get_by_role("heading", name="Build server (CI)")).to_be_visible()
    problems.look(page, "the key's page after the change")
    assert problems == {}
    refused = requests.get(server.base + "/api/v1/user/me", headers={"X-API-Key": secret}, timeout=10)
    assert refused.status_code == 403
