"""orgs/invitations.py: a link that works once, for 7 days, for the invited address only; sent
again with a new link that voids the old; the caps on pending invitations and mails; the mail
queued with its link only when the site's address is known; each step in the organisation's log;
sending again capped per address and a minute apart, a link voided even while it is being accepted,
an address never confirmed by an inviter, and ended invitations deleted after a month."""

import datetime

import pytest
from flask import g

from accounts import emailtokens, securitylog, users
from mail import addresscap, outbox
from mail.models import MailMessage
from models import Membership, SecurityEvent, User, utcnow
from orgs import invitations, members, organisations
from orgs.models import Invitation

PUBLIC_URL = "https://api.example.com"


def make_user(name, email=None):
    return users.create_user(name, email or f"{name}@example.com", "correct horse battery")


@pytest.fixture
def acme(user):
    return members.create("Acme", user)


@pytest.fixture
def public_url(app, monkeypatch):
    monkeypatch.setitem(app.config, "PUBLIC_URL", PUBLIC_URL)


def token_of(link):
    return link.rsplit("/", 1)[1]


def reloaded(invitation):
    return Invitation.get_by_id(invitation.id)


def role_of(org, user):
    membership = Membership.get_or_none((Membership.org == org.id) & (Membership.user == user.id))
    return membership and membership.role


def test_without_public_url_the_link_is_a_path_and_nothing_is_mailed(acme):
    invitation, link = invitations.invite(acme.id, " Bob@Example.com ", "developer")
    assert invitation.email == "bob@example.com"
    assert link.startswith("/invitations/") and emailtokens.TOKEN_PATTERN.fullmatch(token_of(link))
    assert invitation.expires_at - invitation.created_at == datetime.timedelta(days=7)
    assert MailMessage.select().count() == 0
    assert Invitation.get_by_id(invitation.id).token_hash == emailtokens.hashed(token_of(link))


def test_with_public_url_the_mail_carries_the_link(user, acme, public_url):
    _, link = invitations.invite(acme.id, "bob@example.com", "admin", inviter=user)
    assert link.startswith(f"{PUBLIC_URL}/invitations/")
    [mail] = MailMessage.select()
    assert (mail.recipient, mail.subject) == ("bob@example.com", outbox.SUBJECTS["invitation"])
    text = outbox.parts_of(mail)["text"]
    assert link in text and "Acme" in text and "alice" in text and "admin" in text


def test_accepting_makes_a_member_with_the_role_and_leaves_the_address_unconfirmed(acme):
    bob = make_user("bob")
    assert bob.email_verified_at is None
    _, link = invitations.invite(acme.id, "bob@example.com", "developer")
    membership = invitations.accept(token_of(link), bob)
    assert (membership.org_id, membership.role) == (acme.id, "developer")
    assert role_of(acme, bob) == "developer"
    # Whoever invited saw the link too: following it proves nothing about the mailbox.
    assert User.get_by_id(bob.id).email_verified_at is None
    assert invitations.pending_in(acme.id).count() == 0


def test_an_account_with_another_address_cannot_accept_and_nothing_changes(acme):
    _, link = invitations.invite(acme.id, "bob@example.com", "admin")
    mallory = make_user("mallory")
    with pytest.raises(invitations.WrongAddress):
        invitations.accept(token_of(link), mallory)
    assert role_of(acme, mallory) is None
    assert User.get_by_id(mallory.id).email_verified_at is None
    assert invitations.find(token_of(link))[1] is None
    assert [event.event for event in securitylog.recent_in(acme.id)] == ["member.invited", "org.created"]


def test_a_link_works_once(acme):
    bob = make_user("bob")
    _, link = invitations.invite(acme.id, "bob@example.com", "viewer")
    invitations.accept(token_of(link), bob)
    with pytest.raises(invitations.Unusable) as used:
        invitations.accept(token_of(link), bob)
    assert used.value.why == invitations.USED
    assert Membership.select().where(Membership.org == acme.id).count() == 2


@pytest.mark.parametrize("token", ["", "not a token", "x" * 43, None])
def test_an_invalid_link_is_unknown(acme, token):
    assert invitations.find(token) == (None, invitations.UNKNOWN)
    with pytest.raises(invitations.Unusable) as unknown:
        invitations.accept(token, make_user("bob"))
    assert unknown.value.why == invitations.UNKNOWN


def test_a_revoked_link_is_void(acme):
    invitation, link = invitations.invite(acme.id, "bob@example.com", "viewer")
    assert invitations.revoke(invitation) is True
    assert invitations.revoke(invitation) is False
    assert invitations.find(token_of(link))[1] == invitations.VOIDED
    bob = make_user("bob")
    with pytest.raises(invitations.Unusable):
        invitations.accept(token_of(link), bob)
    assert role_of(acme, bob) is None


