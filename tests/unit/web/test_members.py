"""Organisations through the web forms: every role against every action, the allowed ones made and
the others refused with 403 and nothing changed (orgs/roles.py decides the expectation, so the table
and the test cannot drift apart); another organisation's ids are 404s; a
removed member's open session loses the organisation at once; bad input is a 400 with a sentence;
every form that revokes, removes or leaves asks first. The last owner's: test_owners.py."""

import io
import re
import shutil
from dataclasses import dataclass
from html.parser import HTMLParser

import pytest
import services
from appconfig import APP_SETTINGS, build_schema
from importfiles import jsonl, made_secret, sha256_hex
from services import rows
from teams import (
    ACTORS,
    OTHERS,
    edit,
    edited,
    make_team,
    member_role,
    restore_content,
    revoked,
    roll,
    rolled,
    saved_content,
    snapshot,
)

from keys.models import ImportedKey
from models import ROLES, ApiKey, Membership, Organisation, db, utcnow
from orgs import roles
from orgs.models import Invitation
from webhooks import outbox
from webhooks.models import DELIVERED, FAILED, WebhookEndpoint, WebhookMessage, WebhookResend


@dataclass
class Case:
    """An action through its form: form(team, actor) gives (path, data); made(team, actor) says whether
    the change happened; decisions are what orgs/roles.allows must all say yes to."""

    name: str
    decisions: list
    form: object
    made: object


def invitation(team):
    return Invitation.get_by_id(team.invitation.id)


def ended_message(team, state):
    """A message of the team's endpoint that ended in the state (DELIVERED or FAILED)."""
    [message_id] = outbox.write_messages([team.endpoint.id], "webhook.test", {}, utcnow())
    message = WebhookMessage.get(WebhookMessage.message_id == message_id)
    WebhookMessage.update(state=state, next_attempt_at=None).where(WebhookMessage.id == message.id).execute()
    return message


# What an action on members says it acts on (orgs/roles.allows wants both said).
ON_TESS = {"target_role": "developer", "new_role": None}
ON_OWEN = {"target_role": "owner", "new_role": None}
AN_INVITATION = {"target_role": None, "new_role": "developer"}  # the team's pending one, as developer

