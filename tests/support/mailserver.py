"""A real SMTP server for the tests: aiosmtpd on a free loopback port, in a thread of its own, that
keeps every mail it accepts; it can be stopped and started again on the same port (a mail server
that is down for a while)."""

import contextlib
import email
import email.policy
import threading
import time

from aiosmtpd.controller import Controller
from liveserver import free_port


class Received:
    """One mail as the server took it: the envelope's sender and recipients, and the parsed message."""

    def __init__(self, envelope):
        self.mail_from = envelope.mail_from
        self.rcpt_tos = list(envelope.rcpt_tos)
        self.raw = envelope.original_content
        self.message = email.message_from_bytes(envelope.original_content, policy=email.policy.default)

    @property
    def to(self):
        return str(self.message["To"])

    @property
    def subject(self):
        return str(self.message["Subject"])

    @property
    def text(self):
        return self.message.get_body(("plain",)).get_content()

    @property
    def html(self):
        return self.message.get_body(("html",)).get_content()


class Handler:
    def __init__(self, server):
        self.server = server

    async def handle_RCPT(self, smtp_server, session, envelope, address, rcpt_options):
        if self.server.refuse_with:
            return self.server.refuse_with
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, smtp_server, session, envelope):
        with self.server.lock:
            self.server.mails.append(Received(envelope))
        return "250 Message accepted for delivery"


class MailServer:
    """Mails accepted at 127.0.0.1:port arrive in .mails; refuse_with (an SMTP answer such as
    "451 Try again later") refuses every recipient while it is set."""

    def __init__(self):
        self.port = free_port()
        self.mails = []
        self.lock = threading.Lock()
        self.refuse_with = None
        self.controller = None

    @property
    def url(self):
        return f"smtp://127.0.0.1:{self.port}"

    def start(self):
        self.controller = Controller(Handler(self), hostname="127.0.0.1", port=self.port)
        self.controller.start()

    def stop(self):
        if self.controller is not None:
            self.controller.stop()
            self.controller = None

    def wait_for(self, count=1, timeout=15, to=None, subject=None):
        """The mails received (to that address, with that subject, when given) once there are at
        least count of them; AssertionError after timeout seconds."""
        deadline = time.monotonic() + timeout
        while True:
            with self.lock:
                mails = [mail for mail in self.mails
                         if (to is None or mail.to == to) and (subject is None or mail.subject == subject)]
            if len(mails) >= count or time.monotonic() > deadline:
                assert len(mails) >= count, f"{len(mails)} mails arrived, not {count}: {[m.subject for m in mails]}"
                return mails
            time.sleep(0.05)


@contextlib.contextmanager
def mail_server():
    server = MailServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()
