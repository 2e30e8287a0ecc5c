"""The `audit` command: an account's or an organisation's security log."""

import click

from accounts import securitylog
from cli.commands import Command, find_user
from cli.orgs import find_organisation
from models import iso_seconds
from ops import logs


@click.command("audit", cls=Command)
@click.argument("username", required=False)
@click.option("--org", "org_slug", metavar="SLUG", help="Print this organisation's log instead of an account's.")
def audit_command(username, org_slug):
    """Print an account's security log (its own events and its personal organisation's) or, with
    --org, an organisation's, newest first: ISO time, event, client IP, detail (tab-separated); an
    organisation's lines end with who acted (- for the command line or the service itself)."""
    if (username is None) == (org_slug is None):
        raise click.ClickException("Give either USERNAME or --org SLUG.")
    if org_slug is None:
        events = securitylog.recent(find_user(username).id, limit=None)
    else:
        events = securitylog.recent_in(find_organisation(org_slug).id, limit=None)
    for event in events:
        # Rows written before client addresses were checked may hold whatever a client forwarded.
        fields = [iso_seconds(event.created_at), event.event, logs.escape_controls(event.ip),
                  logs.escape_controls(event.detail)]
        if org_slug is not None:
            fields.append(event.user.username if event.user is not None else "-")
        click.echo("\t".join(fields))