CASES = [
    Case("create a key", [(roles.KEY_CREATE, {})],
         lambda team, actor: ("/settings/security/keys", {"name": "new key", "type": "development"}),
         lambda team, actor: ApiKey.select().where((ApiKey.name == "new key") & (ApiKey.org == team.acme.id)
                                                   & (ApiKey.user == team.people[actor].id)).exists()),
    Case("roll its own key", [(roles.KEY_CHANGE, {"own_key": True})], roll("actor"), rolled("actor")),
    Case("roll another member's key", [(roles.KEY_CHANGE, {"own_key": False})], roll("tess"), rolled("tess")),
    Case("revoke its own key", [(roles.KEY_CHANGE, {"own_key": True})],
         lambda team, actor: (f"/settings/security/keys/{team.keys[actor].id}/revoke", {}), revoked("actor")),
    Case("revoke another member's key", [(roles.KEY_CHANGE, {"own_key": False})],
         lambda team, actor: (f"/settings/security/keys/{team.keys['tess'].id}/revoke", {}), revoked("tess")),
    Case("rename and narrow its own key", [(roles.KEY_CHANGE, {"own_key": True})], edit("actor", {
        "name": "narrowed", "scopes": ["test:read"]}), edited("actor", name="narrowed", scopes="test:read")),
    Case("raise its own key's tier", [(roles.KEY_CHANGE, {"own_key": True}), (roles.KEY_WIDEN, {})],
         edit("actor", {"tier": "pro"}), edited("actor", rate_limit_tier="pro")),
    Case("raise another member's key's tier", [(roles.KEY_CHANGE, {"own_key": False}), (roles.KEY_WIDEN, {})],
         edit("tess", {"tier": "pro"}), edited("tess", rate_limit_tier="pro")),
    Case("rename the organisation", [(roles.ORG_MANAGE, {})],
         lambda team, actor: ("/settings/organisation/rename", {"name": "Acme Works", "org_id": str(team.acme.id)}),
         lambda team, actor: Organisation.get_by_id(team.acme.id).slug == "acme-works"),
    Case("import a key", [(roles.KEY_IMPORT, {})],
         lambda team, actor: ("/settings/organisation/import", {"org_id": str(team.acme.id), "file": (
             io.BytesIO(jsonl(sha256_hex(made_secret(), external_id="cus_1"))), "keys.jsonl")}),
         lambda team, actor: ImportedKey.select().where(ImportedKey.external_id == "cus_1").exists()),
    Case("add a webhook endpoint", [(roles.WEBHOOK_MANAGE, {})],
         lambda team, actor: ("/settings/webhooks", {"url": "http://127.0.0.1:9/new", "subscribe": "all"}),
         lambda team, actor: WebhookEndpoint.select().where(WebhookEndpoint.url == "http://127.0.0.1:9/new").exists()),
    Case("send a test event", [(roles.WEBHOOK_MANAGE, {})],
         lambda team, actor: (f"/settings/webhooks/{team.endpoint.id}/test", {}),
         lambda team, actor: WebhookMessage.select().where((WebhookMessage.endpoint == team.endpoint.id)
                                                           & (WebhookMessage.event == "webhook.test")).exists()),
    Case("resend a message", [(roles.WEBHOOK_MANAGE, {})],
         lambda team, actor: (f"/settings/webhooks/{team.endpoint.id}/resend",
                              {"message_id": ended_message(team, DELIVERED).message_id}),
         lambda team, actor: WebhookResend.select().where(WebhookResend.endpoint == team.endpoint.id).exists()),
    Case("recover failed messages", [(roles.WEBHOOK_MANAGE, {})],
         lambda team, actor: (f"/settings/webhooks/{team.endpoint.id}/recover",
                              {"since": "24h", "made": ended_message(team, FAILED).message_id}),
         lambda team, actor: not WebhookMessage.select().where(WebhookMessage.state == FAILED).exists()),
    Case("rotate a webhook secret", [(roles.WEBHOOK_MANAGE, {})],
         lambda team, actor: (f"/settings/webhooks/{team.endpoint.id}/rotate", {"overlap": "1h"}),
         lambda team, actor: WebhookEndpoint.get_by_id(team.endpoint.id).previous_until is not None),
    Case("remove a webhook endpoint", [(roles.WEBHOOK_MANAGE, {})],
         lambda team, actor: (f"/settings/webhooks/{team.endpoint.id}/remove", {}),
         lambda team, actor: WebhookEndpoint.get_or_none(WebhookEndpoint.id == team.endpoint.id) is None),
    *(Case(f"invite an address as {role}", [(roles.MEMBER_INVITE, {"target_role": None, "new_role": role})],
           lambda team, actor, role=role: ("/settings/members/invite", {"email": "Someone@Example.com", "role": role}),
           lambda team, actor, role=role: Invitation.select().where((Invitation.email == "someone@example.com")
                                                                    & (Invitation.role == role)).exists())
      for role in ("developer", "owner")),
    *(Case(f"make {target} ({OTHERS[target]}) {role}",
           [(roles.MEMBER_ROLE, {"target_role": OTHERS[target], "new_role": role})],
           lambda team, actor, target=target, role=role: (f"/settings/members/{team.people[target].id}/role",
                                                          {"role": role}),
           lambda team, actor, target=target, role=role: member_role(team, target) == role)
      for target, role in [("tess", "viewer"), ("tess", "owner"), ("owen", "admin")]),
    *(Case(f"remove {target} ({target_role})", [(roles.MEMBER_REMOVE, {"target_role": target_role, "new_role": None})],
           lambda team, actor, target=target: (f"/settings/members/{team.people[target].id}/remove", {}),
           lambda team, actor, target=target: member_role(team, target) is None)
      for target, target_role in [("tess", "developer"), ("owen", "owner")]),
    Case("remove tess (developer) and revoke her keys",
         [(roles.MEMBER_REMOVE, ON_TESS), (roles.MEMBER_REVOKE_KEYS, ON_TESS)],
         lambda team, actor: (f"/settings/members/{team.people['tess'].id}/remove", {"revoke_keys": "1"}),
         lambda team, actor: member_role(team, "tess") is None and revoked("tess")(team, actor)),
    *(Case(f"revoke the keys of {target} ({target_role or 'a former member'})",
           [(roles.MEMBER_REVOKE_KEYS, {"target_role": target_role, "new_role": None})],
           lambda team, actor, target=target: (f"/settings/members/{team.people[target].id}/revoke-keys", {}),
           revoked(target))
      for target, target_role in [("tess", "developer"), ("owen", "owner"), ("fred", None)]),
    Case("revoke an invitation", [(roles.MEMBER_INVITE, AN_INVITATION)],
         lambda team, actor: (f"/settings/members/invitations/{team.invitation.id}/revoke", {}),
         lambda team, actor: invitation(team).revoked_at is not None),
    Case("send an invitation again", [(roles.MEMBER_INVITE, AN_INVITATION)],
         lambda team, actor: (f"/settings/members/invitations/{team.invitation.id}/resend", {}),
         lambda team, actor: invitation(team).revoked_at is not None and Invitation.select().where(
             (Invitation.email == "newcomer@example.com") & Invitation.revoked_at.is_null()).exists()),
    Case("leave", [(roles.LEAVE, {})], lambda team, actor: ("/settings/members/leave", {}),
         lambda team, actor: member_role(team, actor) is None),
]


