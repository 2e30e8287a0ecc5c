"""The cap on mail to an address that is not the confirmed address of the account asking for it (a
change of address, an invitation, a link to confirm an address nobody has confirmed): one
address gets at most MAILS_PER_HOUR of them an hour, whichever accounts ask, counted in the database
so that it holds across workers and instances. Accounts are cheap to make; a stranger's mailbox is
not theirs to fill."""

import datetime
import hashlib

from peewee import PostgresqlDatabase

from mail import outbox
from mail.models import MailMessage
from models import db, utcnow

MAILS_PER_HOUR = 3
HOUR = datetime.timedelta(hours=1)
# The first key of this cap's advisory locks on PostgreSQL ("mail"): a space of its own, apart from
# the schema's one-key lock.
LOCK_SPACE = 0x6D61696C


class NoMoreMail(ValueError):
    """The address had MAILS_PER_HOUR capped mails in the last hour; str() is the form's sentence."""

    def __init__(self, address):
        super().__init__(f"No more mail goes to {address} for now; try again later.")
        self.address = address


def queue(asker, recipient, name, **context):
    """outbox.queue for a mail that the account asker asks for (None: no account, as the command
    line); unless it goes to asker's confirmed address, it counts in the recipient's cap, and past
    the cap NoMoreMail is raised with nothing written. Inside the caller's write transaction."""
    capped = None
    if outbox.enabled() and not confirmed_address_of(asker, recipient):
        capped = refuse_past_cap(recipient)
    return outbox.queue(recipient, name, capped_address=capped, **context)


def refuse_past_cap(recipient):
    """Hold the address until the transaction ends and raise NoMoreMail when MAILS_PER_HOUR capped
    mails went to it in the last hour; return it as addresses are compared."""
    address = compared(recipient)
    hold(address)
    mailed = MailMessage.select().where((MailMessage.capped_address == address)
                                        & (MailMessage.created_at > utcnow() - HOUR)).count()
    if mailed >= MAILS_PER_HOUR:
        raise NoMoreMail(address)
    return address


def confirmed_address_of(asker, recipient):
    return asker is not None and asker.email_verified_at is not None and compared(asker.email) == compared(recipient)


def compared(address):
    """The address as accounts keep theirs (accounts/users.checked_email): trimmed, in lower case."""
    return address.strip().lower()


def hold(address):
    """Make requests about one address pass the cap one at a time, whichever worker or instance
    serves them. PostgreSQL: an advisory lock on the address's hash until the transaction ends.
    SQLite: the database's write lock, which the caller's transaction holds already, as each one
    writes first (the asking account's or organisation's row held, or the new account's row)."""
    if isinstance(db.obj, PostgresqlDatabase):
        key = int.from_bytes(hashlib.sha256(address.encode()).digest()[:4], "big", signed=True)
        db.execute_sql("SELECT pg_advisory_xact_lock(%s::integer, %s::integer)", (LOCK_SPACE, key))


def hold_in_order(*recipients):
    """Hold several addresses at once, in one order for every request (a lock held again later in the
    transaction is held already): two accounts each moving to the other's address, each notice
    counted at its old address, would otherwise wait for each other."""
    for address in sorted({compared(recipient) for recipient in recipients}):
        hold(address)
