"""The `orgs` command group: each command's output, line by line, and each refusal as one line on
stderr with exit status 1 and nothing changed."""

import re

import pytest

import auth
from accounts import emailtokens, securitylog, users
from mail.models import MailMessage
from models import ApiKey, Membership, Organisation
from orgs import invitations, keyactions, members
from orgs.models import Invitation


def make_user(name):
    return users.create_user(name, f"{name}@example.com", "correct horse battery")


@pytest.fixture
def acme(user):
    """Acme, owned by alice, with bob a developer."""
    org = members.create("Acme", user)
    Membership.create(org=org.id, user=make_user("bob").id, role="developer")
    return org


def succeeded(result):
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    return result.stdout


def refused(result, message):
    """The command ended with exactly this one-line error and printed nothing else."""
    assert result.exit_code == 1, result.output
    assert result.stderr == f"Error: {message}\n"
    assert result.stdout == ""


def test_create_prints_the_slug_and_makes_the_owner(runner, user):
    printed = succeeded(runner.invoke(args=["orgs", "create", "Acme Corp.", "--owner", "ALICE"]))
    assert printed == "Created organisation acme-corp ('Acme Corp.'), owned by alice.\n"
    org = Organisation.get(Organisation.slug == "acme-corp")
    assert [(m.user.username, m.role) for m in members.members(org.id)] == [("alice", "owner")]
    [created] = securitylog.recent_in(org.id)
    assert (created.event, created.ip, created.user) == ("org.created", "cli", None)


@pytest.mark.parametrize("args, message", [
    (["Acme", "--owner", "nobody"], "There is no user named 'nobody'."),
    (["acme", "--owner", "alice"], "The name 'acme' is taken; choose another."),
    (["!!!", "--owner", "alice"], "An organisation's name needs a letter or a digit."),
    (["x" * 65, "--owner", "alice"], "An organisation's name is 1 to 64 characters."),
])
def test_create_refusals(runner, acme, args, message):
    refused(runner.invoke(args=["orgs", "create", *args]), message)
    assert Organisation.select().count() == 3


def test_list_prints_every_organisation_by_slug(runner, acme):
    members.create("Zeta Labs", users.find_user("bob"))
    assert succeeded(runner.invoke(args=["orgs", "list"])) == (
        "acme\tAcme\nalice\talice\nbob\tbob\nzeta-labs\tZeta Labs\n")


def test_list_with_a_username_prints_its_organisations_and_roles(runner, acme):
    assert succeeded(runner.invoke(args=["orgs", "list", "bob"])) == "bob\tbob\towner\nacme\tAcme\tdeveloper\n"


def test_members_prints_user_id_username_and_role_owners_first(runner, user, acme):
    carol = make_user("carol")
    Membership.create(org=acme.id, user=carol.id, role="owner")
    bob = users.find_user("bob")
    assert succeeded(runner.invoke(args=["orgs", "members", "acme"])) == (
        f"{user.id}\talice\towner\n{carol.id}\tcarol\towner\n{bob.id}\tbob\tdeveloper\n")


def test_invite_without_public_url_prints_the_link_alone_last_and_mails_nothing(runner, acme):
    printed = succeeded(runner.invoke(args=["orgs", "invite", "acme", "Carol@Example.com", "--role", "admin"]))
    first, link = printed.splitlines()
    assert first == ("Invited carol@example.com to acme as admin. No mail was sent, as PUBLIC_URL is not set; pass "
                     "this link on: it works once, for 7 days, for an account with that address.")
    assert re.fullmatch(r"/invitations/[A-Za-z0-9_-]{43}", link)
    assert MailMessage.select().count() == 0
    carol = make_user("carol")
    invitations.accept(link.rsplit("/", 1)[1], carol)
    assert Membership.get((Membership.org == acme.id) & (Membership.user == carol.id)).role == "admin"


def test_invite_with_public_url_mails_the_link_it_prints(app, runner, acme, monkeypatch):
    monkeypatch.setitem(app.config, "PUBLIC_URL", "https://api.example.com")
    printed = succeeded(runner.invoke(args=["orgs", "invite", "acme", "carol@example.com", "--role", "viewer"]))
    first, link = printed.splitlines()
    assert first == ("Invited carol@example.com to acme as viewer. The link was mailed to that address: it works "
                     "once, for 7 days, for an account with that address.")
    assert re.fullmatch(r"https://api\.example\.com/invitations/[A-Za-z0-9_-]{43}", link)
    [mail] = MailMessage.select()
    assert mail.recipient == "carol@example.com"
    assert Invitation.get().token_hash == emailtokens.hashed(link.rsplit("/", 1)[1])


def test_invite_past_the_addresss_hourly_cap_says_so_and_mails_nothing(app, runner, user, acme, monkeypatch):
    """mail/addresscap.py's cap, whichever organisation asks: the address had three mails this hour."""
    monkeypatch.setitem(app.config, "PUBLIC_URL", "https://api.example.com")
    for name in ("Globex", "Initech", "Umbrella"):
        org = members.create(name, user)
        succeeded(runner.invoke(args=["orgs", "invite", org.slug, "Carol@example.com", "--role", "viewer"]))
    refused(runner.invoke(args=["orgs", "invite", "acme", "carol@example.com", "--role", "viewer"]),
            "No more mail goes to carol@example.com for now; try again later.")
    assert MailMessage.select().count() == 3 and Invitation.select().where(Invitation.org == acme.id).count() == 0


