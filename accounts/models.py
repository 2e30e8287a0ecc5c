"""The tables of account protection: two-factor log-in and passkeys; accounts/twofactor.py and
accounts/passkeys.py own them."""

from peewee import BigIntegerField, BlobField, CharField, DateTimeField, ForeignKeyField, IntegerField, TextField

from models import BaseModel, User, utcnow


class TwoFactor(BaseModel):
    """An account's TOTP authenticator, made when a code confirmed it (a set-up waiting for its
    code is kept with its session). The secret is Fernet-encrypted with a key derived from SECRET_KEY."""

    user = ForeignKeyField(User, primary_key=True, on_delete="CASCADE")
    sealed_secret = TextField()
    enabled_at = DateTimeField(null=True)
    # The newest 30-second step whose code was accepted: no code of it or an earlier step passes again.
    last_step = BigIntegerField(default=0)

    class Meta:
        table_name = "two_factor"


class RecoveryCode(BaseModel):
    user = ForeignKeyField(User, on_delete="CASCADE", index=True)
    code_hash = CharField(max_length=64, unique=True)
    used_at = DateTimeField(null=True)

    class Meta:
        table_name = "recovery_codes"


class PendingLogin(BaseModel):
    """A browser that gave the right password and still owes the second factor: its cookie holds
    the token, the database the token's hash, for a few minutes."""

    token_hash = CharField(primary_key=True, max_length=64)
    user = ForeignKeyField(User, on_delete="CASCADE")
    # The password hash the log-in was checked against: a password changed since ends the log-in.
    password_hash = CharField()
    expires_at = DateTimeField(index=True)
    failures = IntegerField(default=0)

    class Meta:
        table_name = "pending_logins"


class Passkey(BaseModel):
    user = ForeignKeyField(User, on_delete="CASCADE", index=True)
    name = CharField(max_length=64)
    credential_id = CharField(max_length=1400, unique=True)  # base64url, as the browser sends it
    public_key = BlobField()
    sign_count = BigIntegerField(default=0)
    created_at = DateTimeField(default=utcnow)
    last_used_at = DateTimeField(null=True)

    class Meta:
        table_name = "passkeys"


class WebAuthnChallenge(BaseModel):
    """A WebAuthn ceremony under way: its challenge, used once, for a short while. The browser's
    cookie holds the token; purpose says which ceremony (and user, where there is one) it is for."""

    token_hash = CharField(primary_key=True, max_length=64)
    purpose = CharField(max_length=16)
    user = ForeignKeyField(User, null=True, on_delete="CASCADE")
    challenge = BlobField()
    expires_at = DateTimeField(index=True)

    class Meta:
        table_name = "webauthn_challenges"


PROTECTION_MODELS = [TwoFactor, RecoveryCode, PendingLogin, Passkey, WebAuthnChallenge]
