"""Invitations through the web: the link shown once to whoever invited and mailed to the address;
its page says what it is and changes nothing; the account with the invited address joins with its
form (after signing up or logging in from it); any other account is refused (403); a link used,
revoked, expired or replaced by a newer one is a 410, an unknown one a 404, and none changes anything."""

import datetime
import re

import pytest
from teams import PASSWORD, snapshot

from accounts import users
from mail import outbox
from mail.models import MailMessage
from models import Membership, SecurityEvent, User, utcnow
from orgs import members as org_members
from orgs.models import Invitation

SHOWN_LINK = re.compile(r'id="invitation-link"[^>]*>http://localhost(/invitations/[A-Za-z0-9_-]{43})<')


def invite(client, email="nina@example.com", role="developer"):
    """Invite through the Members tab; return the link's path, shown once."""
    response = client.post("/settings/members/invite", data={"email": email, "role": role})
    assert response.status_code == 302 and response.location == "/settings/members#invitations"
    return SHOWN_LINK.search(client.get("/settings/members").text)[1]


@pytest.fixture
def owner(team, log_in):
    return log_in("olive")


@pytest.fixture
def nina(team):
    """An account with the invited address (nina@example.com), not a member of Acme."""
    return users.create_user("nina", "nina@example.com", PASSWORD)


def sent_a_while_ago(invitation):
    """As if the invitation was mailed minutes ago: orgs/invitations.py sends one again after a minute only."""
    Invitation.update(sent_at=utcnow() - datetime.timedelta(minutes=5)).where(Invitation.id == invitation.id).execute()


def member_of_acme(team, user):
    return Membership.select().where((Membership.org == team.acme.id) & (Membership.user == user.id)).exists()


def test_the_link_is_shown_once_to_whoever_invited_and_mailed_to_the_address(team, owner):
    path = invite(owner, "Nina@Example.com", "viewer")
    assert not SHOWN_LINK.search(owner.get("/settings/members").text)
    [mail] = MailMessage.select().where(MailMessage.recipient == "nina@example.com")
    assert mail.subject == "You are invited to join an organisation"
    text = outbox.parts_of(mail)["text"]
    assert f"http://localhost{path}" in text and "olive invites you to join the organisation Acme as viewer" in text
    assert Invitation.get(Invitation.email == "nina@example.com").role == "viewer"
    event = SecurityEvent.get((SecurityEvent.event == "member.invited") & SecurityEvent.detail.contains("nina"))
    assert event.org_id == team.acme.id and event.user_id == team.people["olive"].id
    assert "nina@example.com" in owner.get("/settings/members").text  # listed as pending, without its link


def test_a_newcomer_signs_up_from_the_link_and_joins(team, owner, client):
    path = invite(owner)
    page = client.get(path)
    assert page.status_code == 200 and page.headers["Referrer-Policy"] == "strict-origin"
    assert "nina@example.com</strong> is invited by olive" in page.text and "as developer" in page.text
    assert f'href="/login?next={path}"' in page.text
    assert f'href="/signup?next={path}&amp;email=nina@example.com"' in page.text

    signup = client.get(f"/signup?next={path}&email=nina@example.com")
    assert 'value="nina@example.com"' in signup.text and f'href="/login?next={path}"' in signup.text
    response = client.post(f"/signup?next={path}", data={"username": "nina", "email": "nina@example.com",
                                                          "password": PASSWORD})
    assert response.status_code == 302 and response.location == path
    before = snapshot()
    assert "Join</button>" in client.get(path).text
    assert snapshot() == before  # a fetch of the page (a mail scanner's) joins no one

    response = client.post(path)
    assert response.status_code == 302 and response.location == "/settings/members"
    nina = User.get(User.username == "nina")
    assert Membership.get((Membership.org == team.acme.id) & (Membership.user == nina.id)).role == "developer"
    members = client.get("/settings/members").text
    assert "You joined Acme as developer" in members and "Members of Acme" in members
    joined = SecurityEvent.get(SecurityEvent.event == "member.joined")
    assert joined.org_id == team.acme.id and joined.user_id == nina.id

    for response in (client.get(path), client.post(path)):
        assert response.status_code == 410 and "accepted already" in response.text


def test_a_member_with_the_address_logs_in_from_the_link_and_joins(team, owner, client, nina):
    path = invite(owner)
    response = client.post(f"/login?next={path}", data={"username": "nina", "password": PASSWORD})
    assert response.status_code == 302 and response.location == path
    assert client.post(path).status_code == 302
    assert member_of_acme(team, nina)


