"""The mail outbox: one row a mail, written in the transaction of its cause (store/outbox.py)."""

from peewee import CharField, DateTimeField, IntegerField, TextField

from models import BaseModel, utcnow

# A mail's states: waiting for its next attempt (or in one), sent, given up.
PENDING, SENT, FAILED = "pending", "sent", "failed"


class MailMessage(BaseModel):
    """A mail's recipient, subject and Message-ID, and its text and HTML parts sealed
    (store/sealing.py): a reset link is a token, and a copy of the database must not hold it in
    the clear. The parts are forgotten once the mail is sent or given up; the row, a week later."""

    recipient = CharField(max_length=254)
    subject = CharField(max_length=200)
    message_id = CharField(max_length=100, unique=True)
    sealed_parts = TextField()
    created_at = DateTimeField(default=utcnow)
    state = CharField(max_length=16, default=PENDING)
    attempts = IntegerField(default=0)
    next_attempt_at = DateTimeField(null=True, index=True)
    sent_at = DateTimeField(null=True)
    # The last failed attempt's short reason (the server's answer, or why there was none).
    error = CharField(max_length=200, null=True)
    # The recipient as addresses are compared (trimmed, lower case) when the mail counts in that
    # address's hourly cap (mail/addresscap.py): it went to an address that is not the confirmed one
    # of the account that asked for it. NULL for any other mail.
    capped_address = CharField(max_length=254, null=True)

    class Meta:
        table_name = "mail_messages"
        # notices.py counts the mails to an address in the last hour, addresscap.py the capped ones.
        indexes = ((("recipient", "created_at"), False), (("capped_address", "created_at"), False))


MODELS = [MailMessage]