def test_invite_with_mail_off_says_that_no_mail_was_sent(app, runner, acme, monkeypatch):
    monkeypatch.setitem(app.config, "PUBLIC_URL", "https://api.example.com")
    monkeypatch.setitem(app.config, "MAIL_URL", "off")
    first = succeeded(runner.invoke(args=["orgs", "invite", "acme", "carol@example.com", "--role", "viewer"]))
    assert "No mail was sent, as MAIL_URL is off; pass this link on" in first
    assert MailMessage.select().count() == 0


@pytest.mark.parametrize("args, message", [
    (["nope", "carol@example.com", "--role", "admin"], "There is no organisation with the slug 'nope'."),
    (["acme", "carol@example.com", "--role", "boss"], "The roles are owner, admin, developer, viewer."),
    (["acme", "carol", "--role", "admin"], "That does not look like an email address."),
    (["acme", "bob@example.com", "--role", "admin"], "bob@example.com is already a member."),
])
def test_invite_refusals(runner, acme, args, message):
    refused(runner.invoke(args=["orgs", "invite", *args]), message)
    assert Invitation.select().count() == 0


def test_role_prints_the_change_or_that_there_was_none(runner, acme):
    assert succeeded(runner.invoke(args=["orgs", "role", "acme", "bob", "admin"])) == (
        "bob is now admin of acme (was developer).\n")
    assert succeeded(runner.invoke(args=["orgs", "role", "acme", "bob", "admin"])) == "bob is already admin of acme.\n"
    [changed, _] = securitylog.recent_in(acme.id)
    assert (changed.event, changed.detail, changed.user) == ("member.role_changed", "bob: developer to admin", None)


@pytest.mark.parametrize("args, message", [
    (["nope", "bob", "admin"], "There is no organisation with the slug 'nope'."),
    (["acme", "nobody", "admin"], "There is no user named 'nobody'."),
    (["acme", "carol", "admin"], "carol is not a member of acme."),
    (["acme", "bob", "root"], "The roles are owner, admin, developer, viewer."),
    (["acme", "alice", "admin"], "An organisation always has an owner: its last owner cannot lose the role. Make "
                                 "another member an owner first."),
])
def test_role_refusals(runner, acme, args, message):
    make_user("carol")
    refused(runner.invoke(args=["orgs", "role", *args]), message)
    assert {m.user.username: m.role for m in members.members(acme.id)} == {"alice": "owner", "bob": "developer"}


def test_remove_leaves_the_members_keys_working(runner, acme):
    bob = users.find_user("bob")
    _, secret = keyactions.issue_key(bob, "bob's", "development", org=acme.id)
    assert succeeded(runner.invoke(args=["orgs", "remove", "acme", "bob"])) == (
        "Removed bob from acme. Keys it created there, still working: 1.\n")
    assert auth.authenticate(secret).user_id == bob.id
    assert members.former_members_keys(acme.id) == [(bob.id, "bob", 1)]


def test_remove_with_revoke_keys_revokes_them(runner, acme):
    bob = users.find_user("bob")
    made = [keyactions.issue_key(bob, name, "development", org=acme.id)[0] for name in ("one", "two")]
    result = runner.invoke(args=["orgs", "remove", "acme", "bob", "--revoke-keys"])
    assert result.exit_code == 0 and result.stdout == "Removed bob from acme. Keys it created there, now revoked: 2.\n"
    # On PostgreSQL without Redis here, the note that servers keeping keys in memory hear late.
    assert result.stderr in ("", "Note: RATELIMIT_STORAGE_URL is not Redis here. Servers that keep keys in memory "
                                 "(PostgreSQL with Redis) learn of this change only when run with theirs; otherwise "
                                 "within 10 seconds.\n")
    assert all(ApiKey.get_by_id(key.id).revoked_at is not None for key in made)


@pytest.mark.parametrize("args, message", [
    (["nope", "bob"], "There is no organisation with the slug 'nope'."),
    (["acme", "nobody"], "There is no user named 'nobody'."),
    (["acme", "carol"], "carol is not a member of acme."),
    (["acme", "alice"], "An organisation always has an owner: its last owner cannot be removed. Make another "
                        "member an owner first."),
])
def test_remove_refusals(runner, acme, args, message):
    make_user("carol")
    refused(runner.invoke(args=["orgs", "remove", *args, "--revoke-keys"]), message)
    assert Membership.select().where(Membership.org == acme.id).count() == 2


@pytest.mark.parametrize("args", [["members", "nope"], ["list", "nobody"]])
def test_listing_an_unknown_organisation_or_user_is_refused(runner, acme, args):
    message = "There is no organisation with the slug 'nope'." if args[0] == "members" else (
        "There is no user named 'nobody'.")
    refused(runner.invoke(args=["orgs", *args]), message)