def test_joining_needs_a_log_in_first(team, owner, client, nina):
    path = invite(owner)
    response = client.post(path)
    assert response.status_code == 302 and response.location == f"/login?next={path}"
    assert not member_of_acme(team, nina)


def test_an_account_with_another_address_cannot_join(team, owner, log_in):
    path = invite(owner)
    gus = log_in("gus", org=None)
    page = gus.get(path)
    assert page.status_code == 403 and "whose address is not nina@example.com" in page.text
    assert "Join</button>" not in page.text
    before = snapshot()
    response = gus.post(path)
    assert response.status_code == 403 and "whose address is not nina@example.com" in response.text
    assert snapshot() == before and not member_of_acme(team, team.people["gus"])


def test_a_revoked_invitations_link_is_gone(team, owner, log_in, nina):
    path = invite(owner)
    invitation = Invitation.get(Invitation.email == "nina@example.com")
    assert owner.post(f"/settings/members/invitations/{invitation.id}/revoke").status_code == 302
    assert f'id="invitation-{invitation.id}"' not in owner.get("/settings/members").text
    client = log_in("nina", org=None)
    for response in (client.get(path), client.post(path)):
        assert response.status_code == 410 and "revoked" in response.text
    assert not member_of_acme(team, nina)


def test_an_expired_link_is_gone(team, owner, log_in, nina):
    path = invite(owner)
    Invitation.update(expires_at=utcnow() - datetime.timedelta(seconds=1)).where(
        Invitation.email == "nina@example.com").execute()
    client = log_in("nina", org=None)
    for response in (client.get(path), client.post(path)):
        assert response.status_code == 410 and "expired" in response.text
    assert not member_of_acme(team, nina)


def test_sending_again_shows_a_new_link_once_and_voids_the_old(team, owner, log_in, nina):
    old = invite(owner)
    invitation = Invitation.get(Invitation.email == "nina@example.com")
    sent_a_while_ago(invitation)
    assert owner.post(f"/settings/members/invitations/{invitation.id}/resend").status_code == 302
    new = SHOWN_LINK.search(owner.get("/settings/members").text)[1]
    assert new != old and not SHOWN_LINK.search(owner.get("/settings/members").text)
    assert MailMessage.select().where(MailMessage.recipient == "nina@example.com").count() == 2
    client = log_in("nina", org=None)
    for response in (client.get(old), client.post(old)):
        assert response.status_code == 410 and "newer link" in response.text
    assert not member_of_acme(team, nina)
    assert client.post(new).status_code == 302 and member_of_acme(team, nina)


@pytest.mark.parametrize("token", ["A" * 43, "short", "bad\x00token" + "A" * 33, "%00", "A" * 5000])
def test_an_unknown_link_is_a_404_that_changes_nothing(team, log_in, token):
    client = log_in("gus", org=None)
    before = snapshot()
    for response in (client.get(f"/invitations/{token}"), client.post(f"/invitations/{token}")):
        assert response.status_code == 404 and "not one this service sent" in response.text
    assert snapshot() == before


def test_where_the_service_sends_no_mail_the_inviter_is_told_to_send_the_link(app, team, owner):
    app.config["MAIL_URL"] = "off"
    invited = owner.post("/settings/members/invite", data={"email": "nina@example.com", "role": "viewer"})
    assert invited.status_code == 302
    page = owner.get("/settings/members").text
    assert SHOWN_LINK.search(page) and "send it to nina@example.com yourself" in page and "was mailed" not in page
    assert MailMessage.select().where(MailMessage.recipient == "nina@example.com").count() == 0


def test_an_account_at_its_cap_of_memberships_is_told_so(team, owner, log_in, nina, monkeypatch):
    monkeypatch.setattr(org_members, "MAX_MEMBERSHIPS", 1)
    path = invite(owner)
    response = log_in("nina", org=None).post(path)
    assert response.status_code == 400 and "may belong to 1 organisations" in response.text
    assert not member_of_acme(team, nina)


def test_send_again_is_offered_once_its_minute_has_passed(team, log_in):
    client = log_in("olive")
    assert client.post("/settings/members/invite", data={"email": "late@example.com", "role": "viewer"}
                       ).status_code == 302
    invitation = Invitation.get(Invitation.email == "late@example.com")
    path = f"/settings/members/invitations/{invitation.id}/resend"
    page = client.get("/settings/members").text
    assert path not in page and "Send again from" in page
    Invitation.update(sent_at=utcnow() - datetime.timedelta(minutes=2)).where(Invitation.id == invitation.id).execute()
    assert path in client.get("/settings/members").text
