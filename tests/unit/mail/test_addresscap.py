"""mail/addresscap.py through the forms that mail an address: one address gets at most 3 change
links, invitations, and links to confirm an address nobody confirmed, an hour, whichever accounts
ask (a reset link is in no address's cap); past that the form says so and nothing is written (no
mail, no token, no invitation); case variants are one address; mail to the asking account's
confirmed address does not count; an hour later the address is mailed again; requests racing for
the last mail pass one at a time."""

import datetime
import re
import threading
import time

import pytest
from webforms import page

from accounts import emailaddress, securitylog, users
from accounts.emailtokens import EmailToken
from mail import addresscap, outbox, sender
from mail.models import MailMessage
from models import User, db, utcnow
from orgs import invitations, members
from orgs.models import Invitation
from store.writelock import write_transaction
from web import addressmails

PASSWORD = "correct horse battery"
STRANGER = "stranger@example.org"
REFUSED = f"No more mail goes to {STRANGER} for now; try again later."
HINT = "At most 3 links and invitations an hour go to one address, whoever asks for them."


@pytest.fixture
def app(make_app, database_url, smtp):
    """An app mailing through the test's SMTP server, with the site's address for the links."""
    app = make_app({"DATABASE_URL": database_url, "RATELIMIT_STORAGE_URL": "memory://", "TESTING": True,
                    "WTF_CSRF_ENABLED": False, "MAIL_URL": smtp.url, "PUBLIC_URL": "https://api.example.com"})
    with app.app_context():
        yield app


def account(app, name, email=None, confirmed=False):
    """A new account (made as the command line makes one: no mail) and a client logged in as it,
    working in its personal organisation."""
    user = users.create_user(name, email or f"{name}@example.com", PASSWORD)
    if confirmed:
        User.update(email_verified_at=utcnow()).where(User.id == user.id).execute()
    client = app.test_client()
    assert client.post("/login", data={"username": name, "password": PASSWORD}).status_code == 302
    client.user = User.get_by_id(user.id)
    return client


def sign_up(app, name, email):
    """An account made through the sign-up form, which mails its link, and its client."""
    client = app.test_client()
    assert client.post("/signup", data={"username": name, "email": email, "password": PASSWORD}).status_code == 302
    client.user = User.get(User.username == name)
    return client


def text(response):
    """The page with each run of white space made one space, as a browser shows it."""
    return re.sub(r"\s+", " ", page(response))


def flashes(response):
    return [re.sub(r"\s+", " ", text)
            for text in re.findall(r'<p class="flash[^"]*"[^>]*>(.*?)</p>', page(response), re.S)]


def ask_change(client, email=STRANGER):
    return client.post("/settings/profile/email", data={"password": PASSWORD, "email": email})


def invite(client, email=STRANGER):
    return client.post("/settings/members/invite", data={"email": email, "role": "viewer"})


def send_again(client):
    invitation = invitations.pending_in(personal_org(client).id).get()
    Invitation.update(sent_at=utcnow() - datetime.timedelta(minutes=5)).where(Invitation.id == invitation.id).execute()
    return client.post(f"/settings/members/invitations/{invitation.id}/resend")


def personal_org(client):
    return members.memberships_of(client.user)[0].org


def verify_again(client):
    return client.post("/settings/profile/email/verify")


def mailed(to=STRANGER):
    return MailMessage.select().where(MailMessage.recipient == to).count()


def written():
    """What a request could have written: mails, tokens, invitations, security log events."""
    events = sum(len(securitylog.recent(user.id)) for user in User.select())
    return MailMessage.select().count(), EmailToken.select().count(), Invitation.select().count(), events


def assert_refused(response, written_before):
    assert response.status_code == 429 and REFUSED in flashes(response)
    assert written() == written_before


def test_three_accounts_asking_for_one_strangers_address_mail_it_three_times_and_the_fourth_is_told(app, smtp):
    """The attack of issue 66: new accounts, each asking to move to one stranger's address."""
    askers = [account(app, f"asker{n}") for n in range(4)]
    assert HINT in text(askers[0].get("/settings/profile"))
    for asker in askers[:3]:
        assert ask_change(asker).status_code == 302
    before = written()
    assert_refused(ask_change(askers[3]), before)
    sender.send_due(app)
    assert len(smtp.wait_for(3, to=STRANGER)) == 3
    time.sleep(0.5)
    assert [mail.subject for mail in smtp.mails if mail.to == STRANGER] == ["Confirm your new email address"] * 3


