"""What every command group of the operator's command line (`flask --app app ...`) shares: a
sentence instead of a traceback when the database or the servers cannot be reached, users named
by their username, and the note that a key change may reach some servers late."""

import click
from flask import current_app
from flask.cli import AppGroup

from accounts import users
from keys import keycache
from models import DATABASE_ERRORS


class SentenceOnServiceError:
    """A command (or every command of a group) whose database cannot be reached or written, or
    whose key change cannot be announced to the servers, ends with a sentence, not a traceback."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except DATABASE_ERRORS as error:
            raise click.ClickException(f"The database cannot be used right now: {error}") from None
        except (keycache.ChangeNotAnnounced, users.AccountGone) as error:
            raise click.ClickException(error.description) from None


class CommandGroup(SentenceOnServiceError, AppGroup):
    pass


class Command(SentenceOnServiceError, click.Command):
    pass


def find_user(username):
    """The user with this username, or a ClickException that says there is none."""
    if users.CONTROL_CHARACTERS.search(username):
        raise click.ClickException("A username cannot contain control characters.")
    user = users.find_user(username)
    if user is None:
        raise click.ClickException(f"There is no user named {username!r}.")
    return user


def warn_if_servers_may_not_hear():
    """On PostgreSQL without Redis here, this command could not tell servers that use Redis."""
    if isinstance(current_app.extensions["keys"], keycache.Uncached):
        click.echo("Note: RATELIMIT_STORAGE_URL is not Redis here. Servers that keep keys in memory (PostgreSQL "
                   "with Redis) learn of this change only when run with theirs; otherwise within 10 seconds.",
                   err=True)
