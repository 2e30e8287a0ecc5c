"""orgs/members.py: making an organisation, changing roles, removing and leaving, with the last
owner protected (two removals at once included), each change in the organisation's security log
with who acted, and the keys a member made left working until revoked together; a personal
organisation's owner kept, the caps on making organisations and on changing roles, and a role
decided as it stands under the lock, not as a page read it."""

import threading
import time

import pytest
from flask import g

import auth
from accounts import securitylog, users
from keys import events as key_events
from models import OWNER, ApiKey, Membership, Organisation, SecurityEvent, db, personal_organisation
from orgs import invitations, keyactions, members, organisations
from orgs.models import Invitation


def make_user(name):
    return users.create_user(name, f"{name}@example.com", "correct horse battery")


@pytest.fixture
def acme(user):
    """The organisation Acme, owned by alice (the user fixture)."""
    return members.create("Acme", user)


def join(org, user, role):
    return Membership.create(org=org.id, user=user.id, role=role)


def roles_in(org):
    return {membership.user.username: membership.role for membership in members.members(org.id)}


def log_of(org):
    """The organisation's events, oldest first: (event, detail, the actor's username or None)."""
    return [(event.event, event.detail, event.user and event.user.username)
            for event in reversed(securitylog.recent_in(org.id, limit=None))]


def test_create_makes_its_creator_the_owner_and_its_slug_from_the_name(user):
    org = members.create("  Acme Corp. (EU)  ", user)
    assert (org.name, org.slug, org.personal_for_id) == ("Acme Corp. (EU)", "acme-corp-eu", None)
    assert roles_in(org) == {"alice": OWNER}
    assert log_of(org) == [("org.created", "Acme Corp. (EU)", None)]


@pytest.mark.parametrize("name, message", [
    ("", "1 to 64 characters"),
    ("x" * 65, "1 to 64 characters"),
    ("!!!", "needs a letter or a digit"),
    ("Acme\u202e", "cannot contain"),
    ("ACME", "The name 'acme' is taken"),
    ("alice", "The name 'alice' is taken"),
])
def test_create_refuses_a_bad_or_taken_name(user, acme, name, message):
    with pytest.raises(ValueError, match=message):
        members.create(name, user)
    assert Organisation.select().count() == 2


def test_one_account_may_make_at_most_max_created(user, monkeypatch):
    monkeypatch.setattr(members, "MAX_CREATED", 2)
    members.create("One", user)
    members.create("Two", user)
    with pytest.raises(ValueError, match="may make 2 organisations"):
        members.create("Three", user)


def test_memberships_list_the_personal_organisation_first(user, acme):
    zeta = members.create("Zeta", make_user("bob"))
    join(zeta, user, "viewer")
    assert [(m.org.slug, m.role) for m in members.memberships_of(user)] == [
        ("alice", OWNER), ("acme", OWNER), ("zeta", "viewer")]


def test_members_are_listed_owners_first_then_by_username(user, acme):
    for name, role in [("dave", "viewer"), ("bob", "developer"), ("carol", "owner"), ("erin", "admin")]:
        join(acme, make_user(name), role)
    assert [(m.user.username, m.role) for m in members.members(acme.id)] == [
        ("alice", "owner"), ("carol", "owner"), ("erin", "admin"), ("bob", "developer"), ("dave", "viewer")]


def test_the_last_owner_cannot_leave_be_removed_or_lose_the_role(user, acme):
    join(acme, make_user("bob"), "admin")
    with pytest.raises(members.LastOwner, match="its last owner cannot leave"):
        members.leave(acme.id, user)
    with pytest.raises(members.LastOwner, match="its last owner cannot be removed"):
        members.remove(acme.id, user.id)
    with pytest.raises(members.LastOwner, match="its last owner cannot lose the role"):
        members.change_role(acme.id, user.id, "admin")
    assert roles_in(acme) == {"alice": OWNER, "bob": "admin"}
    assert [event for event, _, _ in log_of(acme)] == ["org.created"]


def test_with_another_owner_an_owner_can_step_down_and_leave(user, acme):
    bob = make_user("bob")
    join(acme, bob, OWNER)
    members.change_role(acme.id, user.id, "viewer")
    members.leave(acme.id, user)
    assert roles_in(acme) == {"bob": OWNER}


def test_no_one_leaves_their_personal_organisation(user):
    personal = personal_organisation(user.id)
    join(personal, make_user("bob"), OWNER)
    with pytest.raises(members.PersonalOwner, match="personal organisation always keeps its own user"):
        members.leave(personal.id, user)


@pytest.mark.parametrize("change", [
    lambda org, bob: members.change_role(org.id, bob.id, "admin"),
    lambda org, bob: members.remove(org.id, bob.id),
    lambda org, bob: members.leave(org.id, bob),
])
def test_changes_to_someone_who_is_not_a_member_are_refused(user, acme, change):
    with pytest.raises(members.NotMember):
        change(acme, make_user("bob"))