def test_a_deleted_accounts_pending_invitations_are_void_in_every_organisation(user, acme):
    mia = make_user("mia")
    _, link = invitations.invite(acme.id, "mia@example.com", "admin", inviter=user)
    invitations.accept(token_of(link), mia)
    minis = members.create("Minis", mia)
    _, to_acme = invitations.invite(acme.id, "eve@example.com", "admin", inviter=mia)
    _, to_minis = invitations.invite(minis.id, "eve@example.com", "developer", inviter=mia)
    _, from_owner = invitations.invite(acme.id, "otto@example.com", "viewer", inviter=user)
    organisations.delete_account(mia, "correct horse battery")
    assert invitations.find(token_of(to_acme))[1] == invitations.VOIDED
    assert invitations.find(token_of(to_minis))[1] in (invitations.VOIDED, invitations.UNKNOWN)
    eve = make_user("eve")
    with pytest.raises(invitations.Unusable):
        invitations.accept(token_of(to_acme), eve)
    assert role_of(acme, eve) is None
    assert invitations.find(token_of(from_owner))[1] is None  # another member's stay pending


def test_an_expired_link_cannot_be_used(acme):
    invitation, link = invitations.invite(acme.id, "bob@example.com", "viewer")
    Invitation.update(expires_at=utcnow() - datetime.timedelta(seconds=1)).where(
        Invitation.id == invitation.id).execute()
    assert invitations.find(token_of(link))[1] == invitations.EXPIRED
    assert invitations.pending_in(acme.id).count() == 0
    with pytest.raises(invitations.Unusable) as expired:
        invitations.accept(token_of(link), make_user("bob"))
    assert expired.value.why == invitations.EXPIRED


def test_sent_again_a_new_link_works_for_7_more_days_and_the_old_one_no_longer(acme, public_url):
    invitation, old = invitations.invite(acme.id, "bob@example.com", "developer")
    Invitation.update(expires_at=utcnow() + datetime.timedelta(hours=1)).where(
        Invitation.id == invitation.id).execute()
    invitation.sent_at -= invitations.RESEND_AFTER
    new = invitations.send_again(invitation)
    assert new != old
    assert invitations.find(token_of(old))[1] == invitations.VOIDED
    row, why = invitations.find(token_of(new))
    assert why is None and row.expires_at > utcnow() + datetime.timedelta(days=6)
    assert (row.email, row.role, row.created_at) == ("bob@example.com", "developer", invitation.created_at)
    assert [pending.id for pending in invitations.pending_in(acme.id)] == [row.id]
    assert [outbox.parts_of(mail)["text"].count("/invitations/") for mail in MailMessage.select()] == [1, 1]
    assert new in outbox.parts_of(MailMessage.select().order_by(MailMessage.id.desc()).first())["text"]
    invitations.accept(token_of(new), make_user("bob"))


def test_an_accepted_or_revoked_invitation_is_not_sent_again(acme):
    accepted, link = invitations.invite(acme.id, "bob@example.com", "developer")
    invitations.accept(token_of(link), make_user("bob"))
    revoked, _ = invitations.invite(acme.id, "carol@example.com", "developer")
    invitations.revoke(revoked)
    for ended in (accepted, revoked):
        ended.sent_at -= invitations.RESEND_AFTER
        with pytest.raises(ValueError, match="accepted or revoked meanwhile"):
            invitations.send_again(ended)
    assert Invitation.select().count() == 2


def test_a_members_address_or_one_already_invited_is_refused(user, acme):
    with pytest.raises(ValueError, match="alice@example.com is already a member."):
        invitations.invite(acme.id, "ALICE@example.com", "viewer")
    invitations.invite(acme.id, "bob@example.com", "viewer")
    with pytest.raises(ValueError, match="bob@example.com is already invited"):
        invitations.invite(acme.id, "bob@example.com", "admin")
    assert Invitation.select().count() == 1


@pytest.mark.parametrize("email, role, message", [
    ("bob@example.com", "boss", "The roles are owner, admin, developer, viewer."),
    ("not an address", "viewer", "does not look like an email address"),
    ("bob@exämple.com", "viewer", "cannot be mailed"),
])
def test_a_bad_address_or_role_is_refused(acme, email, role, message):
    with pytest.raises(ValueError, match=message):
        invitations.invite(acme.id, email, role)
    assert Invitation.select().count() == 0


def test_an_organisation_holds_at_most_max_pending_invitations(acme, monkeypatch):
    monkeypatch.setattr(invitations, "MAX_PENDING", 2)
    first, _ = invitations.invite(acme.id, "one@example.com", "viewer")
    invitations.invite(acme.id, "two@example.com", "viewer")
    with pytest.raises(ValueError, match="2 pending invitations; revoke one first"):
        invitations.invite(acme.id, "three@example.com", "viewer")
    invitations.revoke(first)
    invitations.invite(acme.id, "three@example.com", "viewer")


