"""What an account's life does to its organisations: the personal one made at sign-up, and on
deletion the keys it made elsewhere kept working, the organisations it alone belonged to gone."""

import pytest

from accounts import securitylog, users
from models import ApiKey, Membership, Organisation, SecurityEvent, User
from orgs import keyactions, organisations
from webhooks import endpoints
from webhooks.models import WebhookEndpoint

PASSWORD = "correct horse battery"


def team(owner, *members, name="Acme"):
    """An organisation owned by owner with the other (user, role) members."""
    org = Organisation.create(name=name, slug=name.lower())
    Membership.create(org=org, user=owner, role="owner")
    for user, role in members:
        Membership.create(org=org, user=user, role=role)
    return org


def test_every_account_gets_a_personal_organisation_named_after_it(app):
    alice = users.create_user("Alice.B", "alice@example.com", PASSWORD)
    Organisation.create(name="taken", slug="bob")
    bob = users.create_user("bob", "bob@example.com", PASSWORD)
    assert [(org.name, org.slug) for org in Organisation.select().where(Organisation.personal_for.is_null(False))
            .order_by(Organisation.id)] == [("Alice.B", "alice-b"), ("bob", "bob-2")]
    assert [(m.user_id, m.role) for m in Membership.select().where(Membership.user.in_([alice.id, bob.id]))] == [
        (alice.id, "owner"), (bob.id, "owner")]


def test_a_deleted_account_s_keys_in_a_team_keep_working_and_its_own_organisation_goes(app, client, user):
    bob = users.create_user("bob", "bob@example.com", PASSWORD)
    acme = team(user, (bob, "developer"))
    _, team_secret = keyactions.issue_key(bob, "CI", "production", org=acme.id)
    _, own_secret = keyactions.issue_key(bob, "Mine", "production")
    app.config["WEBHOOK_ALLOW_PRIVATE"] = True
    own_endpoint, _ = endpoints.add_endpoint(bob, "http://127.0.0.1:9/hook")
    organisations.delete_account(bob, PASSWORD)
    assert client.get("/api/v1/protected/test", headers={"X-API-Key": team_secret}).status_code == 200
    assert client.get("/api/v1/protected/test", headers={"X-API-Key": own_secret}).status_code == 401
    me = client.get("/api/v1/user/me", headers={"X-API-Key": team_secret}).json
    assert me == {"user_id": None, "username": None, "email": None, "created_at": None, "api_key_count": 0}
    assert ApiKey.get(ApiKey.name == "CI").user_id is None
    assert WebhookEndpoint.get_or_none(WebhookEndpoint.id == own_endpoint.id) is None
    assert not Organisation.select().where(Organisation.name == "bob").exists()
    assert [m.user_id for m in Membership.select().where(Membership.org == acme.id)] == [user.id]


def test_the_only_owner_of_a_team_cannot_delete_the_account(app, user):
    bob = users.create_user("bob", "bob@example.com", PASSWORD)
    acme = team(user, (bob, "admin"))
    with pytest.raises(organisations.SoleOwner, match="only owner of Acme"):
        organisations.delete_account(user, PASSWORD)
    assert User.get_or_none(User.id == user.id) is not None
    Membership.update(role="owner").where(Membership.user == bob.id).execute()
    organisations.delete_account(user, PASSWORD)
    assert [m.user_id for m in Membership.select().where(Membership.org == acme.id)] == [bob.id]


def test_the_team_log_keeps_what_a_deleted_member_did_without_naming_it(app, user):
    bob = users.create_user("bob", "bob@example.com", PASSWORD)
    acme = team(user, (bob, "admin"))
    securitylog.record_in(acme.id, "member.invited", "carol@example.com as viewer", actor_id=bob.id)
    organisations.delete_account(bob, PASSWORD)
    [event] = securitylog.recent_in(acme.id)
    assert (event.event, event.user_id) == ("member.invited", None)
    assert not SecurityEvent.select().where(SecurityEvent.user == bob.id).exists()


def test_an_account_s_own_log_keeps_its_size_without_touching_what_it_did_in_a_team(app, user, monkeypatch):
    monkeypatch.setattr(securitylog, "KEPT", 3)
    acme = team(user)
    for number in range(3):
        securitylog.record_in(acme.id, "member.invited", f"guest{number}@example.com as viewer", actor_id=user.id)
    for _ in range(4):
        securitylog.record(user.id, "user.login")
    assert [event.event for event in securitylog.recent_in(acme.id)] == ["member.invited"] * 3
    assert SecurityEvent.select().where((SecurityEvent.user == user.id) & SecurityEvent.org.is_null()).count() == 3


def test_a_session_works_in_the_personal_organisation_until_another_is_chosen(app, user):
    """The personal one comes first on PostgreSQL too, where a team's NULL personal_for compared
    with the user's id would sort before it."""
    bob = users.create_user("bob", "bob@example.com", PASSWORD)
    acme = team(bob, (user, "viewer"))
    assert organisations.current_membership(user).org.personal_for_id == user.id
    assert organisations.current_membership(user, session_org_id=acme.id).org_id == acme.id
    Membership.delete().where((Membership.org == acme.id) & (Membership.user == user.id)).execute()
    assert organisations.current_membership(user, session_org_id=acme.id).org.personal_for_id == user.id
