"""The `users` command group: create a user, set a user's password."""

import sys

import click

from accounts import users
from cli.commands import CommandGroup, find_user

users_cli = CommandGroup("users", help="Manage users.")


def has_terminal():
    return sys.stdin.isatty()


@users_cli.command("create")
@click.argument("username")
@click.option("--email", required=True, help="The user's email address.")
@click.option("--password-stdin", is_flag=True, help="Read the password from the first line of stdin.")
def create_user_command(username, email, password_stdin):
    """Create a user."""
    password = new_password(password_stdin)
    try:
        user = users.create_user(username, email, password)
    except ValueError as error:
        raise click.ClickException(str(error)) from None
    click.echo(f"Created user {user.username} (id {user.id}).")


@users_cli.command("set-password")
@click.argument("username")
@click.option("--password-stdin", is_flag=True, help="Read the password from the first line of stdin.")
def set_password_command(username, password_stdin):
    """Set a user's password: its sessions end and its reset links stop working."""
    user = find_user(username)
    try:
        users.change_password(user, None, new_password(password_stdin), checked=False)
    except ValueError as error:
        raise click.ClickException(str(error)) from None
    click.echo(f"Set the password of {user.username}; its sessions and reset links have ended.")


def new_password(from_stdin):
    if from_stdin:
        return sys.stdin.readline().rstrip("\r\n")
    if not has_terminal():
        raise click.ClickException("No terminal to prompt for a password; use --password-stdin.")
    # Judged before it is asked again: a refused password is not typed twice for nothing.
    return click.prompt("Password", hide_input=True, confirmation_prompt=True, value_proc=allowed_password)


def allowed_password(password):
    """The password typed at the prompt, or click's UsageError with the sentence (it asks again)."""
    try:
        users.check_new_password(password)
    except ValueError as error:
        raise click.UsageError(str(error)) from None
    return password
