"""The attacker's review of organisations: each case failed before its fix."""

import pytest

from accounts import organisations, users
from models import ApiKey, Membership, Organisation
from orgs import invitations, members
from orgs.models import Invitation

PASSWORD = "correct horse battery"


def member_of(org, user, role):
    return Membership.create(org=org.id, user=user.id, role=role)


def test_the_personal_organisation_comes_first_on_either_database(app, user):
    bob = users.create_user("bob", "bob@example.com", PASSWORD)
    acme = members.create("Acme", bob)
    member_of(acme, user, "viewer")
    assert organisations.current_membership(user).org.personal_for_id == user.id
    assert [m.org.name for m in members.memberships_of(user)] == ["alice", "Acme"]


def test_a_personal_organisation_keeps_its_user_as_an_owner(app, user):
    bob = users.create_user("bob", "bob@example.com", PASSWORD)
    personal = organisations.current_membership(user).org
    member_of(personal, bob, "owner")
    with pytest.raises(members.PersonalOwner):
        members.change_role(personal.id, user.id, "viewer", actor=bob)
    with pytest.raises(members.PersonalOwner):
        members.remove(personal.id, user.id, actor=bob)
    with pytest.raises(members.PersonalOwner):
        members.leave(personal.id, user)
    assert Membership.get((Membership.org == personal.id) & (Membership.user == user.id)).role == "owner"


def test_handing_organisations_over_does_not_reset_the_cap_on_making_them(app, user, monkeypatch):
    monkeypatch.setattr(members, "MAX_CREATED", 2)
    bob = users.create_user("bob", "bob@example.com", PASSWORD)
    for name in ("One", "Two"):
        org = members.create(name, user)
        member_of(org, bob, "owner")
        members.leave(org.id, user)
    with pytest.raises(ValueError, match="may make 2 organisations"):
        members.create("Three", user)


def test_a_role_read_before_a_change_does_not_decide_it(app, user):
    """An admin's page showed the Remove button for a developer whom an owner has just made an owner."""
    acme = members.create("Acme", user)
    admin = users.create_user("adam", "adam@example.com", PASSWORD)
    dev = users.create_user("devi", "devi@example.com", PASSWORD)
    member_of(acme, admin, "admin")
    member_of(acme, dev, "developer")
    members.change_role(acme.id, dev.id, "owner", actor=user)
    with pytest.raises(members.NotAllowed):
        members.remove(acme.id, dev.id, actor=admin)
    members.change_role(acme.id, admin.id, "viewer", actor=user)
    with pytest.raises(members.NotAllowed):
        members.change_role(acme.id, dev.id, "viewer", actor=admin)
    assert Membership.get(Membership.user == dev.id, Membership.org == acme.id).role == "owner"


def test_a_member_who_may_no_longer_invite_leaves_no_invitation_behind(app, user):
    acme = members.create("Acme", user)
    admin = users.create_user("adam", "adam@example.com", PASSWORD)
    member_of(acme, admin, "admin")
    invitation, _ = invitations.invite(acme.id, "alt@example.com", "admin", inviter=admin)
    members.remove(acme.id, admin.id, actor=user)
    assert Invitation.get_by_id(invitation.id).revoked_at is not None


def test_the_only_owner_of_a_team_is_told_why_the_account_stays(app, logged_in, user):
    bob = users.create_user("bob", "bob@example.com", PASSWORD)
    acme = members.create("Acme", user)
    member_of(acme, bob, "developer")
    response = logged_in.post("/settings/profile/delete", data={"password": PASSWORD})
    assert response.status_code == 400 and b"only owner of Acme" in response.data
    assert Organisation.get_by_id(acme.id) is not None


def test_an_admin_cannot_flip_roles_fast_enough_to_push_its_deeds_out_of_the_log(app, user, monkeypatch):
    monkeypatch.setattr(members, "CHANGES_PER_HOUR", 4)
    acme = members.create("Acme", user)
    dev = users.create_user("devi", "devi@example.com", PASSWORD)
    member_of(acme, dev, "developer")
    for role in ("viewer", "developer", "viewer", "developer"):
        members.change_role(acme.id, dev.id, role, actor=user)
    with pytest.raises(ValueError, match="4 times an hour"):
        members.change_role(acme.id, dev.id, "viewer", actor=user)


def test_revoking_the_keys_of_no_one_revokes_nothing(app, user):
    import auth

    acme = members.create("Acme", user)
    auth.issue_key(user, "CI", "production", org=acme.id)
    with pytest.raises(ValueError):
        members.revoke_keys_of(acme.id, None)
    assert ApiKey.active_in(acme.id).count() == 1


def test_removing_with_the_keys_asks_for_both_under_the_lock(app, user, monkeypatch):
    acme = members.create("Acme", user)
    admin = users.create_user("adam", "adam@example.com", PASSWORD)
    dev = users.create_user("devi", "devi@example.com", PASSWORD)
    member_of(acme, admin, "admin")
    member_of(acme, dev, "developer")
    allows = members.roles.allows
    monkeypatch.setattr(members.roles, "allows", lambda role, action, **context: action != members.roles.MEMBER_REVOKE_KEYS
                        and allows(role, action, **context))
    with pytest.raises(members.NotAllowed):
        members.remove(acme.id, dev.id, revoke_keys=True, actor=admin)
    assert Membership.get_or_none(Membership.org == acme.id, Membership.user == dev.id) is not None
