"""The keys another system issued, brought in by their hash (orgs/keyimports.py): beside their
api_keys row, what the import said of them and, for a slow hash, what finds and checks the secret
until its first use (keys/imported.py)."""

from peewee import CharField, DateTimeField, ForeignKeyField, TextField

from models import ApiKey, BaseModel, utcnow

SCHEMES = ("sha256-hex", "sha256-base64", "bcrypt", "argon2id")
SLOW_SCHEMES = ("bcrypt", "argon2id")
# The key_hash of a key whose secret has only a slow hash yet: never a SHA-256 in hex, so no secret finds it.
AWAITING_FIRST_USE = "awaiting-first-use:"


class ImportedKey(BaseModel):
    key = ForeignKeyField(ApiKey, primary_key=True, backref="imported", on_delete="CASCADE")
    hash_scheme = CharField(max_length=16)
    # The start every secret of the other system shares ("" for none), for SHA-256 imports: the
    # form check lets such secrets through to the lookup by hash.
    prefix = CharField(null=True, max_length=32)
    # The secret's first characters in clear, for bcrypt and argon2id imports: how the key is found.
    lookup_prefix = CharField(null=True, max_length=64, unique=True)
    # The other system's bcrypt or argon2id hash; NULL once the first use rehashed the key to SHA-256.
    slow_hash = TextField(null=True)
    external_id = CharField(null=True, max_length=255)
    imported_at = DateTimeField(default=utcnow)
    rehashed_at = DateTimeField(null=True)

    class Meta:
        table_name = "imported_keys"


MODELS = [ImportedKey]
