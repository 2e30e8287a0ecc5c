"""The address pages in headless Chromium against the real server, mails through a real SMTP server:
the Profile tab not verified then verified, the link's page, a used link's page, a change to a long
address, and a change refused as no more mail goes to an address, each with nothing wider than the
page and nothing axe-core finds, at 390 and 1280 px."""

import itertools
import re
import time
from pprint import pformat

import pytest
from browsing import AXE, DESKTOP, PHONE, PageProblems, require, sign_up
from liveserver import PASSWORD as LIVE_PASSWORD, Browser
from serverfixtures import mailing

try:
    from playwright.sync_api import expect
except ImportError:
    pass

LINK = re.compile(r"https?://[^/\s]+(/email/(?:verify|change)/[A-Za-z0-9_-]{43})")
PASSWORD = "a long password"  # browsing.sign_up's
usernames = (f"{name}{n or ''}" for n in itertools.count() for name in ("ivy", "jude"))


@pytest.fixture(scope="module")
def server_settings(smtp):
    return mailing(smtp)


def wait_for_mail(smtp, address, subject):
    """The path of the link in the newest mail with this subject to that address, once it came."""
    deadline = time.monotonic() + 30
    while not (mails := [mail for mail in smtp.mails if mail.to == address and mail.subject == subject]):
        assert time.monotonic() < deadline, f"no mail {subject!r} to {address}"
        time.sleep(0.05)
    return LINK.search(mails[-1].text)[1]


@pytest.mark.parametrize("viewport", [PHONE, DESKTOP], ids=["390px", "1280px"])
def test_the_address_pages_fit_and_pass_axe(open_page, server, smtp, viewport):
    require(AXE.exists(), "axe-core is not installed (npm ci --prefix tests/axe)")
    page = open_page(viewport)
    found = PageProblems()

    username = next(usernames)
    sign_up(page, username)
    page.goto("/settings/profile")
    expect(page.locator(".status.unverified")).to_have_text("Not verified")
    expect(page.get_by_role("button", name="Send again")).to_be_visible()
    found.look(page, "Profile tab, not verified")

    path = wait_for_mail(smtp, f"{username}@example.com", "Confirm your email address")
    page.goto(path)
    expect(page.get_by_role("heading", name="Confirm your email address")).to_be_visible()
    found.look(page, "the verify link's page")
    page.get_by_role("button", name="Confirm my address").click()
    expect(page.get_by_text(f"The address {username}@example.com is confirmed.")).to_be_visible()
    expect(page.locator(".status.verified")).to_have_text("Verified")
    expect(page.get_by_role("button", name="Send again")).to_have_count(0)
    found.look(page, "Profile tab, verified")

    assert page.goto(path).status == 410
    expect(page.get_by_role("heading", name="This link cannot be used")).to_be_visible()
    found.look(page, "a used link's page")

    # No hyphen, where a line could break: the page itself must wrap it.
    long_address = f"{username}.witharatherlonglocalpart0123456789@mail.anunusuallylongdomainname.example.com"
    page.goto("/settings/profile")
    page.get_by_label("New email address").fill(long_address)
    page.get_by_label("Your password").fill(PASSWORD)
    page.get_by_role("button", name="Send the link").click()
    expect(page.locator("#pending-change")).to_contain_text(long_address)
    found.look(page, "Profile tab, a change waiting")
    page.goto(wait_for_mail(smtp, long_address, "Confirm your new email address"))
    expect(page.get_by_role("heading", name="Confirm your new email address")).to_be_visible()
    found.look(page, "the change link's page")
    page.get_by_role("button", name="Use this address").click()
    expect(page.get_by_text(f"Your address is now {long_address}.")).to_be_visible()
    expect(page.locator(".status.verified")).to_have_text("Verified")
    found.look(page, "Profile tab, a long address")

    # Three other accounts had a link mailed to this address in the hour: no more mail goes there.
    stranger = f"{username}.stranger0123456789@mail.anunusuallylongdomainname.example.com"
    for _ in range(3):
        asker = Browser(server).signup()
        # Closed once done: an idle kept-alive connection holds the server's stop for its 5 s keepalive.
        with asker.http:
            assert asker.post("/settings/profile/email", {"password": LIVE_PASSWORD, "email": stranger},
                              form_page="/settings/profile").status_code == 302
    expect(page.get_by_text("At most 3 links and invitations an hour go to one address")).to_be_visible()
    page.get_by_label("New email address").fill(stranger)
    page.get_by_label("Your password").fill(PASSWORD)
    page.get_by_role("button", name="Send the link").click()
    expect(page.get_by_role("alert")).to_have_text(f"No more mail goes to {stranger} for now; try again later.")
    found.look(page, "Profile tab, no more mail to an address")
    assert not found, pformat(found, width=120)