def test_an_organisation_sends_at_most_mails_per_hour_links_sending_again_included(acme, monkeypatch):
    monkeypatch.setattr(invitations, "MAILS_PER_HOUR", 2)
    monkeypatch.setattr(invitations, "RESEND_AFTER", datetime.timedelta(0))
    invitation, _ = invitations.invite(acme.id, "one@example.com", "viewer")
    invitations.send_again(invitation)
    invitation = invitations.pending_in(acme.id).get()
    with pytest.raises(ValueError, match="2 invitations an hour"):
        invitations.invite(acme.id, "two@example.com", "viewer")
    with pytest.raises(ValueError, match="2 invitations an hour"):
        invitations.send_again(invitation)
    SecurityEvent.update(created_at=utcnow() - datetime.timedelta(minutes=61)).execute()
    invitations.invite(acme.id, "two@example.com", "viewer")


def test_each_step_is_logged_with_who_acted(app, user, acme):
    """The inviter and whoever revokes act in a web request (the logged-in user); the command line
    acts as no one; whoever joins is its own actor."""
    with app.app_context(), app.test_request_context():
        g.user = user
        _, link = invitations.invite(acme.id, "bob@example.com", "developer", inviter=user)
        carols, _ = invitations.invite(acme.id, "carol@example.com", "viewer", inviter=user)
    invitations.invite(acme.id, "dave@example.com", "admin")
    invitations.accept(token_of(link), make_user("bob"))
    invitations.revoke(carols)
    logged = [(event.event, event.detail, event.user and event.user.username)
              for event in reversed(securitylog.recent_in(acme.id))]
    assert logged[1:] == [
        ("member.invited", "bob@example.com as developer", "alice"),
        ("member.invited", "carol@example.com as viewer", "alice"),
        ("member.invited", "dave@example.com as admin", None),
        ("member.joined", "bob as developer", "bob"),
        ("invitation.revoked", "carol@example.com as viewer", None),
    ]


def test_sending_a_link_again_counts_against_the_address_s_hourly_cap(acme, user, public_url, monkeypatch):
    monkeypatch.setattr(invitations, "RESEND_AFTER", datetime.timedelta(0))
    invitations.invite(acme.id, "victim@example.org", "viewer", inviter=user)
    for _ in range(addresscap.MAILS_PER_HOUR - 1):
        invitations.send_again(invitations.pending_in(acme.id).get(), actor=user)
    pending = invitations.pending_in(acme.id).get()
    with pytest.raises(addresscap.NoMoreMail,
                       match=r"^No more mail goes to victim@example\.org for now; try again later\.$"):
        invitations.send_again(pending, actor=user)
    assert MailMessage.select().where(MailMessage.recipient == "victim@example.org").count() == 3
    assert invitations.pending_in(acme.id).get().id == pending.id  # the refused link was not made


def test_a_link_is_sent_again_a_minute_later_at_the_soonest(acme, user, public_url):
    invitation, _ = invitations.invite(acme.id, "guest@example.org", "viewer", inviter=user)
    with pytest.raises(ValueError, match="less than a minute ago"):
        invitations.send_again(reloaded(invitation), actor=user)


def test_an_inviter_cannot_confirm_an_address_it_does_not_own(acme, user, public_url):
    _, link = invitations.invite(acme.id, "victim@example.org", "viewer", inviter=user)
    sock = make_user("sock", "victim@example.org")
    invitations.accept(token_of(link), sock)
    assert User.get_by_id(sock.id).email_verified_at is None


def test_a_link_sent_anew_while_the_old_one_is_being_accepted_voids_it(acme, user, public_url, monkeypatch):
    invitation, link = invitations.invite(acme.id, "guest@example.org", "viewer", inviter=user)
    guest = make_user("guest", "guest@example.org")
    found = invitations.find(token_of(link))
    # The row as find read it, before a resend that another request commits in between.
    monkeypatch.setattr(invitations, "find", lambda token, now=None: found)
    Invitation.update(token_hash=emailtokens.hashed(emailtokens.new_token())).execute()
    with pytest.raises(invitations.Unusable):
        invitations.accept(token_of(link), guest)


def test_invitations_that_ended_a_month_ago_are_deleted_at_the_next_one(acme, user, public_url):
    old, _ = invitations.invite(acme.id, "old@example.org", "viewer", inviter=user)
    recent, _ = invitations.invite(acme.id, "recent@example.org", "viewer", inviter=user)
    month_ago = utcnow() - invitations.KEPT_AFTER_END - datetime.timedelta(seconds=1)
    Invitation.update(revoked_at=month_ago).where(Invitation.id == old.id).execute()
    Invitation.update(revoked_at=utcnow()).where(Invitation.id == recent.id).execute()
    invitations.invite(acme.id, "new@example.org", "viewer", inviter=user)
    assert [row.email for row in Invitation.select().order_by(Invitation.id)] == [
        "recent@example.org", "new@example.org"]
