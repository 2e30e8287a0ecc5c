"""An organisation with a member of every role, to act in through the web forms, and what those
forms could change, to compare before and after (tests/unit/web/test_members.py, test_invitations.py);
a smaller one for the command line's tests (make_org)."""

import copy
import datetime
import sqlite3
import types

import psycopg
import services

from accounts import users
from models import ApiKey, Membership, Organisation, SecurityEvent, db, utcnow
from orgs import invitations, keyactions, members as org_members
from orgs.models import Invitation
from webhooks import endpoints
from webhooks.models import WebhookEndpoint, WebhookMessage, WebhookResend

PASSWORD = "correct horse battery"
# Who acts in Acme, by role.
ACTORS = {"owner": "olive", "admin": "adam", "developer": "dora", "viewer": "vic"}
# Whom they act on: a second owner, a developer, and fred, a former member whose key stays.
OTHERS = {"owen": "owner", "tess": "developer", "fred": "developer"}


def make_org(name, owner, roles):
    """A new organisation of that name, owned by owner, with a new account in each of roles
    ({username: role})."""
    org = org_members.create(name, owner)
    for username, role in roles.items():
        made = users.create_user(username, f"{username}@example.com", PASSWORD)
        Membership.create(org=org.id, user=made.id, role=role)
    return org


def make_team(app):
    """Acme: a member of every role (ACTORS) and OTHERS, each with a key made in Acme; fred removed
    since; a webhook endpoint and a pending invitation. Globex: another organisation, with its own
    owner (gina), member (gus), key, endpoint and invitation, that no one of Acme belongs to."""
    app.config["WEBHOOK_ALLOW_PRIVATE"] = True
    people = {name: users.create_user(name, f"{name}@example.com", PASSWORD)
              for name in [*ACTORS.values(), *OTHERS, "gina", "gus"]}
    acme = org_members.create("Acme", people["olive"])
    globex = org_members.create("Globex", people["gina"])
    for name, role in [*((name, role) for role, name in ACTORS.items() if role != "owner"), *OTHERS.items()]:
        Membership.create(org=acme.id, user=people[name].id, role=role)
    Membership.create(org=globex.id, user=people["gus"].id, role="developer")
    keys = {name: keyactions.issue_key(people[name], f"{name}'s key", "development", org=acme.id)[0]
            for name in [*ACTORS.values(), *OTHERS]}
    keys["gina"] = keyactions.issue_key(people["gina"], "gina's key", "development", org=globex.id)[0]
    org_members.remove(acme.id, people["fred"].id)
    endpoint, _ = endpoints.add_endpoint(people["olive"], "http://127.0.0.1:9/acme", org=acme.id)
    globex_endpoint, _ = endpoints.add_endpoint(people["gina"], "http://127.0.0.1:9/globex", org=globex.id)
    invitation, _ = invitations.invite(acme.id, "newcomer@example.com", "developer", people["olive"])
    # Mailed minutes ago, so that it may be sent again (orgs/invitations.RESEND_AFTER).
    Invitation.update(sent_at=utcnow() - datetime.timedelta(minutes=5)).where(Invitation.id == invitation.id).execute()
    globex_invitation, _ = invitations.invite(globex.id, "stranger@example.com", "developer", people["gina"])
    return types.SimpleNamespace(app=app, people=people, acme=acme, globex=globex, keys=keys, endpoint=endpoint,
                                 globex_endpoint=globex_endpoint, invitation=invitation,
                                 globex_invitation=globex_invitation)


# The team as make_team first made it in this process, on each kind of database: a copy of what it
# returned (the test that made it may change those objects), and what the database held then.
_made = {}


def team_in(app, database_url):
    """make_team's team in the app's new database. Made once a process for each kind of database, it
    is put back in the database each later time: test_members.py and test_invitations.py took 62 s
    (45 s of CPU) making it for each test, and take 28 s (18 s) putting it back."""
    kind = database_url.partition(":")[0]
    if kind not in _made:
        team = make_team(app)
        _made[kind] = (copy.deepcopy(vars(team) | {"app": None}), saved_content(database_url))
        return team
    attributes, content = _made[kind]
    restore_content(database_url, content)
    app.config["WEBHOOK_ALLOW_PRIVATE"] = True
    return types.SimpleNamespace(**copy.deepcopy(attributes) | {"app": app})


def saved_content(database_url):
    """What the app's database holds: on SQLite a copy of the whole database in memory (its
    sqlite_sequence included), on PostgreSQL its rows and sequences (services.saved_rows)."""
    if database_url.startswith("sqlite"):
        saved = sqlite3.connect(":memory:")
        db.connection().backup(saved)
        return saved
    with psycopg.connect(database_url, autocommit=True) as connection:
        return services.saved_rows(connection)


def restore_content(database_url, content):
    """Put saved_content's content back in the app's database, which holds the same schema and no rows."""
    if database_url.startswith("sqlite"):
        content.backup(db.connection())
        return
    with psycopg.connect(database_url, autocommit=True) as connection:
        services.restore_rows(connection, content)


def member_role(team, name):
    """The person's role in the team's Acme, or None when not a member."""
    found = Membership.get_or_none((Membership.org == team.acme.id) & (Membership.user == team.people[name].id))
    return found and found.role


def snapshot():
    """Everything a form of the Members or Security tab could change, to compare before and after."""
    return {
        "keys": sorted(ApiKey.select(ApiKey.id, ApiKey.key_hash, ApiKey.revoked_at).tuples()),
        "members": sorted(Membership.select(Membership.org, Membership.user, Membership.role).tuples()),
        "invitations": sorted(Invitation.select(Invitation.id, Invitation.token_hash, Invitation.revoked_at,
                                                Invitation.accepted_at).tuples()),
        "endpoints": sorted(WebhookEndpoint.select(WebhookEndpoint.id, WebhookEndpoint.sealed_secret,
                                                   WebhookEndpoint.previous_until).tuples()),
        "messages": sorted(WebhookMessage.select(WebhookMessage.id, WebhookMessage.state, WebhookMessage.attempts)
                           .tuples()),
        "resends": WebhookResend.select().count(),
        "organisations": sorted(Organisation.select(Organisation.id, Organisation.slug).tuples()),
        "org events": SecurityEvent.select().where(SecurityEvent.org.is_null(False)).count(),
    }


# The key forms' cases of test_members.py: which key ("actor": the acting member's own), the form
# that acts on it, and whether the change happened.
def key_of(name):
    return lambda team, actor: team.keys[actor if name == "actor" else name]


def roll(name):
    def form(team, actor):
        key = key_of(name)(team, actor)
        return f"/settings/security/keys/{key.id}/roll", {"grace": "0", "current": key.display_prefix}
    return form


def rolled(name):
    def was_rolled(team, actor):
        key = key_of(name)(team, actor)
        return ApiKey.get_by_id(key.id).key_hash != key.key_hash

    return was_rolled


def edit(name, data):
    return lambda team, actor: (f"/settings/security/keys/{key_of(name)(team, actor).id}/edit", data)


def edited(whose, **columns):
    def was_edited(team, actor):
        key = ApiKey.get_by_id(key_of(whose)(team, actor).id)
        return all(getattr(key, column) == value for column, value in columns.items())

    return was_edited


def revoked(name):
    return lambda team, actor: ApiKey.get_by_id(key_of(name)(team, actor).id).revoked_at is not None
