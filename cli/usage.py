"""The `usage` command group: a user's requests per UTC day."""

import csv
import io
import json

import click

from cli.commands import CommandGroup, find_user
from metering import analytics
from models import ApiKey, personal_organisation

usage_cli = CommandGroup("usage", help="Report API usage.")

REPORT_COLUMNS = ["day", "requests", "credits", *analytics.OUTCOMES]


@usage_cli.command("report")
@click.argument("username")
@click.option("--key", "key_id", type=int, help="One key of the user's (by id); all of them by default.")
@click.option("--days", default=analytics.DAYS, show_default=True, type=click.IntRange(1, 400),
              help="How many UTC days, today included.")
@click.option("--format", "output", default="table", show_default=True, type=click.Choice(["table", "json", "csv"]))
def usage_report_command(username, key_id, days, output):
    """Print the requests of a user's keys (or one key) per UTC day, oldest first, with the credits
    they spent and by outcome (table, csv), or by status and endpoint (json, the `daily` shape of
    GET /api/v1/usage/history)."""
    user = find_user(username)
    key_ids = [key.id for key in ApiKey.select(ApiKey.id).where(ApiKey.org == personal_organisation(user.id))]
    if key_id is not None:
        if key_id not in key_ids:
            raise click.ClickException(f"{username!r} has no API key with id {key_id}.")
        key_ids = [key_id]
    periods = analytics.daily(key_ids, days)
    if output == "json":
        click.echo(json.dumps(analytics.daily_json(periods), indent=2))
        return
    rows = [[period.start.isoformat(), period.requests, period.credits,
             *(period.by_outcome()[name] for name in analytics.OUTCOMES)] for period in periods]
    if output == "csv":
        text = io.StringIO()
        csv.writer(text, lineterminator="\n").writerows([REPORT_COLUMNS, *rows])
        click.echo(text.getvalue(), nl=False)
        return
    header = ["day", "requests", "credits spent", *analytics.OUTCOMES.values()]
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows)]
    for row in [header, *rows]:
        click.echo("  ".join(str(cell).rjust(width) if i else str(cell).ljust(width)
                             for i, (cell, width) in enumerate(zip(row, widths))).rstrip())