def test_every_action_of_the_roles_table_has_a_case():
    assert {action for case in CASES for action, _ in case.decisions} == set(roles.ACTIONS) - {roles.VIEW}


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_each_role_makes_exactly_the_changes_its_role_allows(team, log_in, role, case):
    actor = ACTORS[role]
    client = log_in(actor)
    allowed = all(roles.allows(role, action, **context) for action, context in case.decisions)
    path, data = case.form(team, actor)
    before = snapshot()
    response = client.post(path, data=data)
    if allowed:
        assert response.status_code == 302, response.text
        assert case.made(team, actor)
    else:
        assert response.status_code == 403
        assert not case.made(team, actor)
        assert snapshot() == before


@pytest.mark.parametrize("role", ROLES)
def test_every_role_sees_every_key_and_the_log_but_only_the_forms_it_may_use(team, log_in, role):
    actor = ACTORS[role]
    client = log_in(actor)
    security = client.get("/settings/security").text
    assert all(f"{name}&#39;s key" in security for name in ("olive", "tess", "fred"))
    assert "by tess" in security and "by a former member" in security and "org.created" in security
    assert ('action="/settings/security/keys"' in security) == roles.allows(role, roles.KEY_CREATE)
    for name, own in [(actor, True), ("tess", False)]:
        assert (f'action="/settings/security/keys/{team.keys[name].id}/revoke"' in security
                ) == roles.allows(role, roles.KEY_CHANGE, own_key=own)
    webhooks = client.get("/settings/webhooks").text
    assert ('action="/settings/webhooks"' in webhooks) == roles.allows(role, roles.WEBHOOK_MANAGE)
    assert (f'/webhooks/{team.endpoint.id}/remove"' in webhooks) == roles.allows(role, roles.WEBHOOK_MANAGE)
    key_page = client.get(f"/settings/security/keys/{team.keys['tess'].id}")
    assert key_page.status_code == 200 and "by tess" in key_page.text
    assert (f"/keys/{team.keys['tess'].id}/roll" in key_page.text) == roles.allows(role, roles.KEY_CHANGE)

    members = client.get("/settings/members").text
    assert all(name in members for name in ("olive", "owen", "tess", "vic")) and "newcomer@example.com" in members
    tess, owen = team.people["tess"].id, team.people["owen"].id
    assert (f'/settings/members/{tess}/remove"' in members) == roles.allows(role, roles.MEMBER_REMOVE, **ON_TESS)
    assert (f'/settings/members/{owen}/remove"' in members) == roles.allows(role, roles.MEMBER_REMOVE, **ON_OWEN)
    assert (f'/settings/members/{owen}/role"' in members) == any(
        roles.allows(role, roles.MEMBER_ROLE, target_role="owner", new_role=new) for new in ("admin", "viewer"))
    assert ('action="/settings/members/invite"' in members) == roles.allows(role, roles.MEMBER_INVITE, **AN_INVITATION)
    assert ('<option value="owner"' in members) == roles.allows(role, roles.MEMBER_INVITE, target_role=None,
                                                                                new_role="owner")
    assert (f"/invitations/{team.invitation.id}/revoke" in members) == roles.allows(role, roles.MEMBER_INVITE,
                                                                                         **AN_INVITATION)
    assert "fred, a former member" in members
    assert (f'/settings/members/{team.people["fred"].id}/revoke-keys"' in members
            ) == roles.allows(role, roles.MEMBER_REVOKE_KEYS, target_role=None, new_role=None)
    assert 'action="/settings/members/leave"' in members and 'action="/orgs"' in members


