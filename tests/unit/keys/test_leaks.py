"""What a key revoked as leaked keeps of its report, the words that say so, and what an upgrade from
version 14, which kept nothing, finds for the keys it revoked as leaked."""

import types

from playhouse.migrate import PostgresqlMigrator, SqliteMigrator, migrate

import auth
from accounts import users
from keys import leaks
from models import ApiKey, db
from orgs import keyactions
from store import schema

URL = "https://github.com/acme/app/blob/main/.env"


def test_what_a_revocation_as_leaked_keeps_of_its_report():
    assert leaks.recorded({"source": "github", "url": URL}) == {"leak_report": "github", "leak_url": URL}
    assert leaks.recorded({"source": "github", "url": ""}) == {"leak_report": "github", "leak_url": None}
    assert leaks.recorded(None) == {"leak_report": "api", "leak_url": None}


def test_the_words_that_say_who_reported_a_key_and_where():
    def key(report, url=None):
        return types.SimpleNamespace(leak_report=report, leak_url=url)

    assert leaks.reported(key("github", URL)) == f"reported by GitHub at {URL}"
    assert leaks.reported(key("github")) == "reported by GitHub"
    assert leaks.reported(key("api")) == "reported with POST /api/v1/keys/revoke"
    assert leaks.reported(key(None)) is None


def revoke(user, name, how):
    key, secret = keyactions.issue_key(user, name, "development")
    if how == "plain":
        keyactions.revoke_key(key)
    elif how is not None:
        keyactions.revoke_key(auth.authenticate(secret), leaked=True,
                              report={"source": "github", "url": URL} if how == "github" else None)
    return key.id


def test_keys_revoked_as_leaked_before_version_15_take_who_reported_them_from_the_log(database_url, make_app):
    """Version 14 kept no report with the key, only the security log's line ("... reported by
    GitHub" for GitHub's): the upgrade reads who from it; where GitHub found it is not known. A
    key named like another key's line changes nothing for that key."""
    with make_app({"DATABASE_URL": database_url}).app_context():
        bob = users.create_user("bob", "bob@example.com", "correct horse battery")
        made = {name: revoke(bob, name, how) for name, how in [
            ("by GitHub", "github"), ("by its holder", "api"), ("plain", "plain"), ("active", None)]}
        plain = ApiKey.get_by_id(made["plain"])
        # Named as if GitHub had reported the plain key, and revoked as leaked by its holder.
        forged = revoke(bob, f"(id {plain.id}, {plain.display_prefix}...) reported by GitHub", "api")
        # The api_keys table as version 14 made it (SQLite: without the trigger that names every column).
        postgresql = database_url.startswith("postgresql")
        if not postgresql:
            db.execute_sql("DROP TRIGGER api_key_changed")
        migrator = (PostgresqlMigrator if postgresql else SqliteMigrator)(db.obj)
        migrate(migrator.drop_column("api_keys", "leak_report"), migrator.drop_column("api_keys", "leak_url"))
        db.execute_sql("UPDATE schema_version SET version = 14")
    app = make_app({"DATABASE_URL": database_url})
    assert app.extensions["schema"] == (14, schema.LATEST)
    with app.app_context():
        kept = {key.id: (key.leak_report, key.leak_url) for key in ApiKey.select()}
    assert kept == {made["by GitHub"]: ("github", None), made["by its holder"]: ("api", None),
                    made["plain"]: (None, None), made["active"]: (None, None), forged: ("api", None)}
