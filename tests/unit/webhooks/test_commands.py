"""cli/webhooks.py: endpoints added, listed, tested and removed from the command line, each
refusal a sentence, at most ten an account; in an organisation (--org), an endpoint added there by
a member whose role allows it and listed for any member; without --org, the user's personal
organisation."""

import re

import pytest
from teams import make_org

from accounts import users
from models import SecurityEvent, personal_organisation
from orgs import keyactions
from webhooks import endpoints
from webhooks.models import PENDING, WebhookEndpoint, WebhookMessage

URL = "http://127.0.0.1:9/hook"


@pytest.fixture
def acme(app):
    """Acme, owned by alice, with bob an admin and carol a developer."""
    alice = users.create_user("alice", "alice@example.com", "correct horse battery")
    return make_org("Acme", alice, {"bob": "admin", "carol": "developer"})


def test_add_with_org_adds_the_endpoint_there_and_any_member_lists_it(runner, acme):
    added = runner.invoke(args=["webhooks", "add", "bob", URL, "--events", "key.created", "--org", "acme"])
    assert added.exit_code == 0, added.output
    endpoint = WebhookEndpoint.get()
    assert endpoint.org_id == acme.id
    assert added.stdout.splitlines()[0] == (f"Added webhook endpoint {endpoint.id} for bob in acme: {URL} "
                                            "(key.created). Its signing secret is shown only this once:")
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


def test_the_cli_adds_lists_tests_and_removes_endpoints(app, runner, user, receiver):
    added = runner.invoke(args=["webhooks", "add", "alice", f"{receiver.url}/cli", "--events",
                                "key.revoked,key.created"])
    assert added.exit_code == 0, added.output
    secret = added.output.strip().splitlines()[-1]
    assert re.fullmatch(r"whsec_[A-Za-z0-9+/]{32}", secret)
    receiver.secrets["/cli"] = secret
    endpoint = WebhookEndpoint.get()
    listed = runner.invoke(args=["webhooks", "list", "alice"])
    assert listed.output == f"{endpoint.id}\t{receiver.url}/cli\tkey.created,key.revoked\tactive\n"
    assert secret not in listed.output and secret[6:] not in listed.output
    tested = runner.invoke(args=["webhooks", "test", str(endpoint.id)])
    assert tested.exit_code == 0 and "Delivered msg_" in tested.output and "HTTP 204" in tested.output
    assert receiver.received()[0].verified["type"] == "webhook.test"
    removed = runner.invoke(args=["webhooks", "remove", str(endpoint.id)])
    assert removed.exit_code == 0 and WebhookEndpoint.select().count() == 0
    assert [event.event for event in SecurityEvent.select().order_by(SecurityEvent.id)][-2:] == [
        "webhook.added", "webhook.removed"]


def test_the_cli_subscribes_to_every_event_without_events_and_accepts_webhook_test(app, runner, user, receiver):
    for path, events, shown in [("/all", [], "*"), ("/star", ["--events", "*"], "*"),
                                ("/tests", ["--events", "webhook.test"], "webhook.test")]:
        added = runner.invoke(args=["webhooks", "add", "alice", f"{receiver.url}{path}", *events])
        assert added.exit_code == 0 and f"{receiver.url}{path} ({shown}). Its signing" in added.output, added.output
        receiver.secrets[path] = added.output.strip().splitlines()[-1]
    everything, star, tests_only = endpoints.owned(user)
    added = SecurityEvent.select().where(SecurityEvent.event == "webhook.added").order_by(SecurityEvent.id)
    assert [event.detail for event in added] == [
        f"{receiver.url}/all (id {everything.id}; all events)", f"{receiver.url}/star (id {star.id}; all events)",
        f"{receiver.url}/tests (id {tests_only.id}; webhook.test)"]
    assert runner.invoke(args=["webhooks", "list", "alice"]).output == (
        f"{everything.id}\t{receiver.url}/all\t*\tactive\n{star.id}\t{receiver.url}/star\t*\tactive\n"
        f"{tests_only.id}\t{receiver.url}/tests\twebhook.test\tactive\n")
    keyactions.issue_key(user, "Laptop", "production")
    assert sorted(message.endpoint_id for message in WebhookMessage.select()) == [everything.id, star.id]
    tested = runner.invoke(args=["webhooks", "test", str(tests_only.id)])
    assert tested.exit_code == 0 and "Delivered msg_" in tested.output, tested.output
    assert [sent.verified["type"] for sent in receiver.received("/tests")] == ["webhook.test"]


def test_the_cli_says_why_it_refuses(app, runner, user):
    app.config["WEBHOOK_ALLOW_PRIVATE"] = False
    for args, sentence in [
        (["webhooks", "add", "alice", "http://127.0.0.1/"], "Webhooks are not sent to 127.0.0.1"),
        (["webhooks", "add", "alice", "https://93.184.216.34/", "--events", "key.exploded"], "Unknown event"),
        (["webhooks", "add", "nobody", "https://93.184.216.34/"], "There is no user named 'nobody'"),
        (["webhooks", "remove", "999"], "There is no webhook endpoint with id 999"),
        (["webhooks", "test", "999"], "There is no webhook endpoint with id 999"),
    ]:
        result = runner.invoke(args=args)
        assert result.exit_code == 1 and sentence in result.output, result.output


def test_the_cli_test_of_a_failing_endpoint_exits_1_and_leaves_it_to_the_schedule(app, runner, user, receiver):
    receiver.answer = lambda sent: 500
    endpoint, _ = endpoints.add_endpoint(user, f"{receiver.url}/down")
    result = runner.invoke(args=["webhooks", "test", str(endpoint.id)])
    assert result.exit_code == 1 and "not delivered: HTTP 500" in result.output
    assert WebhookMessage.get().state == PENDING


def test_an_account_has_at_most_ten_endpoints(app, user, receiver):
    for n in range(endpoints.MAX_ENDPOINTS):
        endpoints.add_endpoint(user, f"{receiver.url}/{n}")
    with pytest.raises(endpoints.EndpointCapReached, match="10 webhook endpoints"):
        endpoints.add_endpoint(user, f"{receiver.url}/eleven")
