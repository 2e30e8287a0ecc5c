"""Organisations in headless Chromium against the real server (the Procfile's gunicorn), the
invitation mailed through a real SMTP server: an owner makes an organisation and invites an address
(the link shown once), the invitee signs up from the mailed link, joins, creates a key there and
switches organisations in the header; a key page of another of the user's organisations switches
back to it from its own button, and is a 404 to anyone else; revoking an invitation asks first, with
the page's script and without; at 390 and 1280 px, each page within the window's width and clean to
axe-core. With UPDATE_SCREENSHOTS=1 the run saves docs/members-tab.png, docs/phone-members-tab.png
and docs/org-switcher.png."""

import itertools
import re
from pprint import pformat

import pytest
import requests
from browsing import DESKTOP, PHONE, TOO_WIDE, PageProblems, axe_violations, create_key, painted, sign_up
from serverfixtures import mailing

try:
    from playwright.sync_api import expect
except ImportError:
    pass

PASSWORD = "a long password"  # browsing.sign_up's
LINK = re.compile(r"https://api\.example\.com(/invitations/[A-Za-z0-9_-]{43})")
SUBJECT = "You are invited to join an organisation"
numbers = itertools.count(1)


@pytest.fixture(scope="module")
def server_settings(smtp):
    return mailing(smtp)


def invite(page, email, role):
    """Invite from the Members tab; return the link the page shows once."""
    page.get_by_label("Email address").fill(email)
    page.get_by_label("Role", exact=True).select_option(role)
    page.get_by_role("button", name="Send invitation").click()
    expect(page.get_by_label("Invitation link")).to_be_visible()
    return page.get_by_label("Invitation link").input_value()


@pytest.mark.parametrize("viewport", [PHONE, DESKTOP], ids=["390px", "1280px"])
def test_an_invitee_signs_up_from_the_mailed_link_joins_makes_a_key_and_switches(open_page, smtp, viewport,
                                                                                  screenshots):
    number = next(numbers)
    owner_name, invitee, team = f"oona{number}", f"ines{number}", f"Rocket Team {number}"
    address = f"{invitee}@example.com"
    phone = viewport == PHONE
    found = PageProblems()

    owner = open_page(viewport)
    sign_up(owner, owner_name)
    owner.get_by_role("navigation", name="Profile Settings").get_by_role("link", name="Members").click()
    expect(owner.get_by_role("heading", name=f"Members of {owner_name}")).to_be_visible()
    found.look(owner, "the Members tab of a personal organisation")
    owner.get_by_label("Name", exact=True).fill(team)
    owner.get_by_role("button", name="Create organisation").click()
    expect(owner.get_by_role("heading", name=f"Members of {team}")).to_be_visible()
    expect(owner.get_by_label("Organisation", exact=True)).to_have_value(f"rocket-team-{number}")

    link = invite(owner, address, "developer")
    found.look(owner, "the invitation's link, shown once")
    owner.reload()
    expect(owner.get_by_label("Invitation link")).to_have_count(0)
    expect(owner.locator("table.invitations")).to_contain_text(address)
    [mail] = smtp.wait_for(1, to=address, subject=SUBJECT)
    path = LINK.search(mail.text)[1]
    assert link.endswith(path) and f"{owner_name} invites you to join the organisation {team} as developer" in mail.text

    page = open_page(viewport)
    page.goto(path)
    expect(page.get_by_role("heading", name=f"Join {team}")).to_be_visible()
    found.look(page, "the invitation's page, logged out")
    page.get_by_role("link", name="Sign up to join").click()
    expect(page.get_by_label("Email")).to_have_value(address)
    page.get_by_label("Username").fill(invitee)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Create account").click()
    expect(page.get_by_role("button", name="Join")).to_be_visible()
    found.look(page, "the invitation's page, logged in")
    page.get_by_role("button", name="Join").click()
    expect(page.get_by_role("heading", name=f"Members of {team}")).to_be_visible()
    expect(page.get_by_text(f"You joined {team} as developer")).to_be_visible()
    found.look(page, "the Members tab, joined as a developer")

    create_key(page, "Team deploy key")
    row = page.locator("table.keys tbody tr", has_text="Team deploy key")
    expect(row).to_contain_text(f"by {invitee}")
    found.look(page, "the team's Security tab with the developer's new key")
    page.get_by_label("Organisation", exact=True).select_option(invitee)
    page.get_by_role("button", name="Switch").click()
    expect(page.get_by_text(f"You now work in {invitee}, as owner.")).to_be_visible()
    expect(page.get_by_role("heading", name=f"Create the first key of {invitee}")).to_be_visible()
    expect(page.locator("table.keys")).to_have_count(0)
    found.look(page, "the Security tab after a switch")
    page.get_by_label("Organisation", exact=True).select_option(f"rocket-team-{number}")
    page.get_by_role("button", name="Switch").click()
    expect(page.locator("table.keys tbody tr", has_text="Team deploy key")).to_be_visible()
    if not phone:
        # The header's switcher above the team's key and security log, just switched to.
        painted(page)
        page.screenshot(path=screenshots / "org-switcher.png", clip={"x": 0, "y": 0, **DESKTOP})

    page.goto(path)
    expect(page.get_by_role("heading", name="This invitation cannot be used")).to_be_visible()
    found.look(page, "a used invitation's page")

    owner.reload()
    expect(owner.locator("table.members")).to_contain_text(invitee)
    invite(owner, f"later{number}@example.com", "viewer")
    found.look(owner, "the Members tab with a member and an invitation")
    owner.screenshot(path=screenshots / ("phone-members-tab.png" if phone else "members-tab.png"), full_page=True)
    assert not found, pformat(found, width=120)


