"""The MAIL_* settings: the server mail goes through (MAIL_URL), its sender and its retry schedule.
The standard library only (settings/)."""

import ipaddress
import re
from email.utils import getaddresses
from urllib.parse import unquote, urlsplit

from settings.parsing import ConfigError, described, retry_schedule

DEFAULT_MAIL_RETRY_SCHEDULE = "5s,1m,5m,30m,2h,6h,12h"
DEFAULT_MAIL_FROM = "API-key demo service <no-reply@localhost>"
MAIL_SCHEMES = ("smtp", "smtps")
MAIL_URL_FORM = "smtp://[USER:PASSWORD@]HOST[:PORT], smtps://..., console or off"
DEFAULT_MAIL_PORTS = {"smtp": 587, "smtps": 465}
# An address as MAIL_FROM may give it: no dot needed after the @ (no-reply@localhost).
MAIL_FROM_ADDRESS = re.compile(r"[^@\s<>,;\"]{1,64}@[^@\s<>,;\"]{1,253}")


def mail_retry_schedule(text):
    return retry_schedule(text, "MAIL_RETRY_SCHEDULE")


class MailServer:
    """MAIL_URL parsed: scheme smtp (STARTTLS, or plain on a loopback host), smtps (TLS from the
    start), console or off; the user and password are never part of a message."""

    def __init__(self, scheme, host="", port=0, user="", password=""):
        self.scheme, self.host, self.port, self.user, self.password = scheme, host, port, user, password

    @property
    def loopback(self):
        return self.host == "localhost" or is_loopback(self.host)

    def __repr__(self):
        return f"{self.scheme}://{self.host}:{self.port}" if self.host else self.scheme


def is_loopback(host):
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def mail_url(text):
    """MAIL_URL as a MailServer, or a sentence saying what is wrong that never quotes its password."""
    url = text.strip()
    if url.lower() in ("console", "off"):
        return MailServer(url.lower())
    scheme = url.partition("://")[0].lower() if "://" in url else ""
    if scheme not in MAIL_SCHEMES:
        raise ConfigError(f"MAIL_URL must be {MAIL_URL_FORM}, not {described(scheme)}.")
    parts = urlsplit(url)
    try:
        port = parts.port or DEFAULT_MAIL_PORTS[scheme]
    except ValueError:
        raise ConfigError("MAIL_URL has a port that is not a whole number from 1 to 65535.") from None
    if not parts.hostname or parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ConfigError(f"MAIL_URL must name a host and nothing after it, as in {MAIL_URL_FORM}.")
    return MailServer(scheme, parts.hostname, port, unquote(parts.username or ""), unquote(parts.password or ""))


def mail_from(text):
    """MAIL_FROM: one address, with an optional name, on one line."""
    addresses = getaddresses([text])
    address = addresses[0][1] if len(addresses) == 1 else ""
    if "\r" in text or "\n" in text or not MAIL_FROM_ADDRESS.fullmatch(address):
        raise ConfigError(f"MAIL_FROM must be one address such as 'API-key demo service <no-reply@example.com>', "
                          f"not {text!r}.")
    return text.strip()
