"""The Organisation tab's Billing section in headless Chromium against the real server exporting to
a CloudEvents receiver, at 1280 and 390 px with axe-core clean: a customer refused with its
sentence, given, shown with the export's state, then removed. With UPDATE_SCREENSHOTS=1 it saves
docs/billing-section.png and docs/phone-billing-section.png."""

import pytest
from billingreceiver import VendorReceiver
from browsing import DESKTOP, PHONE, PageProblems, painted, sign_up

try:
    from playwright.sync_api import expect
except ImportError:
    pass


@pytest.fixture(scope="module")
def receiver():
    with VendorReceiver("cloudevents") as receiver:
        yield receiver


@pytest.fixture(scope="module")
def server_settings(receiver):
    return {"BILLING_EXPORT": "cloudevents", "BILLING_URL": receiver.url}


@pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=["1280px", "390px"])
def test_an_owner_gives_and_removes_the_billing_customer(open_page, screenshots, viewport):
    page = open_page(viewport)
    width = viewport["width"]
    sign_up(page, f"bella{width}")
    page.get_by_role("navigation", name="Profile Settings").get_by_role("link", name="Organisation").click()
    billing = page.get_by_role("region", name="Billing")
    expect(billing).to_contain_text(f"bella{width}'s usage is not exported: it has no billing customer.")
    problems = PageProblems()
    problems.look(page, "the Billing section without a customer")

    page.get_by_label("Billing customer").fill("two words")
    page.get_by_role("button", name="Save billing customer").click()
    expect(page.get_by_role("alert")).to_contain_text("1 to 255 printable characters without spaces")
    problems.look(page, "a customer refused")

    page.get_by_label("Billing customer").fill(f"subject-{width}")
    page.get_by_role("button", name="Save billing customer").click()
    expect(page.get_by_role("status")).to_contain_text(f"usage is exported as customer subject-{width}")
    expect(billing.locator(".facts")).to_contain_text(f"subject-{width}")
    expect(billing.locator(".facts")).to_contain_text("none yet")
    expect(page.get_by_label("Billing customer")).to_have_value(f"subject-{width}")
    problems.look(page, "the Billing section with a customer")
    painted(page)
    billing.screenshot(path=screenshots / f"{'phone-' if viewport is PHONE else ''}billing-section.png")

    page.get_by_role("button", name="Stop exporting").click()
    expect(page.get_by_role("status")).to_contain_text("is exported no more after the hour under way")
    expect(billing.locator(".facts")).to_contain_text("none: removed, its hours until")
    expect(page.get_by_role("button", name="Stop exporting")).to_have_count(0)
    assert problems == {}