@pytest.mark.parametrize("viewport", [PHONE, DESKTOP], ids=["390px", "1280px"])
def test_a_key_page_of_another_of_ones_organisations_offers_the_switch_back_to_it(open_page, server, viewport):
    """The newcomer's case: their own key, opened while another of their organisations was
    current, gave Werkzeug's 404 text. Its page now names the organisation holding it, and its
    button switches there and comes back to the key (revoked as leaked, which it says); to anyone
    else the page is the service's own 404."""
    number = next(numbers)
    owner_name, team = f"kim{number}", f"Kite Team {number}"
    found = PageProblems()

    page = open_page(viewport)
    sign_up(page, owner_name)
    page.get_by_role("navigation", name="Profile Settings").get_by_role("link", name="Members").click()
    page.get_by_label("Name", exact=True).fill(team)
    page.get_by_role("button", name="Create organisation").click()
    expect(page.get_by_role("heading", name=f"Members of {team}")).to_be_visible()
    secret = create_key(page, "Kite deploy key")
    page.locator("table.keys").get_by_role("link", name="Kite deploy key").click()
    expect(page.get_by_role("heading", name="Kite deploy key")).to_be_visible()
    key_path = page.url.removeprefix(server.base)
    assert requests.post(server.base + "/api/v1/keys/revoke", headers={"X-API-Key": secret}, timeout=10).ok

    page.get_by_label("Organisation", exact=True).select_option(owner_name)
    page.get_by_role("button", name="Switch").click()
    expect(page.get_by_text(f"You now work in {owner_name}, as owner.")).to_be_visible()
    page.goto(key_path)
    expect(page.get_by_role("heading", name=f"Kite deploy key: a key of {team}")).to_be_visible()
    expect(page.locator("#elsewhere")).to_contain_text(
        f"This key belongs to the organisation {team}, and you work in {owner_name} now.")
    found.look(page, "a key page of another of the user's organisations")
    page.get_by_role("button", name=f"Switch to {team}").click()
    expect(page.get_by_text(f"You now work in {team}, as owner.")).to_be_visible()
    assert page.url == server.base + key_path
    expect(page.get_by_role("heading", name="Kite deploy key", exact=True)).to_be_visible()
    expect(page.locator("#status")).to_contain_text("Revoked: reported with POST /api/v1/keys/revoke on ")
    expect(page.get_by_label("Organisation", exact=True)).to_have_value(f"kite-team-{number}")
    found.look(page, "the key's page after the switch, revoked as leaked")

    stranger = open_page(viewport)
    sign_up(stranger, f"sam{number}")
    response = stranger.goto(key_path)
    assert response.status == 404
    expect(stranger.get_by_role("heading", name="404 Not Found")).to_be_visible()
    expect(stranger.get_by_text("There is nothing here")).to_be_visible()
    expect(stranger.get_by_text(team)).to_have_count(0)
    found.look(stranger, "another user's key page: the service's own 404")
    assert not found, pformat(found, width=120)


@pytest.mark.parametrize("script", [True, False], ids=["script", "no script"])
@pytest.mark.parametrize("viewport", [PHONE, DESKTOP], ids=["390px", "1280px"])
def test_revoking_an_invitation_asks_first(open_page, viewport, script):
    number = next(numbers)
    address = f"kept{number}@example.com"
    page = open_page(viewport, java_script_enabled=script)
    sign_up(page, f"rosa{number}")
    page.goto("/settings/members")
    invite(page, address, "viewer")
    page.goto("/settings/members")
    row = page.locator("table.invitations tr", has_text=address)
    confirm = row.get_by_role("button", name="Yes, revoke")
    expect(confirm).to_be_hidden()
    row.locator("summary", has_text="Revoke").click()
    expect(row.get_by_text(f"Revoke the invitation of {address}? Its link stops working")).to_be_visible()
    expect(confirm).to_be_visible()
    if script:  # axe-core is a script itself
        page.wait_for_load_state("load")
        found = page.evaluate(TOO_WIDE) + axe_violations(page)
        assert not found, pformat(found, width=120)
    page.reload()  # asking changed nothing
    expect(row).to_be_visible()
    row.locator("summary", has_text="Revoke").click()
    confirm.click()
    expect(page.get_by_text(f"The invitation of {address} is revoked")).to_be_visible()
    expect(page.locator("table.invitations tr", has_text=address)).to_have_count(0)
