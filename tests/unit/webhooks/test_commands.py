"""The webhook commands in an organisation (--org): an endpoint added there by a member whose role
allows it, and listed for any member; without --org, the user's personal organisation as before."""

import pytest

from accounts import users
from models import Membership, personal_organisation
from orgs import members
from webhooks.models import WebhookEndpoint

URL = "http://127.0.0.1:9/hook"


@pytest.fixture
def app(make_app, database_url):
    app = make_app({"DATABASE_URL": database_url, "RATELIMIT_STORAGE_URL": "memory://", "TESTING": True,
                    "WEBHOOK_ALLOW_PRIVATE": True})
    with app.app_context():
        yield app


@pytest.fixture
def acme(app):
    """Acme, owned by alice, with bob an admin and carol a developer."""
    alice = users.create_user("alice", "alice@example.com", "correct horse battery")
    org = members.create("Acme", alice)
    for name, role in [("bob", "admin"), ("carol", "developer")]:
        made = users.create_user(name, f"{name}@example.com", "correct horse battery")
        Membership.create(org=org.id, user=made.id, role=role)
    return org


def test_add_with_org_adds_the_endpoint_there_and_any_member_lists_it(runner, acme):
    added = runner.invoke(args=["webhooks", "add", "bob", URL, "--events", "key.created", "--org", "acme"])
    assert added.exit_code == 0, added.output
    endpoint = WebhookEndpoint.get()
    assert endpoint.org_id == acme.id
    assert added.stdout.splitlines()[0] == (f"Added webhook endpoint {endpoint.id} for bob in acme: {URL} (key.created). "
                                            "Its signing secret is shown only this once:")
    listed = runner.invoke(args=["webhooks", "list", "carol", "--org", "acme"])
    assert listed.stdout == f"{endpoint.id}\t{URL}\tkey.created\tactive\n"
    assert runner.invoke(args=["webhooks", "list", "bob"]).stdout == ""


def test_without_org_the_personal_organisation_is_used_as_before(runner, acme):
    added = runner.invoke(args=["webhooks", "add", "alice", URL])
    endpoint = WebhookEndpoint.get()
    assert added.stdout.splitlines()[0] == (f"Added webhook endpoint {endpoint.id} for alice: {URL} (*). Its signing "
                                            "secret is shown only this once:")
    assert endpoint.org_id == personal_organisation(users.find_user("alice").id).id
    assert runner.invoke(args=["webhooks", "list", "alice"]).stdout == f"{endpoint.id}\t{URL}\t*\tactive\n"


@pytest.mark.parametrize("args, message", [
    (["add", "carol", URL, "--org", "acme"], "carol is developer of acme; a developer cannot add webhook endpoints."),
    (["add", "dave", URL, "--org", "acme"], "dave is not a member of acme."),
    (["add", "bob", URL, "--org", "nope"], "There is no organisation with the slug 'nope'."),
    (["list", "dave", "--org", "acme"], "dave is not a member of acme."),
])
def test_the_users_membership_and_role_are_asked(runner, acme, args, message):
    users.create_user("dave", "dave@example.com", "correct horse battery")
    result = runner.invoke(args=["webhooks", *args])
    assert (result.exit_code, result.stderr, result.stdout) == (1, f"Error: {message}\n", "")
    assert WebhookEndpoint.select().count() == 0
