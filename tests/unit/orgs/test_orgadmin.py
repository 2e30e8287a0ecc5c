"""An organisation renamed (its former slug finding it for 30 days, and no one else's meanwhile) and
deleted (every key revoked first, with its events; a personal organisation refused), through
orgs/orgadmin.py, the Organisation tab and `orgs rename|delete`."""

import datetime

import pytest
from teams import PASSWORD, make_org

from accounts import users
from keys import events
from models import ApiKey, Membership, Organisation, SecurityEvent, User, utcnow
from orgs import invitations, keyactions, members, orgadmin
from orgs.models import Invitation
from webhooks import endpoints
from webhooks.models import WebhookEndpoint, WebhookMessage


@pytest.fixture
def acme(app, user):
    app.config["WEBHOOK_ALLOW_PRIVATE"] = True
    return make_org("Acme", user, {"bob": "admin"})


def test_a_rename_moves_the_slug_and_each_former_one_finds_it_for_30_days(app, user, acme):
    renamed = orgadmin.rename(acme.id, "Acme Works")
    assert (renamed.name, renamed.slug) == ("Acme Works", "acme-works")
    assert orgadmin.find("acme").id == orgadmin.find("ACME-works ").id == acme.id
    assert members.find_membership(user, "acme").org_id == acme.id
    assert orgadmin.find("acme", now=utcnow() + datetime.timedelta(days=31)) is None
    assert orgadmin.rename(acme.id, "Acme Three").slug == "acme-three"
    assert orgadmin.find("acme").id == orgadmin.find("acme-works").id == acme.id  # each its own 30 days
    with pytest.raises(ValueError, match="The name 'acme' is taken"):
        members.create("Acme", user)
    other = members.create("Globex", user)
    for name in ("ACME", "Acme Works"):
        with pytest.raises(ValueError, match="is taken"):
            orgadmin.rename(other.id, name)
    # A new account's personal organisation does not take a kept slug either.
    assert Organisation.get(Organisation.personal_for == users.create_user("acme", "a@example.com", PASSWORD).id
                            ).slug == "acme-2"
    assert orgadmin.rename(acme.id, "Acme").slug == "acme"  # its own former slug, back
    assert [row.detail for row in SecurityEvent.select().where(SecurityEvent.event == "org.renamed")
            .order_by(SecurityEvent.id)] == ["Acme (acme) is now Acme Works (acme-works)",
                                             "Acme Works (acme-works) is now Acme Three (acme-three)",
                                             "Acme Three (acme-three) is now Acme (acme)"]


def test_renames_in_a_loop_reserve_at_most_five_former_slugs(acme):
    for number in range(orgadmin.MAX_FORMER_SLUGS):
        orgadmin.rename(acme.id, f"Acme {number}")
    with pytest.raises(ValueError, match="5 former names of this organisation are kept for 30 days"):
        orgadmin.rename(acme.id, "Acme Squat")
    assert orgadmin.rename(acme.id, "Acme").slug == "acme"  # a former name back is always allowed
    assert orgadmin.rename(acme.id, "Acme Later", now=utcnow() + datetime.timedelta(days=31)).slug == "acme-later"


def test_a_member_whose_role_changed_meanwhile_is_refused_under_the_lock(app, user, acme):
    bob = User.get(User.username == "bob")  # an admin: renaming and deleting are an owner's
    with pytest.raises(members.NotAllowed):
        orgadmin.rename(acme.id, "Bob's now", actor=bob)
    with pytest.raises(members.NotAllowed):
        orgadmin.delete(acme.id, actor=bob)
    assert Organisation.get_by_id(acme.id).name == "Acme"


@pytest.mark.parametrize(("name", "message"), [("", "1 to 64 characters"), ("!!!", "needs a letter or a digit"),
                                               ("a\tb", "control character")])
def test_a_name_refused_for_a_new_organisation_is_refused_for_a_rename(acme, name, message):
    with pytest.raises(ValueError, match=message):
        orgadmin.rename(acme.id, name)
    assert Organisation.get_by_id(acme.id).name == "Acme"


