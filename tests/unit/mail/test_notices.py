"""Notices: the owner's address hears of a key revoked as leaked, expiring or expired (a key's
creator while a member of its organisation, else the organisation's owners; a leak goes past a
creator whose address is not confirmed to the owners whose addresses are), a password changed,
two-factor log-in turned off and a passkey added, through a real SMTP server; the mail names the
key or the change and never holds a secret."""

import datetime

import pytest

import auth
from accounts import emailtokens, recovery, securitylog, twofactor, users
from accounts.models import Passkey
from mail import notices, sender
from mail.models import MailMessage
from models import ApiKey, Membership, User, db, utcnow
from orgs import keyactions, members, organisations
from webhooks import periodic


@pytest.fixture
def notice_app(make_app, database_url, smtp):
    app = make_app({"DATABASE_URL": database_url, "MAIL_URL": smtp.url, "TESTING": True, "WTF_CSRF_ENABLED": False,
                    "RATELIMIT_STORAGE_URL": "memory://", "PUBLIC_URL": "https://api.example.com"})
    with app.app_context():
        yield app


@pytest.fixture
def bob(notice_app):
    bob = users.create_user("bob", "bob@example.com", "correct horse battery")
    User.update(email_verified_at=utcnow()).where(User.id == bob.id).execute()
    return bob


def mails_sent(app, smtp, count=1):
    sender.send_due(app)
    return smtp.wait_for(count, to="bob@example.com")


def test_a_key_revoked_as_leaked_is_told_without_its_secret(notice_app, smtp, bob):
    key, secret = keyactions.issue_key(bob, "Payments server", "production")
    response = notice_app.test_client().post("/api/v1/keys/revoke", headers={"X-API-Key": secret})
    assert response.status_code == 200
    [mail] = mails_sent(notice_app, smtp)
    assert mail.subject == "An API key was revoked: it was found in public"
    assert f'"Payments server" ({key.display_prefix}..., id {key.id})' in mail.text
    assert "https://api.example.com/settings/security" in mail.text
    assert secret not in mail.raw.decode() and secret[len(key.display_prefix):] not in mail.raw.decode()


def test_a_key_expiring_and_expired_are_each_told_once(notice_app, smtp, bob):
    key, _ = keyactions.issue_key(bob, "Nightly job", "development")
    ApiKey.update(expires_at=utcnow() + datetime.timedelta(days=3)).where(ApiKey.id == key.id).execute()
    periodic.run()
    periodic.run()
    [expiring] = mails_sent(notice_app, smtp)
    assert expiring.subject == "An API key expires in 7 days" and '"Nightly job"' in expiring.text
    ApiKey.update(expires_at=utcnow() - datetime.timedelta(minutes=1)).where(ApiKey.id == key.id).execute()
    periodic.run()
    periodic.run()
    mails = mails_sent(notice_app, smtp, 2)
    assert [mail.subject for mail in mails] == ["An API key expires in 7 days", "An API key has expired"]


def test_a_password_change_is_told(notice_app, smtp, bob):
    users.change_password(bob, "correct horse battery", "another good password")
    [mail] = mails_sent(notice_app, smtp)
    assert mail.subject == "Your password was changed" and "bob" in mail.text
    assert "another good password" not in mail.raw.decode()


def test_two_factor_turned_off_and_a_passkey_added_are_told(notice_app, smtp, bob):
    twofactor.turn_off(bob)
    with db.atomic():
        securitylog.record(bob.id, "user.passkey_added", "Work laptop")
    mails = mails_sent(notice_app, smtp, 2)
    assert sorted(mail.subject for mail in mails) == ["A passkey was added to your account",
                                                      "Two-factor log-in was turned off"]
    assert '"Work laptop"' in next(mail for mail in mails if "passkey" in mail.subject).text


def test_no_notice_is_written_when_the_change_does_not_commit(notice_app, bob):
    with pytest.raises(RuntimeError), db.atomic():
        securitylog.record(bob.id, "user.2fa_disabled")
        raise RuntimeError("rolled back")
    assert MailMessage.select().count() == 0


def test_events_without_a_notice_send_no_mail(notice_app, bob):
    keyactions.issue_key(bob, "Quiet key", "development")
    with db.atomic():
        securitylog.record(bob.id, "user.login")
    assert MailMessage.select().count() == 0


def test_a_password_reset_is_told_after_the_link_was_used(notice_app, smtp, bob):
    with db.atomic():
        token = emailtokens.issue(bob.id, emailtokens.PASSWORD_RESET, bob.email)
    recovery.reset_password(token, "a brand new password")
    [mail] = mails_sent(notice_app, smtp)
    assert mail.subject == "Your password was reset" and "bob" in mail.text
    assert token not in mail.raw.decode() and "a brand new password" not in mail.raw.decode()
    assert "Besides the password" not in mail.text


def test_an_unconfirmed_address_gets_no_notice(notice_app, bob):
    """Whoever signed up with a stranger's address must not make the service mail it at will."""
    User.update(email_verified_at=None).where(User.id == bob.id).execute()
    for _ in range(3):
        users.change_password(bob, "correct horse battery", "another good password")
        users.change_password(bob, "another good password", "correct horse battery")
    assert MailMessage.select().count() == 0


