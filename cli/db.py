"""The `db` command group: bring the schema up to date, prune what is past its retention."""

import click
from flask import current_app

from cli.commands import CommandGroup
from metering import lifecycle

db_cli = CommandGroup("db", help="Manage the database.")


@db_cli.command("upgrade")
def upgrade_command():
    """Bring the database's schema up to date (start-up does it too)."""
    before, after = current_app.extensions["schema"]
    if before == after:
        click.echo(f"The database is at schema version {after}, the latest.")
    else:
        click.echo(f"Upgraded the database from schema version {before} to {after}.")


@db_cli.command("prune")
def prune_command():
    """Delete usage rows, revoked or expired keys and sessions past their retention, now."""
    # With the background prune's pauses between batches: running servers' writes get their turn.
    click.echo(lifecycle.prune(current_app.config, pause=lifecycle.PAUSE_SECONDS).sentence())
