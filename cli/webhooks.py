"""The `webhooks` command group: add, list, change, pause, resume, remove and test an organisation's
endpoints; list their messages and attempts, resend a message, recover failed ones, rotate a signing secret."""

import datetime

import click
from flask import current_app

from cli.commands import CommandGroup, find_user
from cli.orgs import org_option, organisation_for
from models import iso_seconds
from orgs import roles
from orgs.keyactions import parse_duration
from webhooks import delivery, endpoints, messagelog, recovery
from webhooks.models import FAILED, PENDING, WebhookEndpoint

webhooks_cli = CommandGroup("webhooks", help="Manage webhook endpoints.")
# What becomes of a message whose attempt failed, by its state after the attempt (None: gone), and
# whether its endpoint is disabled.
AFTER_A_FAILURE = {
    (PENDING, False): "It is tried again on the retry schedule.",
    (FAILED, True): "It is not tried again: the endpoint has been disabled.",
    (FAILED, False): "It is not tried again: its retry schedule is spent.",
    (None, False): "The endpoint was removed meanwhile.",
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


@webhooks_cli.command("update")
@click.argument("endpoint_id", type=int)
@click.option("--url", help="A new URL, checked as a new endpoint's.")
@click.option("--events", metavar="E,E", help="The events to send ('' or *: every event).")
@click.option("--description", help="What the endpoint is for ('' for nothing).")
def update_command(endpoint_id, url, events, description):
    """Change an endpoint's URL, events or description; its secret, messages and attempts stay."""
    if url is None and events is None and description is None:
        raise click.ClickException("Name what to change: --url, --events or --description.")
    endpoint = find_endpoint(endpoint_id)
    try:
        changed = endpoints.update_endpoint(endpoint, url=url, events=None if events is None else events.split(","),
                                            description=description)
    except ValueError as error:
        raise click.ClickException(str(error)) from None
    if not changed:
        click.echo(f"Webhook endpoint {endpoint.id} already has these; nothing changed.")
        return
    click.echo(f"Changed {', '.join(changed)} of webhook endpoint {endpoint.id}.")


@webhooks_cli.command("pause")
@click.argument("endpoint_id", type=int)
def pause_command(endpoint_id):
    """Pause an endpoint: its messages wait, neither attempted nor failed, until it is resumed (at
    most the week messages are kept)."""
    endpoint = find_endpoint(endpoint_id)
    if not endpoints.pause_endpoint(endpoint):
        click.echo(f"Webhook endpoint {endpoint.id} was already paused.")
        return
    click.echo(f"Paused webhook endpoint {endpoint.id} ({endpoint.url}); its messages wait until it is resumed.")


@webhooks_cli.command("resume")
@click.argument("endpoint_id", type=int)
def resume_command(endpoint_id):
    """Resume a paused endpoint: its waiting messages go out in the order they were made."""
    endpoint = find_endpoint(endpoint_id)
    if not endpoints.resume_endpoint(endpoint):
        click.echo(f"Webhook endpoint {endpoint.id} was not paused.")
        return
    click.echo(f"Resumed webhook endpoint {endpoint.id} ({endpoint.url}); its waiting messages go out now.")


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
    attempt_now(message)


def attempt_now(message):
    """Make the message's attempt here and now, and say on one line how the endpoint answered
    (exit 1 when it failed); when a running service claimed it first, say so."""
    attempts = delivery.deliver_due(current_app._get_current_object(), limit=1, only=message.id)
    if not attempts:
        click.echo(f"Queued {message.message_id}; a running service is sending it.")
        return
    _, outcome, state = attempts[0]
    answer = f"HTTP {outcome.status}" if outcome.status is not None else outcome.error.rstrip(".")
    if not delivery.is_delivered(outcome):
        disabled = WebhookEndpoint.select().where((WebhookEndpoint.id == message.endpoint_id)
                                                  & WebhookEndpoint.disabled_at.is_null(False)).exists()
        raise click.ClickException(f"{message.message_id} not delivered: {answer} ({outcome.duration_ms} ms). "
                                   f"{AFTER_A_FAILURE[state, disabled and state == FAILED]}")
    click.echo(f"Delivered {message.message_id}: {answer} in {outcome.duration_ms} ms.")


@webhooks_cli.command("attempts")
@click.argument("endpoint_id", type=int)
def attempts_command(endpoint_id):
    """The endpoint's last attempts, newest first, one a line: webhook-id, time, event, result, attempt number."""
    for attempt in endpoints.recent_attempts(find_endpoint(endpoint_id)):
        click.echo(recovery.attempt_line(attempt))


@webhooks_cli.command("messages")
@click.argument("endpoint_id", type=int)
@click.option("--state", type=click.Choice(messagelog.STATES), help="Only the messages in this state.")
def messages_command(endpoint_id, state):
    """The endpoint's kept messages, newest first, one a line: webhook-id, time, event, state,
    attempts, next attempt (- for none)."""
    endpoint = find_endpoint(endpoint_id)
    before = None
    while True:
        shown, older = messagelog.page(endpoint.id, state, before)
        for message in shown:
            click.echo(messagelog.line(message))
        if not older:
            return
        before = shown[-1].id


@webhooks_cli.command("resend")
@click.argument("webhook_id")
def resend_command(webhook_id):
    """Send a message (its webhook-id, msg_...) again now, whatever its state, and say how the
    endpoint answered; at most 10 resends a minute per endpoint."""
    message = recovery.find_message(webhook_id.strip())
    if message is None:
        raise click.ClickException(f"There is no kept webhook message {webhook_id!r} (messages are kept "
                                   "for a week after they were made).")
    try:
        recovery.resend(message)
    except ValueError as refused:
        raise click.ClickException(str(refused)) from None
    attempt_now(message)


@webhooks_cli.command("recover")
@click.argument("endpoint_id", type=int)
@click.option("--since", required=True, metavar="TIME",
              help="An ISO 8601 time (UTC unless it says), or a duration back from now: 24h, 90m, 7d.")
def recover_command(endpoint_id, since):
    """Try every message of the endpoint that failed, made since TIME, again from the start of the
    retry schedule (the running service sends them); print how many."""
    endpoint = find_endpoint(endpoint_id)
    try:
        moment = recovery.since_moment(since)
    except ValueError as error:
        raise click.ClickException(str(error)) from None
    count = recovery.recover(endpoint, moment)
    click.echo(f"Recovering {count} failed message{'' if count == 1 else 's'} of endpoint {endpoint.id} "
               f"made since {iso_seconds(moment)}.")


@webhooks_cli.command("rotate")
@click.argument("endpoint_id", type=int)
@click.option("--overlap", default="24h", show_default=True, metavar="DURATION",
              help="How long the old secret signs beside the new one: 24h, 90m, up to 7d, or 0 for not at all.")
def rotate_command(endpoint_id, overlap):
    """Give the endpoint a new signing secret, printed once, alone on the last line."""
    endpoint = find_endpoint(endpoint_id)
    try:
        seconds = parse_duration(overlap, allow_never=False)
        secret, until = endpoints.rotate_secret(endpoint, datetime.timedelta(seconds=seconds))
    except ValueError as error:
        raise click.ClickException(str(error)) from None
    old = f"the old secret signs too until {iso_seconds(until)}" if until else "the old secret no longer signs"
    click.echo(f"Rotated the signing secret of webhook endpoint {endpoint.id} ({endpoint.url}); {old}. "
               "The new secret is shown only this once:")
    click.echo(secret)

