"""The `webhooks` command group: add, list, remove and test an organisation's endpoints."""

import click
from flask import current_app

from ops.commands import CommandGroup, find_user
from orgs import roles
from orgs.commands import org_option, organisation_for
from webhooks import delivery, endpoints
from webhooks.models import FAILED, PENDING, WebhookEndpoint

webhooks_cli = CommandGroup("webhooks", help="Manage webhook endpoints.")
# What becomes of a test event that failed, by its message's state after the attempt (None: gone).
AFTER_A_FAILURE = {
    PENDING: "It is tried again on the retry schedule.",
    FAILED: "It is not tried again: the endpoint has been disabled.",
    None: "The endpoint was removed meanwhile.",
}


def find_endpoint(endpoint_id):
    endpoint = WebhookEndpoint.get_or_none(WebhookEndpoint.id == endpoint_id)
    if endpoint is None:
        raise click.ClickException(f"There is no webhook endpoint with id {endpoint_id}.")
    return endpoint


@webhooks_cli.command("add")
@click.argument("username")
@click.argument("url")
@click.option("--events", default="", metavar="E,E",
              help="The events to send (default, or *: every event, those of later releases included).")
@org_option
def add_command(username, url, events, org_slug):
    """Add a webhook endpoint to a user's personal organisation or --org's (where its role must allow
    it); its signing secret is printed alone on the last line."""
    user = find_user(username)
    org = organisation_for(user, org_slug, roles.WEBHOOK_MANAGE)
    try:
        endpoint, secret = endpoints.add_endpoint(user, url, events.split(","), org=org.id)
    except ValueError as error:
        raise click.ClickException(str(error)) from None
    where = f" in {org.slug}" if org_slug is not None else ""
    click.echo(f"Added webhook endpoint {endpoint.id} for {user.username}{where}: {endpoint.url} ({endpoint.events}). "
               "Its signing secret is shown only this once:")
    click.echo(secret)


@webhooks_cli.command("list")
@click.argument("username")
@org_option
def list_command(username, org_slug):
    """One line per endpoint of a user's personal organisation or --org's: ENDPOINT_ID, URL, events, state."""
    user = find_user(username)
    for endpoint in endpoints.owned(organisation_for(user, org_slug, roles.VIEW).id):
        click.echo(f"{endpoint.id}\t{endpoint.url}\t{endpoint.events}\t{endpoints.state(endpoint)}")


@webhooks_cli.command("remove")
@click.argument("endpoint_id", type=int)
def remove_command(endpoint_id):
    """Remove an endpoint, with its waiting messages."""
    endpoint = find_endpoint(endpoint_id)
    endpoints.remove_endpoint(endpoint)
    click.echo(f"Removed webhook endpoint {endpoint.id} ({endpoint.url}).")


@webhooks_cli.command("test")
@click.argument("endpoint_id", type=int)
def test_command(endpoint_id):
    """Send a webhook.test event now and say on one line how the endpoint answered; exit 1 when it
    failed (it is then tried again on the retry schedule, by the running service)."""
    try:
        message = endpoints.send_test(find_endpoint(endpoint_id))
    except ValueError as waiting:
        raise click.ClickException(str(waiting)) from None
    attempts = delivery.deliver_due(current_app._get_current_object(), limit=1, only=message.id)
    if not attempts:
        click.echo(f"Queued {message.message_id}; a running service is sending it.")
        return
    _, outcome, state = attempts[0]
    answer = f"HTTP {outcome.status}" if outcome.status is not None else outcome.error.rstrip(".")
    if not delivery.is_delivered(outcome):
        raise click.ClickException(f"{message.message_id} not delivered: {answer} ({outcome.duration_ms} ms). "
                                   f"{AFTER_A_FAILURE[state]}")
    click.echo(f"Delivered {message.message_id}: {answer} in {outcome.duration_ms} ms.")

