"""The `mail` command group: `mail test ADDRESS` sends a test mail at once, not through the outbox."""

import click
from flask import current_app

import settings
from cli.commands import CommandGroup
from mail import outbox, transport
from mail.models import MailMessage

mail_cli = CommandGroup("mail", help="Check the mail settings.")


@mail_cli.command("test")
@click.argument("address")
def test_command(address):
    """Send a test mail to ADDRESS now and print how the mail server answered (exit 1 when it failed)."""
    try:
        recipient = outbox.checked_address(address)
    except ValueError as error:
        raise click.ClickException(str(error)) from None
    server = settings.mail_url(current_app.config["MAIL_URL"])
    text, html = outbox.render("test", server=repr(server))
    row = MailMessage(recipient=recipient, subject=outbox.SUBJECTS["test"],
                      message_id=outbox.new_message_id())
    message = outbox.message_of(row, current_app.config["MAIL_FROM"], {"text": text, "html": html})
    try:
        answer = transport.send(server, message)
    except (transport.MailFailed, UnicodeError, ValueError) as error:
        click.echo(f"Could not send a test mail to {recipient} through {server!r}: {error}")
        raise SystemExit(1) from None
    click.echo(f"Sent a test mail to {recipient} through {server!r}: {answer}")
