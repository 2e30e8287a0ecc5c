"""The Organisation tab in headless Chromium against the real server, at 1280 and 390 px with
axe-core clean: a team made on the Members tab, renamed, then deleted after its name is typed; the
personal organisation offers no deletion. With UPDATE_SCREENSHOTS=1 it saves docs/organisation-tab.png
and docs/phone-organisation-tab.png."""

import pytest
from browsing import DESKTOP, PHONE, PageProblems, painted, sign_up

try:
    from playwright.sync_api import expect
except ImportError:
    pass


@pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=["1280px", "390px"])
def test_a_team_is_renamed_and_deleted_from_its_tab(open_page, screenshots, viewport):
    page = open_page(viewport)
    width = viewport["width"]
    sign_up(page, f"olga{width}")
    tabs = page.get_by_role("navigation", name="Profile Settings")
    tabs.get_by_role("link", name="Organisation").click()
    expect(page.get_by_text("A personal organisation goes only with its account")).to_be_visible()
    problems = PageProblems()
    problems.look(page, "the personal organisation's tab")

    tabs.get_by_role("link", name="Members").click()
    page.get_by_label("Name", exact=True).fill(f"Rocket {width}")
    page.get_by_role("button", name="Create organisation").click()
    tabs.get_by_role("link", name="Organisation").click()
    page.get_by_label("New name").fill(f"Rocket Works {width}")
    page.get_by_role("button", name="Rename").click()
    expect(page.get_by_role("status")).to_contain_text(f"its slug rocket-works-{width}")
    expect(page.locator(".facts")).to_contain_text(f"formerly rocket-{width}")
    page.get_by_text("Delete this organisation").click()
    problems.look(page, "a team's tab, Delete open")
    painted(page)
    page.screenshot(path=screenshots / f"{'phone-' if viewport is PHONE else ''}organisation-tab.png", full_page=True)
    page.get_by_label("Type its name").fill(f"Rocket Works {width}")
    page.get_by_role("button", name=f"Delete Rocket Works {width}").click()
    expect(page.get_by_role("status")).to_contain_text(f"Deleted Rocket Works {width}: its keys are revoked.")
    assert problems == {}