def test_a_role_outside_the_four_is_refused(user, acme):
    bob = make_user("bob")
    join(acme, bob, "viewer")
    with pytest.raises(ValueError, match="The roles are owner, admin, developer, viewer."):
        members.change_role(acme.id, bob.id, "superuser")
    assert roles_in(acme)["bob"] == "viewer"


def test_each_change_is_logged_with_who_acted(app, user, acme):
    """In a web request the logged-in user acted; from the command line (no request) no one did."""
    bob, carol = make_user("bob"), make_user("carol")
    join(acme, bob, "viewer")
    join(acme, carol, "developer")
    with app.app_context(), app.test_request_context():
        g.user = user
        members.change_role(acme.id, bob.id, "admin")
    members.remove(acme.id, carol.id, revoke_keys=True)
    members.leave(acme.id, bob)
    assert log_of(acme)[1:] == [
        ("member.role_changed", "bob: viewer to admin", "alice"),
        ("member.removed", "carol (developer); its keys revoked", None),
        ("member.left", "bob (admin)", "bob"),
    ]


def test_a_removed_members_keys_keep_working_and_are_revoked_together(user, acme):
    bob = make_user("bob")
    join(acme, bob, "developer")
    bobs = [keyactions.issue_key(bob, name, "development", org=acme.id) for name in ("one", "two")]
    _, bobs_personal = keyactions.issue_key(bob, "own", "development")
    alices_key, alices = keyactions.issue_key(user, "alice's", "development", org=acme.id)
    assert members.remove(acme.id, bob.id) == 0
    for _, secret in bobs:
        assert auth.authenticate(secret).user_id == bob.id
    assert members.former_members_keys(acme.id) == [(bob.id, "bob", 2)]
    assert members.revoke_keys_of(acme.id, bob.id) == 2
    assert all(ApiKey.get_by_id(key.id).revoked_at is not None for key, _ in bobs)
    assert auth.authenticate(alices).id == alices_key.id
    assert auth.authenticate(bobs_personal).user_id == bob.id
    assert members.former_members_keys(acme.id) == []
    assert members.revoke_keys_of(acme.id, bob.id) == 0


def test_removing_with_revoke_keys_revokes_what_the_member_made_there_only(user, acme):
    bob = make_user("bob")
    join(acme, bob, "developer")
    made, _ = keyactions.issue_key(bob, "one", "development", org=acme.id)
    _, elsewhere = keyactions.issue_key(bob, "own", "development")
    assert members.remove(acme.id, bob.id, revoke_keys=True) == 1
    assert ApiKey.get_by_id(made.id).revoked_at is not None
    assert auth.authenticate(elsewhere).user_id == bob.id


def test_removing_with_revoke_keys_is_one_transaction_announced_once_after_it(app, user, acme, monkeypatch):
    """A failure between two of the revocations leaves the member, its keys and the log as they
    were, and announces nothing; without one, the keys' change is announced once, committed."""
    bob = make_user("bob")
    join(acme, bob, "developer")
    made = [keyactions.issue_key(bob, name, "development", org=acme.id)[0] for name in ("one", "two")]
    announced = []
    monkeypatch.setattr(app.extensions["keys"], "announce_change",
                        lambda keys: announced.append((db.in_transaction(), sorted(key.id for key in keys))))

    def fail_at_the_second(event, key, **_):
        if key.id == made[1].id:
            raise RuntimeError("the database went away")

    with key_events.key_changed.connected_to(fail_at_the_second), pytest.raises(RuntimeError):
        members.remove(acme.id, bob.id, revoke_keys=True)
    assert roles_in(acme)["bob"] == "developer"
    assert ApiKey.active_in(acme.id, created_by=bob.id).count() == 2
    assert "member.removed" not in [event for event, _, _ in log_of(acme)]
    assert announced == []
    assert members.remove(acme.id, bob.id, revoke_keys=True) == 2
    assert "bob" not in roles_in(acme) and ApiKey.active_in(acme.id, created_by=bob.id).count() == 0
    assert announced == [(False, sorted(key.id for key in made))]


def test_a_deleted_creators_keys_are_listed_as_a_former_members(user, acme):
    bob = make_user("bob")
    join(acme, bob, "developer")
    keyactions.issue_key(bob, "one", "development", org=acme.id)
    organisations.delete_account(bob, "correct horse battery")
    assert members.former_members_keys(acme.id) == [(None, None, 1)]