class DestructiveForms(HTMLParser):
    """The actions of a page's forms that revoke, remove or leave, each with whether it sits in a
    <details class="confirm"> (a question, then "Yes, ..."), as the project's confirmations do."""

    DESTRUCTIVE = re.compile(r"/(revoke|remove|leave|revoke-keys)$")

    def __init__(self, html):
        super().__init__()
        self.details, self.forms = [], {}
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "details":
            self.details.append("confirm" in (attrs.get("class") or "").split())
        elif tag == "form" and self.DESTRUCTIVE.search(attrs.get("action") or ""):
            self.forms[attrs["action"]] = bool(self.details and self.details[-1])

    def handle_endtag(self, tag):
        if tag == "details":
            self.details.pop()


def test_every_revocation_removal_and_leaving_on_the_members_tab_asks_first(team, log_in):
    forms = DestructiveForms(log_in(ACTORS["owner"]).get("/settings/members").text).forms
    fred = team.people["fred"].id
    assert {f"/settings/members/invitations/{team.invitation.id}/revoke", f"/settings/members/{fred}/revoke-keys",
            "/settings/members/leave"} <= set(forms)
    assert [action for action, asks in forms.items() if not asks] == []


@pytest.mark.parametrize("role", ROLES)
def test_every_role_may_create_an_organisation_and_switch_between_its_own(team, log_in, role):
    actor = ACTORS[role]
    client = log_in(actor)
    response = client.post("/orgs", data={"name": f"  {actor.title()}'s Lab  "})
    assert response.status_code == 302 and response.location == "/settings/members"
    lab = Organisation.get(Organisation.slug == f"{actor}-s-lab")
    assert lab.name == f"{actor.title()}'s Lab"
    assert Membership.get((Membership.org == lab.id) & (Membership.user == team.people[actor].id)).role == "owner"
    page = client.get("/settings/members").text
    assert f"Members of {actor.title()}&#39;s Lab" in page and f'<option value="{actor}-s-lab" selected>' in page

    for tab in ("/settings/webhooks", "/settings/organisation", "/settings/members"):
        response = client.post("/orgs/switch", data={"org": "acme", "next": tab})
        assert response.status_code == 302 and response.location == tab
    assert "Members of Acme" in client.get("/settings/members").text
    key_page = f"/settings/security/keys/{team.keys[actor].id}"
    response = client.post("/orgs/switch", data={"org": actor, "next": key_page})
    # A key's page belongs to the organisation left: the switch goes to the Security tab.
    assert response.location == "/settings/security"
    assert f'<option value="{actor}" selected>' in client.get("/settings/security").text


