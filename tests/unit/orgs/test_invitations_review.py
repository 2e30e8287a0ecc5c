"""The attacker's review of invitations: each case failed before its fix."""

import pytest

from accounts import emailtokens, users
from mail.models import MailMessage
from models import User
from orgs import invitations, members

PASSWORD = "correct horse battery"


@pytest.fixture
def acme(app, user):
    app.config["PUBLIC_URL"] = "https://api.example.com"
    return members.create("Acme", user)


def token_of(link):
    return link.rsplit("/", 1)[1]


def test_sending_a_link_again_counts_against_the_address_s_hourly_cap(acme, user, monkeypatch):
    monkeypatch.setattr(invitations, "RESEND_AFTER", invitations.datetime.timedelta(0))
    invitations.invite(acme.id, "victim@example.org", "viewer", inviter=user)
    for _ in range(invitations.MAILS_PER_ADDRESS_PER_HOUR - 1):
        invitations.send_again(invitations.pending_in(acme.id).get(), actor=user)
    with pytest.raises(ValueError, match="in the last hour"):
        invitations.send_again(invitations.pending_in(acme.id).get(), actor=user)
    assert MailMessage.select().where(MailMessage.recipient == "victim@example.org").count() == 3


def test_a_link_is_sent_again_a_minute_later_at_the_soonest(acme, user):
    invitation, _ = invitations.invite(acme.id, "guest@example.org", "viewer", inviter=user)
    with pytest.raises(ValueError, match="less than a minute ago"):
        invitations.send_again(reloaded(invitation), actor=user)


def test_an_inviter_cannot_confirm_an_address_it_does_not_own(acme, user):
    _, link = invitations.invite(acme.id, "victim@example.org", "viewer", inviter=user)
    sock = users.create_user("sock", "victim@example.org", PASSWORD)
    invitations.accept(token_of(link), sock)
    assert User.get_by_id(sock.id).email_verified_at is None


def test_a_link_sent_anew_while_the_old_one_is_being_accepted_voids_it(acme, user, monkeypatch):
    invitation, link = invitations.invite(acme.id, "guest@example.org", "viewer", inviter=user)
    guest = users.create_user("guest", "guest@example.org", PASSWORD)
    found = invitations.find(token_of(link))
    # The row as find read it, before a resend that another request commits in between.
    monkeypatch.setattr(invitations, "find", lambda token, now=None: found)
    invitations.Invitation.update(token_hash=emailtokens.hashed(emailtokens.new_token())).execute()
    with pytest.raises(invitations.Unusable):
        invitations.accept(token_of(link), guest)


def reloaded(invitation):
    return invitations.Invitation.get_by_id(invitation.id)


def test_invitations_that_ended_a_month_ago_are_deleted_at_the_next_one(acme, user):
    old, _ = invitations.invite(acme.id, "old@example.org", "viewer", inviter=user)
    recent, _ = invitations.invite(acme.id, "recent@example.org", "viewer", inviter=user)
    month_ago = invitations.utcnow() - invitations.KEPT_AFTER_END - invitations.datetime.timedelta(seconds=1)
    invitations.Invitation.update(revoked_at=month_ago).where(invitations.Invitation.id == old.id).execute()
    invitations.Invitation.update(revoked_at=invitations.utcnow()).where(invitations.Invitation.id == recent.id).execute()
    invitations.invite(acme.id, "new@example.org", "viewer", inviter=user)
    assert [row.email for row in invitations.Invitation.select().order_by(invitations.Invitation.id)] == [
        "recent@example.org", "new@example.org"]