def test_two_removals_of_the_two_owners_at_once_leave_one(app, user, acme, monkeypatch):
    """Each removal in its own thread and connection, both past their check of the other owner
    before either deletes: the organisation's row, held by the first, makes the second wait and
    see that it would remove the last owner."""
    bob = make_user("bob")
    join(acme, bob, OWNER)
    checked, refuse_last_owner = threading.Barrier(2), members.refuse_last_owner

    def check_then_linger(*args):
        refuse_last_owner(*args)
        try:
            checked.wait(timeout=1)  # without the lock, both get here and both pass
        except threading.BrokenBarrierError:
            pass  # with it, the second is waiting for the first's commit
        time.sleep(0.1)

    monkeypatch.setattr(members, "refuse_last_owner", check_then_linger)
    start, outcomes = threading.Barrier(2), {}

    def remove(target):
        with app.app_context(), db.connection_context():
            start.wait(timeout=10)
            try:
                members.remove(acme.id, target.id)
                outcomes[target.username] = "removed"
            except members.LastOwner:
                outcomes[target.username] = "refused"

    threads = [threading.Thread(target=remove, args=(target,)) for target in (user, bob)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(outcomes.values()) == ["refused", "removed"]
    assert list(roles_in(acme).values()) == [OWNER]
    assert SecurityEvent.select().where(SecurityEvent.event == "member.removed").count() == 1


def test_the_personal_organisation_comes_first_on_either_database(app, user):
    bob = make_user("bob")
    acme = members.create("Acme", bob)
    join(acme, user, "viewer")
    assert organisations.current_membership(user).org.personal_for_id == user.id
    assert [m.org.name for m in members.memberships_of(user)] == ["alice", "Acme"]


def test_a_personal_organisation_keeps_its_user_as_an_owner(app, user):
    bob = make_user("bob")
    personal = organisations.current_membership(user).org
    join(personal, bob, "owner")
    with pytest.raises(members.PersonalOwner):
        members.change_role(personal.id, user.id, "viewer", actor=bob)
    with pytest.raises(members.PersonalOwner):
        members.remove(personal.id, user.id, actor=bob)
    with pytest.raises(members.PersonalOwner):
        members.leave(personal.id, user)
    assert Membership.get((Membership.org == personal.id) & (Membership.user == user.id)).role == "owner"


def test_handing_organisations_over_does_not_reset_the_cap_on_making_them(app, user, monkeypatch):
    monkeypatch.setattr(members, "MAX_CREATED", 2)
    bob = make_user("bob")
    for name in ("One", "Two"):
        org = members.create(name, user)
        join(org, bob, "owner")
        members.leave(org.id, user)
    with pytest.raises(ValueError, match="may make 2 organisations"):
        members.create("Three", user)


def test_a_role_read_before_a_change_does_not_decide_it(app, user):
    """An admin's page showed the Remove button for a developer whom an owner has just made an owner."""
    acme = members.create("Acme", user)
    admin = make_user("adam")
    dev = make_user("devi")
    join(acme, admin, "admin")
    join(acme, dev, "developer")
    members.change_role(acme.id, dev.id, "owner", actor=user)
    with pytest.raises(members.NotAllowed):
        members.remove(acme.id, dev.id, actor=admin)
    members.change_role(acme.id, admin.id, "viewer", actor=user)
    with pytest.raises(members.NotAllowed):
        members.change_role(acme.id, dev.id, "viewer", actor=admin)
    assert Membership.get(Membership.user == dev.id, Membership.org == acme.id).role == "owner"


def test_a_member_who_may_no_longer_invite_leaves_no_invitation_behind(app, user):
    acme = members.create("Acme", user)
    admin = make_user("adam")
    join(acme, admin, "admin")
    invitation, _ = invitations.invite(acme.id, "alt@example.com", "admin", inviter=admin)
    members.remove(acme.id, admin.id, actor=user)
    assert Invitation.get_by_id(invitation.id).revoked_at is not None


def test_the_only_owner_of_a_team_is_told_why_the_account_stays(app, logged_in, user):
    bob = make_user("bob")
    acme = members.create("Acme", user)
    join(acme, bob, "developer")
    response = logged_in.post("/settings/profile/delete", data={"password": "correct horse battery"})
    assert response.status_code == 400 and b"only owner of Acme" in response.data
    assert Organisation.get_by_id(acme.id) is not None


def test_an_admin_cannot_flip_roles_fast_enough_to_push_its_deeds_out_of_the_log(app, user, monkeypatch):
    monkeypatch.setattr(members, "CHANGES_PER_HOUR", 4)
    acme = members.create("Acme", user)
    dev = make_user("devi")
    join(acme, dev, "developer")
    for role in ("viewer", "developer", "viewer", "developer"):
        members.change_role(acme.id, dev.id, role, actor=user)
    with pytest.raises(ValueError, match="4 times an hour"):
        members.change_role(acme.id, dev.id, "viewer", actor=user)


def test_revoking_the_keys_of_no_one_revokes_nothing(app, user):
    acme = members.create("Acme", user)
    keyactions.issue_key(user, "CI", "production", org=acme.id)
    with pytest.raises(ValueError):
        members.revoke_keys_of(acme.id, None)
    assert ApiKey.active_in(acme.id).count() == 1


def test_removing_with_the_keys_asks_for_both_under_the_lock(app, user, monkeypatch):
    acme = members.create("Acme", user)
    admin = make_user("adam")
    dev = make_user("devi")
    join(acme, admin, "admin")
    join(acme, dev, "developer")
    allows = members.roles.allows
    monkeypatch.setattr(members.roles, "allows",
                        lambda role, action, **context: (action != members.roles.MEMBER_REVOKE_KEYS
                                                         and allows(role, action, **context)))
    with pytest.raises(members.NotAllowed):
        members.remove(acme.id, dev.id, revoke_keys=True, actor=admin)
    assert Membership.get_or_none(Membership.org == acme.id, Membership.user == dev.id) is not None
