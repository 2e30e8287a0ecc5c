"""The operator's command line (`flask --app app ...`): users and API keys."""

import sys

import click
from flask import current_app
from flask.cli import AppGroup

import accounts
import auth
from models import DATABASE_ERRORS, ApiKey


class CommandGroup(AppGroup):
    """Commands whose database cannot be reached or written end with a sentence, not a traceback."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except DATABASE_ERRORS as error:
            raise click.ClickException(f"The database cannot be used right now: {error}") from None


users_cli = CommandGroup("users", help="Manage users.")
keys_cli = CommandGroup("keys", help="Manage API keys.")


def find_user(username):
    if accounts.CONTROL_CHARACTERS.search(username):
        raise click.ClickException("A username cannot contain control characters.")
    user = accounts.find_user(username)
    if user is None:
        raise click.ClickException(f"There is no user named {username!r}.")
    return user


def has_terminal():
    return sys.stdin.isatty()


@users_cli.command("create")
@click.argument("username")
@click.option("--email", required=True, help="The user's email address.")
@click.option("--password-stdin", is_flag=True, help="Read the password from the first line of stdin.")
def create_user_command(username, email, password_stdin):
    """Create a user."""
    if password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    elif not has_terminal():
        raise click.ClickException("No terminal to prompt for a password; use --password-stdin.")
    else:
        password = click.prompt("Password", hide_input=True, confirmation_prompt=True)
    try:
        user = accounts.create_user(username, email, password)
    except ValueError as error:
        raise click.ClickException(str(error)) from None
    click.echo(f"Created user {user.username} (id {user.id}).")


@keys_cli.command("create")
@click.argument("username")
@click.option("--name", required=True, help="A name for the key.")
@click.option("--type", "key_type", required=True, type=click.Choice(sorted(auth.KEY_PREFIXES)))
@click.option("--tier", default="free", show_default=True, help="A tier of RATE_LIMIT_TIERS.")
def create_key_command(username, name, key_type, tier):
    """Create an API key; its secret is printed once, alone on the last line."""
    user = find_user(username)
    try:
        key, secret = auth.issue_key(user, name, key_type, tier)
    except ValueError as error:
        raise click.ClickException(str(error)) from None
    click.echo(f"Created {key.key_type} key {key.name!r} (id {key.id}) for {user.username}.")
    click.echo("Copy the secret now; it is not stored and cannot be shown again:")
    click.echo(secret)


@keys_cli.command("list")
@click.argument("username")
def list_keys_command(username):
    """List a user's keys: id, name, type, prefix, tier, status (tab-separated; never the secret)."""
    user = find_user(username)
    for key in ApiKey.select().where(ApiKey.user == user).order_by(ApiKey.id):
        state = "revoked" if key.revoked_at else "active"
        fields = (key.id, key.name, key.key_type, f"{key.display_prefix}...", key.rate_limit_tier, state)
        click.echo("\t".join(map(str, fields)))


@keys_cli.command("revoke")
@click.argument("key_id", type=int)
def revoke_key_command(key_id):
    """Revoke a key; it fails from the next request on."""
    key = ApiKey.get_or_none(ApiKey.id == key_id)
    if key is None:
        raise click.ClickException(f"There is no API key with id {key_id}.")
    if key.revoked_at:
        click.echo(f"Key {key_id} was already revoked.")
        return
    auth.revoke_key(key)
    click.echo(f"Revoked key {key_id} ({key.name!r}).")


db_cli = CommandGroup("db", help="Manage the database.")


@db_cli.command("upgrade")
def upgrade_command():
    """Bring the database's schema up to date (start-up does it too)."""
    before, after = current_app.extensions["schema"]
    if before == after:
        click.echo(f"The database is at schema version {after}, the latest.")
    else:
        click.echo(f"Upgraded the database from schema version {before} to {after}.")
