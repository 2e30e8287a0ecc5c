"""The invitations table: an address asked to join an organisation with a role, by a link mailed
to it and shown once to whoever invited it (orgs/invitations.py)."""

from peewee import CharField, DateTimeField, ForeignKeyField

from models import BaseModel, Organisation, User, utcnow


class Invitation(BaseModel):
    org = ForeignKeyField(Organisation, on_delete="CASCADE")
    email = CharField(max_length=254)
    role = CharField(max_length=16)
    # The SHA-256 of the link's token: a new link (sent again) replaces it, which voids the old one.
    token_hash = CharField(max_length=64, unique=True)
    invited_by = ForeignKeyField(User, null=True, on_delete="SET NULL")
    created_at = DateTimeField(default=utcnow)
    # When the current link was made and mailed: it is sent again a minute later at the soonest.
    sent_at = DateTimeField(default=utcnow)
    expires_at = DateTimeField()
    accepted_at = DateTimeField(null=True)
    revoked_at = DateTimeField(null=True)

    class Meta:
        table_name = "invitations"
        indexes = ((("org", "email"), False),)


MODELS = [Invitation]
