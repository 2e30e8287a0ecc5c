"""Writing a mail: rendered from its templates (templates/mail/NAME.txt and NAME.html) and written
to the outbox in the caller's transaction, so that a mail is never sent for a change that did not
commit, nor a change committed without its mail. mail/sender.py sends it."""

import json
import re

from flask import current_app, has_request_context, render_template, request

from mail.models import PENDING, MailMessage
from models import utcnow
from store import sealing

SERVICE_NAME = "API-key demo service"
# One addr-spec: nothing a header could read as a second address, a name or a line break.
ADDRESS = re.compile(r"[^@\s<>,;:\"()\[\]\\]{1,64}@[^@\s<>,;:\"()\[\]\\]+\.[^@\s<>,;:\"()\[\]\\]+")
SEALED_AS = "mail"
SUBJECTS = {
    "test": "A test mail",
    "password_reset": "Reset your password",
    "password_reset_done": "Your password was reset",
    "password_changed": "Your password was changed",
    "email_verify": "Confirm your email address",
    "email_change": "Confirm your new email address",
    "email_change_notice": "Your email address is being changed",
    "email_changed": "Your email address was changed",
    "key_leaked": "An API key was revoked: it was found in public",
    "key_expiring": "An API key expires in 7 days",
    "key_expired": "An API key has expired",
    "two_factor_off": "Two-factor log-in was turned off",
    "passkey_added": "A passkey was added to your account",
    "invitation": "You are invited to join an organisation",
}


def enabled():
    return current_app.config["MAIL_URL"].strip().lower() != "off"


def queue(recipient, name, capped_address=None, **context):
    """Render mail `name` for recipient and write it to the outbox inside the caller's transaction
    (counted in capped_address's hourly cap when given: mail/addresscap.py); return the row, or None
    when MAIL_URL is off. ValueError for an address no header may carry."""
    address = checked_address(recipient)
    if not enabled():
        return None
    text, html = render(name, **context)
    return MailMessage.create(recipient=address, subject=SUBJECTS[name], message_id=new_message_id(),
                              sealed_parts=sealing.seal(json.dumps({"text": text, "html": html}), SEALED_AS),
                              created_at=utcnow(), state=PENDING, next_attempt_at=utcnow(),
                              capped_address=capped_address)


def render(name, **context):
    context = {"service": SERVICE_NAME, **context}
    return render_template(f"mail/{name}.txt", **context), render_template(f"mail/{name}.html", **context)


def checked_address(recipient):
    """The address as one header carries it: one addr-spec in ASCII (what every SMTP server takes
    without SMTPUTF8), no line break, no display name, no encoded word (which a header parser
    would decode into other addresses or a line break); ValueError with a sentence otherwise."""
    # An empty label ("example.org.", "example..org") is read as no address at all by the header's parser.
    if (not recipient.isascii() or "=?" in recipient or not ADDRESS.fullmatch(recipient)
            or len(recipient) > 254 or "" in recipient.rpartition("@")[2].split(".")):
        raise ValueError("That address cannot be mailed: use a plain address such as name@example.com, "
                         "in ASCII letters.")
    # The email package (~15 ms) is imported by the first mail, not by every start (serving/warmup.py).
    from email.headerregistry import Address

    local, _, domain = recipient.rpartition("@")
    Address(username=local, domain=domain)  # raises ValueError on what a header cannot hold
    return recipient


def new_message_id():
    """A Message-ID made once, so that every attempt of a mail carries the same."""
    from email.utils import make_msgid

    return make_msgid(domain=sender_domain())


def sender_domain():
    return current_app.config["MAIL_FROM"].rpartition("@")[2].rstrip(">").strip() or "localhost"


def link(path):
    """The absolute address of a path of the site for a mail: PUBLIC_URL's, else in a request the
    passkeys' origin or the request's own; None outside a request without PUBLIC_URL."""
    config = current_app.config
    base = config["PUBLIC_URL"]
    if not base and has_request_context():
        base = config["WEBAUTHN_ORIGIN"] or request.host_url.rstrip("/")
    return f"{base}{path}" if base else None


def message_of(row, mail_from, parts):
    """The EmailMessage a row stands for: plain text with an HTML alternative."""
    from email.message import EmailMessage
    from email.utils import formatdate

    message = EmailMessage()
    message["From"] = mail_from
    message["To"] = row.recipient
    message["Subject"] = row.subject
    message["Date"] = formatdate(usegmt=True)
    message["Message-ID"] = row.message_id
    # RFC 3834: no out-of-office answer should come back to this.
    message["Auto-Submitted"] = "auto-generated"
    message.set_content(parts["text"])
    message.add_alternative(parts["html"], subtype="html")
    return message


def parts_of(row):
    """The row's {"text", "html"}, or None when they cannot be read (SECRET_KEY changed, or forgotten)."""
    sealed = row.sealed_parts and sealing.unseal(row.sealed_parts, SEALED_AS)
    return json.loads(sealed) if sealed else None