@pytest.mark.parametrize("fourth", [ask_change, invite, send_again, verify_again])
def test_a_change_an_invitation_and_a_verification_share_the_cap_and_any_fourth_is_refused(app, fourth):
    stranger = sign_up(app, "stranger", STRANGER)  # sign-up's link to confirm the address: one
    inviter, changer = account(app, "inviter"), account(app, "changer")
    assert invite(inviter).status_code == 302  # two
    assert ask_change(changer).status_code == 302  # three
    assert mailed() == 3
    client = {ask_change: changer, invite: account(app, "another"), send_again: inviter, verify_again: stranger}[fourth]
    before = written()
    assert_refused(fourth(client), before)
    assert mailed() == 3


def test_case_variants_of_an_address_are_one_address(app):
    for n, variant in enumerate(["Stranger@Example.org", " STRANGER@EXAMPLE.ORG ", "stranger@example.ORG"]):
        assert ask_change(account(app, f"asker{n}"), variant).status_code == 302
    inviter = account(app, "inviter")
    before = written()
    assert_refused(invite(inviter, "StRaNgEr@example.org"), before)


def test_mail_to_the_asking_accounts_confirmed_address_does_not_count(app):
    """A confirmed account's own notices and reset links are its own business (capped per account),
    and leave the address's cap to mail others may ask for."""
    owner = account(app, "alice", "alice@example.com", confirmed=True)
    for n in range(3):
        assert ask_change(owner, f"new{n}@example.com").status_code == 302  # and a notice to alice@
        assert app.test_client().post("/password/forgot", data={"email": "alice@example.com"}).status_code == 200
    assert mailed("alice@example.com") == 6
    assert MailMessage.select().where(MailMessage.capped_address == "alice@example.com").count() == 0
    for n in range(3):
        assert invite(account(app, f"inviter{n}"), "alice@example.com").status_code == 302
    refused = invite(account(app, "inviter3"), "alice@example.com")
    assert refused.status_code == 429 and "No more mail goes to alice@example.com for now" in flashes(refused)[0]


def change_link(to):
    """The path of the change link mailed to that address."""
    [row] = MailMessage.select().where((MailMessage.recipient == to) & (MailMessage.subject == "Confirm your new "
                                                                                                 "email address"))
    return re.search(r"https://api\.example\.com(/email/change/\S+)", outbox.parts_of(row)["text"])[1]


def test_an_unconfirmed_address_s_notices_count_while_the_cap_allows(app):
    bob = account(app, "bob")
    assert ask_change(bob, "new@example.com").status_code == 302
    assert flashes(bob.get("/settings/profile"))[0].endswith("logged in as bob. A notice went to bob@example.com.")
    assert bob.post(change_link("new@example.com")).status_code == 302
    assert flashes(bob.get("/settings/profile")) == ["Your address is now new@example.com. A notice went to "
                                                     "bob@example.com."]
    assert MailMessage.select().where(MailMessage.capped_address == "bob@example.com").count() == 2


def test_past_the_cap_an_unconfirmed_address_s_notices_are_left_out_and_the_change_goes_on(app):
    bob = account(app, "bob")
    for _ in range(3):
        assert verify_again(bob).status_code == 302
    assert ask_change(bob, "new@example.com").status_code == 302
    assert flashes(bob.get("/settings/profile"))[-1:] == [
        "A link was mailed to new@example.com: your address changes when it is followed, within 24 hours, logged in "
        "as bob."]
    assert bob.post(change_link("new@example.com")).status_code == 302
    assert flashes(bob.get("/settings/profile")) == ["Your address is now new@example.com."]
    assert mailed("bob@example.com") == 3 and User.get_by_id(bob.user.id).email == "new@example.com"


def test_a_sign_up_past_the_cap_makes_the_account_without_a_link_and_says_why(app):
    for n in range(3):
        assert ask_change(account(app, f"asker{n}")).status_code == 302
    client = app.test_client()
    assert HINT in text(client.get("/signup"))
    response = client.post("/signup", data={"username": "stranger", "email": STRANGER, "password": PASSWORD})
    assert response.status_code == 302
    assert (f"No more mail goes to {STRANGER} for now, so no link to confirm it was sent: use Send again on the "
            "Profile tab later.") in flashes(client.get(response.headers["Location"]))
    stranger = User.get(User.username == "stranger")
    assert EmailToken.select().where(EmailToken.user == stranger.id).count() == 0 and mailed() == 3