def test_an_address_gets_at_most_ten_mails_an_hour_of_notices(notice_app, bob, caplog):
    for _ in range(8):
        users.change_password(bob, "correct horse battery", "another good password")
        users.change_password(bob, "another good password", "correct horse battery")
    assert MailMessage.select().where(MailMessage.recipient == "bob@example.com").count() == notices.NOTICES_PER_HOUR
    assert "No password_changed notice for user" in caplog.text


def test_a_reset_of_an_unconfirmed_account_confirms_it_and_names_what_else_signs_in(notice_app, smtp, bob):
    """An account made with another's address before its owner: the owner can only reset, and must
    hear of the passkey left on it (a reset never removes a second factor)."""
    User.update(email_verified_at=None).where(User.id == bob.id).execute()
    Passkey.create(user=bob.id, name="Mallory's key", credential_id="cred-1", public_key=b"x")
    with db.atomic():
        token = emailtokens.issue(bob.id, emailtokens.PASSWORD_RESET, bob.email)
    recovery.reset_password(token, "a brand new password")
    assert User.get_by_id(bob.id).email_verified_at is not None
    [mail] = mails_sent(notice_app, smtp)
    assert "Besides the password, these sign in to the account: passkeys: Mallory's key." in mail.text
    assert "Mallory&#39;s key" in mail.html or "Mallory&#x27;s key" in mail.html


def test_a_key_notice_goes_to_its_creator_while_a_member_then_to_the_owners(notice_app, bob):
    """A key of an organisation: its creator hears of it while still a member; once removed (or its
    account deleted), the organisation's owners do, the creator no longer."""
    alice = users.create_user("alice", "alice@example.com", "correct horse battery")
    carol = users.create_user("carol", "carol@example.com", "correct horse battery")
    acme = members.create("Acme", alice)
    Membership.create(org=acme.id, user=bob.id, role="developer")
    Membership.create(org=acme.id, user=carol.id, role="owner")
    key, secret = keyactions.issue_key(bob, "Deploy", "development", org=acme.id)
    assert notices.key_recipients(key) == [bob.id]
    members.remove(acme.id, bob.id)
    assert sorted(notices.key_recipients(key)) == sorted([alice.id, carol.id])
    User.update(email_verified_at=utcnow()).where(User.id.in_([alice.id, carol.id])).execute()
    assert notice_app.test_client().post("/api/v1/keys/revoke", headers={"X-API-Key": secret}).status_code == 200
    assert sorted(mail.recipient for mail in MailMessage.select()) == ["alice@example.com", "carol@example.com"]


def test_a_key_whose_creator_was_deleted_is_told_to_the_owners(notice_app, bob):
    alice = users.create_user("alice", "alice@example.com", "correct horse battery")
    acme = members.create("Acme", bob)
    Membership.create(org=acme.id, user=alice.id, role="developer")
    key, _ = keyactions.issue_key(alice, "Deploy", "development", org=acme.id)
    organisations.delete_account(alice, "correct horse battery")
    assert notices.key_recipients(ApiKey.get_by_id(key.id)) == [bob.id]


@pytest.fixture
def leaky(notice_app, bob):
    """Acme: bob a developer whose key leaks, alice and carol owners, dave an owner whose address
    nobody confirmed, erin an admin; all confirmed but dave. Returns (the key's secret, who is who)."""
    people = {name: users.create_user(name, f"{name}@example.com", "correct horse battery")
              for name in ("alice", "carol", "dave", "erin")}
    User.update(email_verified_at=utcnow()).where(User.username.in_(["alice", "carol", "erin"])).execute()
    acme = members.create("Acme", people["alice"])
    for name, role in (("carol", "owner"), ("dave", "owner"), ("erin", "admin")):
        Membership.create(org=acme.id, user=people[name].id, role=role)
    Membership.create(org=acme.id, user=bob.id, role="developer")
    _, secret = keyactions.issue_key(bob, "Deploy", "development", org=acme.id)
    return secret


def leak_reaches(notice_app, secret):
    """Revoke the key as leaked through the API; the addresses its notice went to."""
    assert notice_app.test_client().post("/api/v1/keys/revoke", headers={"X-API-Key": secret}).status_code == 200
    mails = list(MailMessage.select())
    assert {mail.subject for mail in mails} == {"An API key was revoked: it was found in public"}
    return sorted(mail.recipient for mail in mails)


def test_a_leak_is_told_to_its_creator_alone_when_its_address_is_confirmed(notice_app, leaky):
    assert leak_reaches(notice_app, leaky) == ["bob@example.com"]


def test_a_leak_whose_creator_is_unconfirmed_is_told_to_every_confirmed_owner(notice_app, bob, leaky):
    """The newcomer's case: a creator who never confirmed the address, and nobody heard of the leak.
    Now every owner with a confirmed address does; not the unconfirmed owner, nor the admin."""
    User.update(email_verified_at=None).where(User.id == bob.id).execute()
    assert leak_reaches(notice_app, leaky) == ["alice@example.com", "carol@example.com"]


def test_a_key_expiring_still_goes_to_its_creator_alone_while_a_member(notice_app, bob, leaky):
    """Only the leak looks past an unconfirmed creator: an expiry comes with a week's warning on
    the Security tab, and its notice is the creator's as before."""
    User.update(email_verified_at=None).where(User.id == bob.id).execute()
    assert notices.key_recipients(auth.authenticate(leaky)) == [bob.id]