def test_switching_to_an_organisation_of_others_or_none_is_a_404(team, log_in):
    client = log_in("olive")
    for slug in ["globex", "gina", "no-such-org", "", "Acme", "acme\x00", "../acme", "a" * 5000]:
        assert client.post("/orgs/switch", data={"org": slug}).status_code == 404, slug
    assert "Members of Acme" in client.get("/settings/members").text


def test_another_organisations_ids_are_404s_in_every_form_and_page_and_change_nothing(team, log_in):
    client = log_in("olive")  # Acme's owner: every form would be allowed
    gina, gus = team.people["gina"].id, team.people["gus"].id
    key, endpoint, invitation = team.keys["gina"].id, team.globex_endpoint.id, team.globex_invitation.id
    before = snapshot()
    for path in [f"/settings/security/keys/{key}/roll", f"/settings/security/keys/{key}/revoke",
                 *(f"/settings/webhooks/{endpoint}/{action}"
                   for action in ("test", "remove", "resend", "recover", "rotate")),
                 *(f"/settings/members/{user_id}/{action}" for user_id in (gina, gus, 999_999)
                   for action in ("role", "remove", "revoke-keys")),
                 f"/settings/members/invitations/{invitation}/revoke",
                 f"/settings/members/invitations/{invitation}/resend"]:
        assert client.post(path, data={"role": "viewer", "grace": "0", "revoke_keys": "1"}).status_code == 404, path
    for path in [f"/settings/security/keys/{key}", f"/settings/webhooks/{endpoint}/attempts"]:
        assert client.get(path).status_code == 404, path
    assert snapshot() == before


def test_an_invitation_no_longer_pending_is_a_404_for_its_forms(team, log_in):
    client = log_in("olive")
    assert client.post(f"/settings/members/invitations/{team.invitation.id}/revoke").status_code == 302
    for action in ("revoke", "resend"):
        assert client.post(f"/settings/members/invitations/{team.invitation.id}/{action}").status_code == 404


def test_a_removed_members_open_session_loses_the_organisation_at_once(team, log_in):
    tess = log_in("tess")
    key = team.keys["tess"]
    assert tess.get(f"/settings/security/keys/{key.id}").status_code == 200
    owner = log_in("olive")
    assert owner.post(f"/settings/members/{team.people['tess'].id}/remove").status_code == 302

    security = tess.get("/settings/security")
    assert security.status_code == 200
    assert '<option value="tess" selected>' in security.text and "Acme" not in security.text
    assert "Members of tess" in tess.get("/settings/members").text
    assert tess.get(f"/settings/security/keys/{key.id}").status_code == 404
    assert tess.post(f"/settings/security/keys/{key.id}/revoke").status_code == 404
    assert tess.post("/settings/members/invite", data={"email": "x@example.com", "role": "viewer"}).status_code == 302
    assert not (Invitation.select()
                .where((Invitation.org == team.acme.id) & (Invitation.email == "x@example.com")).exists())
    assert tess.post("/orgs/switch", data={"org": "acme"}).status_code == 404
    # The key she made stays Acme's, working, listed as a former member's.
    assert ApiKey.get_by_id(key.id).revoked_at is None
    assert "tess, a former member" in owner.get("/settings/members").text