def test_a_deletion_revokes_every_key_with_its_events_then_ends_everything_else(app, user, acme):
    key, _ = keyactions.issue_key(user, "CI", "production", org=acme.id)
    endpoints.add_endpoint(user, "http://127.0.0.1:9/acme", org=acme.id)
    invitations.invite(acme.id, "newcomer@example.com", "developer", user)
    revoked = []
    with events.key_changed.connected_to(lambda event, key, **_: revoked.append((event, key.id))):
        orgadmin.delete(acme.id)
    assert revoked == [("key.revoked", key.id)]
    assert Organisation.get_or_none(Organisation.id == acme.id) is None
    for table in (ApiKey, WebhookEndpoint, Invitation, Membership, SecurityEvent):
        assert not table.select().where(table.org == acme.id).exists(), table
    assert WebhookMessage.select().count() == 0  # the revocation's message went with its endpoint


def test_a_personal_organisation_cannot_be_deleted_while_its_user_exists(user):
    with pytest.raises(orgadmin.PersonalOrganisation, match="alice's personal organisation"):
        orgadmin.delete(Organisation.get(Organisation.personal_for == user.id).id)


def test_the_tab_renames_and_deletes_after_the_name_is_typed_for_owners_only(app, user, acme, logged_in):
    assert logged_in.post("/orgs/switch", data={"org": "acme"}).status_code == 302
    tab = logged_in.get("/settings/organisation").text
    assert "<h2>Organisation Acme</h2>" in tab and 'action="/settings/organisation/delete"' in tab
    stale = logged_in.post("/settings/organisation/rename", data={"name": "Acme Works", "org_id": "1"})
    assert stale.status_code == 409 and "This form was for another organisation" in stale.text
    form = {"org_id": str(acme.id)}
    assert logged_in.post("/settings/organisation/rename", data={**form, "name": "Acme Works"}).status_code == 302
    assert "<code>acme</code>, which finds it until" in logged_in.get("/settings/organisation").text
    refused = logged_in.post("/settings/organisation/delete", data={**form, "confirm_name": "Acme"})
    assert refused.status_code == 400 and "Type the organisation&#39;s name, Acme Works, to delete it." in refused.text
    bob = app.test_client()
    assert bob.post("/login", data={"username": "bob", "password": PASSWORD}).status_code == 302
    assert bob.post("/orgs/switch", data={"org": "acme"}).status_code == 302  # the former slug
    assert "An owner renames or deletes the organisation." in bob.get("/settings/organisation").text
    assert bob.post("/settings/organisation/delete", data={**form, "confirm_name": "Acme Works"}).status_code == 403
    deleted = logged_in.post("/settings/organisation/delete", data={**form, "confirm_name": "Acme Works"},
                             follow_redirects=True)
    assert "Deleted Acme Works: its keys are revoked." in deleted.text
    assert Organisation.get_or_none(Organisation.id == acme.id) is None
    assert "A personal organisation goes only with its account" in logged_in.get("/settings/organisation").text
    personal = Organisation.get(Organisation.personal_for == user.id)
    assert logged_in.post("/settings/organisation/delete", data={"org_id": str(personal.id), "confirm_name": "alice"}
                          ).status_code == 409
    deletion = SecurityEvent.get(SecurityEvent.event == "org.deleted")
    assert deletion.detail == "Acme Works (acme-works), 0 active keys revoked"


def test_the_commands_rename_and_delete(runner, user, acme):
    keyactions.issue_key(user, "CI", "production", org=acme.id)
    renamed = runner.invoke(args=["orgs", "rename", "acme", "Acme Works"])
    assert renamed.exit_code == 0 and renamed.output == "Renamed acme to 'Acme Works'; its slug is acme-works.\n"
    unconfirmed = runner.invoke(args=["orgs", "delete", "acme"])
    assert unconfirmed.exit_code == 1 and "add --yes to confirm" in unconfirmed.output
    deleted = runner.invoke(args=["orgs", "delete", "acme", "--yes"])  # the former slug
    assert deleted.exit_code == 0 and deleted.output.startswith("Deleted acme-works; 1 active key revoked.")
    refused = runner.invoke(args=["orgs", "delete", "alice", "--yes"])
    assert refused.exit_code == 1 and "personal organisation" in refused.output
