"""An organisation always has an owner: the last one cannot leave, be removed or lose the role, two
owners acting on each other at once leave one, admins cannot remove owners; and no one leaves a
personal organisation."""

import threading

import pytest
from teams import member_role, snapshot

from models import Membership


@pytest.fixture
def sole_owner(team, log_in):
    """olive as Acme's only owner: owen made an admin first."""
    assert log_in("olive").post(f"/settings/members/{team.people['owen'].id}/role",
                                data={"role": "admin"}).status_code == 302
    return log_in("olive")


@pytest.mark.parametrize("path, data", [
    ("/settings/members/leave", {}),
    ("/settings/members/{olive}/remove", {}),
    ("/settings/members/{olive}/role", {"role": "admin"}),
])
def test_the_last_owner_cannot_leave_be_removed_or_lose_the_role(team, sole_owner, path, data):
    before = snapshot()
    response = sole_owner.post(path.format(olive=team.people["olive"].id), data=data)
    assert response.status_code == 409
    assert "An organisation always has an owner" in response.text
    assert snapshot() == before


def test_no_one_leaves_a_personal_organisation(team, log_in):
    client = log_in("tess", org=None)
    response = client.post("/settings/members/leave")
    assert response.status_code == 409 and "A personal organisation always keeps its own user" in response.text
    assert "Leave this organisation" not in client.get("/settings/members").text


def test_two_owners_removing_each_other_one_after_the_other_leave_one(team, log_in):
    olive, owen = log_in("olive"), log_in("owen")
    assert olive.post(f"/settings/members/{team.people['owen'].id}/remove").status_code == 302
    # owen's page still showed olive; his session no longer works in Acme.
    assert owen.post(f"/settings/members/{team.people['olive'].id}/remove").status_code == 404
    assert member_role(team, "olive") == "owner"


def test_two_admins_cannot_remove_the_two_owners(team, log_in):
    adam = log_in("adam")
    Membership.update(role="admin").where(Membership.user == team.people["dora"].id).execute()
    dora = log_in("dora")
    before = snapshot()
    for admin, owner in [(adam, "olive"), (dora, "owen")]:
        assert admin.post(f"/settings/members/{team.people[owner].id}/remove").status_code == 403
        assert admin.post(f"/settings/members/{team.people[owner].id}/role", data={"role": "viewer"}).status_code == 403
    assert snapshot() == before


@pytest.mark.parametrize("action, data", [("remove", {}), ("role", {"role": "admin"})])
def test_two_owners_acting_on_each_other_at_once_leave_an_owner(team, log_in, action, data):
    people = team.people
    clients = {name: log_in(name) for name in ("olive", "owen")}
    targets = {"olive": people["owen"].id, "owen": people["olive"].id}
    start = threading.Barrier(2)
    statuses = {}

    def act(name):
        start.wait()
        statuses[name] = clients[name].post(f"/settings/members/{targets[name]}/{action}", data=data).status_code

    threads = [threading.Thread(target=act, args=(name,)) for name in clients]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # One of them made the change; the other found itself the last owner (409), or no longer an
    # owner (403) or a member (404) when its request came after the change.
    assert sorted(statuses.values())[0] == 302 and list(statuses.values()).count(302) == 1, statuses
    owners = Membership.select().where((Membership.org == team.acme.id) & (Membership.role == "owner")).count()
    assert owners == 1


def test_the_last_owner_is_offered_neither_leave_nor_a_role_change_and_the_refusal_keeps_the_invite_form(
        team, log_in, sole_owner):
    olive = team.people["olive"].id
    page = sole_owner.get("/settings/members").text
    assert f'/settings/members/{olive}/role"' not in page and "Leave this organisation" not in page
    assert "You are the only owner of Acme: make another member an owner before you leave." in page
    refused = sole_owner.post(f"/settings/members/{olive}/role", data={"role": "viewer"})
    assert refused.status_code == 409
    # The invitation form keeps its own default, not the role the refused form asked for.
    assert '<option value="developer" selected>' in refused.text
    assert '<option value="viewer" selected>' not in refused.text
    two_owners = log_in("olive")
    owen = team.people["owen"].id
    assert two_owners.post(f"/settings/members/{owen}/role", data={"role": "owner"}).status_code == 302
    page = two_owners.get("/settings/members").text
    assert f'/settings/members/{olive}/role"' in page and "Leave this organisation" in page


def test_no_one_is_offered_a_role_change_of_a_personal_organisation_s_own_user(team, log_in):
    page = log_in("tess", org=None).get("/settings/members").text
    assert f'/settings/members/{team.people["tess"].id}/role"' not in page
