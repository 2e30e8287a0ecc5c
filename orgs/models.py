"""The invitations table: an address asked to join an organisation with a role, by a link mailed
to it and shown once to whoever invited it (orgs/invitations.py)."""

from peewee import CharField, DateTimeField, ForeignKeyField

from models import BaseModel, Organisation, User, utcnow


class Invitation(BaseModel):
    org = ForeignKeyField(Organisation, on_delete="CASCADE")
    email = CharField(max_length=254)
    role = CharField(max_length=16)
    # The SHA-256 of the link's token.
    token_hash = CharField(max_length=64, unique=True)
    invited_by = ForeignKeyField(User, null=True, on_delete="SET NULL")
    created_at = DateTimeField(default=utcnow)
    # When its link was made and mailed: it is sent again a minute later at the soonest. Sending it
    # again makes a new row (created_at kept) and revokes this one, which voids its link.
    sent_at = DateTimeField(default=utcnow)
    expires_at = DateTimeField()
    accepted_at = DateTimeField(null=True)
    revoked_at = DateTimeField(null=True)

    class Meta:
        table_name = "invitations"
        indexes = ((("org", "email"), False),)


MODELS = [Invitation]
