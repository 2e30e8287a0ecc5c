"""How a mail leaves: SMTP with STARTTLS (plain only to a loopback host), SMTPS, the log (console),
or nowhere (off), as MAIL_URL says. smtplib's sockets are gevent's in a worker, so a slow server
holds one greenlet, never the process."""

import logging

log = logging.getLogger(__name__)

TIMEOUT_SECONDS = 30


class MailFailed(Exception):
    """A send that did not go through; the message is a short reason fit for a log line."""


def send(server, message, timeout=TIMEOUT_SECONDS):
    """Send an email.message.EmailMessage through the MailServer (settings.mail_url); return the
    server's answer to the mail as one line. Raise MailFailed with a short reason."""
    # smtplib is imported by the first mail, not by every start (serving/warmup.py).
    import smtplib

    if server.scheme == "console":
        write_to_log(message)
        return "written to the log (MAIL_URL is console)"
    if server.scheme == "off":
        return "not sent (MAIL_URL is off)"
    try:
        return through_smtp(server, message, timeout)
    except MailFailed:
        raise
    except smtplib.SMTPResponseException as error:
        raise MailFailed(f"{error.smtp_code} {reason(error.smtp_error)}") from None
    except smtplib.SMTPRecipientsRefused as error:
        code, answer = next(iter(error.recipients.values()))
        raise MailFailed(f"{code} {reason(answer)}") from None
    except (smtplib.SMTPException, OSError) as error:
        raise MailFailed(described(error)) from None


def through_smtp(server, message, timeout):
    import smtplib
    import ssl

    context = ssl.create_default_context()
    if server.scheme == "smtps":
        connection = smtplib.SMTP_SSL(server.host, server.port, timeout=timeout, context=context)
    else:
        connection = smtplib.SMTP(server.host, server.port, timeout=timeout)
    with connection:
        connection.ehlo()
        # Mail to a loopback host never leaves the machine, and a local relay's certificate is
        # rarely one a name check accepts (Postfix's snakeoil): no STARTTLS there.
        if server.scheme == "smtp" and not server.loopback:
            if not connection.has_extn("starttls"):
                raise MailFailed(f"{server.host} does not offer STARTTLS, which MAIL_URL's smtp:// requires "
                                 "for a host that is not loopback (smtps:// is TLS from the start).")
            connection.starttls(context=context)
            connection.ehlo()
        if server.user:
            connection.login(server.user, server.password)
        sender = message["Return-Path"] or addresses_of(message["From"])[0]
        code, answer = connection.mail(sender)
        if code != 250:
            raise smtplib.SMTPSenderRefused(code, answer, sender)
        recipient = addresses_of(message["To"])[0]
        code, answer = connection.rcpt(recipient)
        if code not in (250, 251):
            raise smtplib.SMTPRecipientsRefused({recipient: (code, answer)})
        # SMTP's line ends: smtplib's data() mends those of a str, never those of bytes.
        code, answer = connection.data(message.as_bytes(policy=message.policy.clone(linesep="\r\n")))
        if code != 250:
            raise smtplib.SMTPDataError(code, answer)
        return f"{code} {reason(answer)}"


def write_to_log(message):
    """The console backend: the mail's head and text, a line of the log each (the log writes a
    line break inside a record as an escape)."""
    log.info("Mail to %s (MAIL_URL is console: written here, not sent): %s", message["To"], message["Subject"])
    for line in message.get_body(("plain",)).get_content().splitlines():
        if line.strip():
            log.info("Mail to %s | %s", message["To"], line)


def addresses_of(header):
    return [address.addr_spec for address in header.addresses]


def reason(answer):
    """An SMTP answer's text on one short line."""
    text = answer.decode("utf-8", "replace") if isinstance(answer, bytes) else str(answer)
    return " ".join(text.split())[:150]


def described(error):
    """A failure without an SMTP answer in a few words: never a traceback."""
    import smtplib
    import ssl

    if isinstance(error, TimeoutError):
        return "No answer from the mail server in time."
    if isinstance(error, ConnectionRefusedError):
        return "The mail server refused the connection."
    if isinstance(error, ssl.SSLError):
        return f"TLS failed: {reason(error.reason or str(error))}."
    if isinstance(error, smtplib.SMTPServerDisconnected):
        return "The mail server closed the connection."
    if isinstance(error, OSError) and error.strerror:
        return f"Could not reach the mail server: {reason(error.strerror)}."
    return reason(f"{type(error).__name__}: {error}")
