"""The `billing` command group: what the export stands at, the CloudEvents of any hours, and
sending an organisation's hours again."""

import collections
import json

import click
from flask import current_app

from billing import closing, customers, targets
from cli.commands import CommandGroup
from cli.orgs import find_organisation
from models import Organisation, iso_seconds, start_of_hour, utcnow

billing_cli = CommandGroup("billing", help="Follow and repair the usage export to the billing system.")
ExportedEvent = collections.namedtuple("ExportedEvent", "identifier api_key_id meter customer hour value")


def parsed_time(text):
    try:
        return customers.parse_time(text)
    except ValueError as refused:
        raise click.ClickException(str(refused)) from None


@billing_cli.command("status")
def status_command():
    """One line per exported organisation: slug, customer, last hour sent, hours pending, hours failed."""
    rows = customers.status(current_app.config["BILLING_EXPORT"])
    if not rows:
        click.echo("No organisation is exported: give one a billing customer (orgs billing SLUG --customer ID).")
        return
    click.echo(f"Export: {current_app.config['BILLING_EXPORT']}")
    for row in rows:
        last = iso_seconds(row.last_sent) if row.last_sent else "none"
        customer = row.customer or f"none (removed: its hours until {iso_seconds(row.until)} still go out)"
        click.echo(f"{row.slug}  customer {customer}  last hour sent {last}  "
                   f"pending {row.pending}  failed {row.failed}")


@billing_cli.command("export")
@click.option("--since", required=True, metavar="TIME", help="The first hour, UTC (2026-11-28T10).")
@click.option("--until", metavar="TIME", help="The end, UTC, not included (default: the start of the last hour "
              "closed, 2 minutes after its end).")
@click.option("--org", "org_slug", metavar="SLUG", help="Only this organisation.")
def export_command(since, until, org_slug):
    """Print the CloudEvents of those hours, one JSON object a line, whatever BILLING_EXPORT says.
    An organisation without a billing customer has its slug as the subject."""
    start = start_of_hour(parsed_time(since))
    end = parsed_time(until) if until else start_of_hour(utcnow() - closing.CLOSE_AFTER)
    orgs = [find_organisation(org_slug)] if org_slug else list(Organisation.select().order_by(Organisation.id))
    config = current_app.config
    meters = closing.meters_of(config)
    for org in orgs:
        customer = customers.customer_of(org.id)
        subject = customer.customer if customer else org.slug
        for event in closing.events("cloudevents", org.id, closing.totals(org.id, start, end), meters):
            exported = ExportedEvent(event.identifier, event.api_key_id, event.meter, subject, event.hour, event.value)
            click.echo(json.dumps(targets.cloudevent(exported, targets.source_of(config), org.slug),
                                  separators=(",", ":")))


@billing_cli.command("resend")
@click.option("--org", "org_slug", required=True, metavar="SLUG", help="The organisation.")
@click.option("--since", required=True, metavar="TIME", help="The first hour, UTC (2026-11-28T10).")
def resend_command(org_slug, since):
    """Send the organisation's failed hours from TIME again, and the hours never sent (before it had
    a customer); hours accepted already are not sent twice."""
    org = find_organisation(org_slug)
    if current_app.config["BILLING_EXPORT"] == "off":
        raise click.ClickException("BILLING_EXPORT is off: set it to the billing system before resending.")
    try:
        due = customers.resend(current_app.config, org.id, parsed_time(since))
    except ValueError as refused:
        raise click.ClickException(str(refused)) from None
    click.echo(f"{due} billing event{'' if due == 1 else 's'} of {org.slug} due now; "
               "the serving processes send them.")