@pytest.mark.parametrize("path, data, sentence", [
    ("/orgs", {"name": ""}, "1 to 64 characters"),
    ("/orgs", {"name": "   "}, "1 to 64 characters"),
    ("/orgs", {"name": "x" * 65}, "1 to 64 characters"),
    ("/orgs", {"name": "!!!"}, "needs a letter or a digit"),
    ("/orgs", {"name": "Acme"}, "is taken"),
    ("/orgs", {"name": "bad\x00name"}, "control characters"),
    ("/orgs", {}, "1 to 64 characters"),
    ("/settings/members/invite", {"email": "not-an-email", "role": "viewer"}, "does not look like an email"),
    ("/settings/members/invite", {"email": "", "role": "viewer"}, "does not look like an email"),
    ("/settings/members/invite", {"email": "a" * 300 + "@example.com", "role": "viewer"}, "does not look like"),
    ("/settings/members/invite", {"email": "x\x00@example.com", "role": "viewer"}, "control characters"),
    ("/settings/members/invite", {"email": "tess@example.com", "role": "viewer"}, "already a member"),
    ("/settings/members/invite", {"email": "newcomer@example.com", "role": "viewer"}, "already invited"),
    ("/settings/members/invite", {"email": "new@example.com", "role": "superuser"}, "The roles are"),
    ("/settings/members/invite", {"email": "new@example.com"}, "The roles are"),
    ("/settings/members/{tess}/role", {"role": "superuser"}, "The roles are"),
    ("/settings/members/{tess}/role", {"role": "\x00"}, "The roles are"),
    ("/settings/members/{tess}/role", {}, "The roles are"),
])
def test_bad_input_is_a_400_with_a_sentence_and_changes_nothing(team, log_in, path, data, sentence):
    client = log_in("olive")
    before = snapshot()
    response = client.post(path.format(tess=team.people["tess"].id), data=data)
    assert response.status_code == 400
    assert sentence in response.text
    assert snapshot() == before



def test_a_new_log_in_works_in_the_personal_organisation_listed_first(team, log_in):
    page = log_in("tess", org=None).get("/settings/members").text
    assert "Members of tess" in page
    switcher = page[page.index('id="org-switcher"'):page.index("</select>")]
    assert switcher.index('value="tess" selected') < switcher.index('value="acme"')


def test_an_organisation_deleted_while_its_page_makes_a_key_sends_the_browser_back(team, log_in, monkeypatch):
    """Its only member deleted the account in another tab: the key is not made, and no 500."""
    from accounts import throttles

    client = log_in("olive")
    solo = Organisation.create(name="Solo", slug="solo")
    Membership.create(org=solo.id, user=team.people["olive"].id, role="owner")
    assert client.post("/orgs/switch", data={"org": "solo"}).status_code == 302
    monkeypatch.setattr(throttles, "count_key_creation", lambda user: Organisation.delete_by_id(solo.id))
    response = client.post("/settings/security/keys", data={"name": "late", "type": "development"})
    assert response.status_code == 302 and response.location == "/settings/security"
    assert not ApiKey.select().where(ApiKey.name == "late").exists()


def everything(database_url):
    """Every row of every table, and where each id sequence stands, read from outside the app."""
    if database_url.startswith("sqlite"):
        tables = [name for name, in rows(database_url, "SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {name: rows(database_url, f'SELECT * FROM "{name}" ORDER BY rowid') for name in tables}
    tables = [name for name, in rows(database_url, "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")]
    return {**{name: rows(database_url, f'SELECT * FROM "{name}" ORDER BY 1') for name in tables},
            "sequences": rows(database_url, "SELECT sequencename, last_value FROM pg_sequences ORDER BY 1")}


def test_a_team_put_back_in_a_new_database_is_the_team_as_made_row_for_row(database_url, make_app, sqlite_schema,
                                                                          tmp_path):
    """The `team` fixture makes the team once a process for each kind of database and puts it back
    for each later test (tests/support/teams.py): the same rows, and the same next ids."""

    def new_app(name):
        if database_url.startswith("sqlite"):
            url = f"sqlite:///{tmp_path}/{name}.db"
            shutil.copyfile(sqlite_schema, tmp_path / f"{name}.db")
        else:
            db.close()
            url = services.postgres_url_as_built(build_schema)
        return url, make_app({**APP_SETTINGS, "DATABASE_URL": url})

    url, app = new_app("made")
    with app.app_context():
        make_team(app)
        content = saved_content(url)
    made = everything(url)
    assert made["users"] and made["api_keys"] and made["invitations"]
    url, app = new_app("put-back")
    with app.app_context():
        restore_content(url, content)
    assert everything(url) == made