def test_reset_links_are_in_no_address_s_cap_so_it_tells_nobody_that_an_account_has_the_address(app):
    """Counted, three anonymous reset requests would make the next invitation to an unconfirmed
    account's address a 429 while an address no account has stays a 302 (which tells them apart),
    and three invitations would stop the owner's resets, the only way back in."""
    sign_up(app, "stranger", STRANGER)
    visitor = app.test_client()
    for _ in range(3):
        assert visitor.post("/password/forgot", data={"email": STRANGER}).status_code == 200
    assert EmailToken.select().where(EmailToken.purpose == "password_reset").count() == 3
    assert MailMessage.select().where(MailMessage.capped_address == STRANGER).count() == 1  # sign-up's link
    assert invite(account(app, "inviter0"), STRANGER).status_code == 302
    assert invite(account(app, "inviter1"), "nobody@example.org").status_code == 302
    assert invite(account(app, "inviter2"), STRANGER).status_code == 302
    inviter = account(app, "inviter3")
    before = written()
    assert_refused(invite(inviter, STRANGER), before)
    EmailToken.delete().execute()  # the account's own 3 an hour are spent: an hour later
    assert visitor.post("/password/forgot", data={"email": STRANGER}).status_code == 200
    assert EmailToken.select().where(EmailToken.purpose == "password_reset").count() == 1


def test_an_hour_later_the_address_is_mailed_again(app):
    for n in range(3):
        assert ask_change(account(app, f"asker{n}")).status_code == 302
    late = account(app, "late")
    for minutes, status in [(59, 429), (61, 302)]:
        MailMessage.update(created_at=utcnow() - datetime.timedelta(minutes=minutes)).execute()
        assert ask_change(late).status_code == status
    assert mailed() == 4


def test_with_mail_off_nothing_is_mailed_and_nothing_capped(make_app, database_url):
    app = make_app({"DATABASE_URL": database_url, "RATELIMIT_STORAGE_URL": "memory://", "TESTING": True,
                    "WTF_CSRF_ENABLED": False, "MAIL_URL": "off"})
    with app.app_context():
        for n in range(4):
            assert invite(account(app, f"inviter{n}")).status_code == 302
        assert Invitation.select().count() == 4 and MailMessage.select().count() == 0


def test_requests_racing_for_the_last_mail_pass_one_at_a_time(app, monkeypatch):
    """Two organisations invite the address at once, each in its own thread and connection, when
    one mail is left: each past its count before either writes, had the count no lock."""
    for n in range(2):
        assert ask_change(account(app, f"asker{n}")).status_code == 302
    inviters = [User.get_by_id(account(app, name).user.id) for name in ("olive", "gina")]
    counted, refuse_past_cap = threading.Barrier(2), addresscap.refuse_past_cap

    def count_then_linger(recipient):
        address = refuse_past_cap(recipient)
        try:
            counted.wait(timeout=1)  # without the lock, both get here and both pass
        except threading.BrokenBarrierError:
            pass  # with it, the second is waiting for the first's commit
        time.sleep(0.1)
        return address

    monkeypatch.setattr(addresscap, "refuse_past_cap", count_then_linger)
    start, outcomes = threading.Barrier(2), []

    def invite_from(inviter):
        with app.app_context(), db.connection_context():
            start.wait(timeout=10)
            try:
                invitations.invite(members.memberships_of(inviter)[0].org_id, STRANGER, "viewer", inviter)
                outcomes.append("mailed")
            except addresscap.NoMoreMail:
                outcomes.append("refused")

    threads = [threading.Thread(target=invite_from, args=(inviter,)) for inviter in inviters]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(outcomes) == ["mailed", "refused"]
    assert mailed() == 3 and Invitation.select().count() == 1


def test_two_accounts_moving_to_each_others_address_at_once_both_get_their_link(app, monkeypatch):
    """Each change counts the new address and, unconfirmed, the old one: held in the order asked, the
    first request holds b@ then wants a@ while the second holds a@ and wants b@ (a deadlock, which
    PostgreSQL ends by failing one)."""
    accounts = [User.get_by_id(account(app, name, f"{name}@example.org").user.id) for name in ("ann", "ben")]
    held, hold = threading.Barrier(2), addresscap.hold

    def hold_then_linger(address):
        hold(address)
        try:
            held.wait(timeout=1)  # held in one order, the second waits for the first's commit here
        except threading.BrokenBarrierError:
            pass

    monkeypatch.setattr(addresscap, "hold", hold_then_linger)
    start, outcomes = threading.Barrier(2), []

    def move(user, to):
        with app.app_context(), app.test_request_context(), db.connection_context():
            start.wait(timeout=10)
            try:
                with write_transaction(db.obj):
                    new, token = emailaddress.request_change(user, to)
                    addressmails.mail_change_links(user, new, token)
                outcomes.append("mailed")
            except Exception as error:  # noqa: BLE001 - whatever ends a request is the failure
                outcomes.append(repr(error))

    threads = [threading.Thread(target=move, args=(user, other.email))
               for user, other in zip(accounts, reversed(accounts), strict=True)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert outcomes == ["mailed", "mailed"]
    assert mailed("ann@example.org") == mailed("ben@example.org") == 2  # a link and a notice each
