"""The flask CLI: users create, keys create/list/revoke, audit; keys and audit in an organisation (--org)."""

import re

import peewee
import pytest
from flask import g
from liveserver import run_cli, service_env
from teams import make_org

import auth
import cli.users
from accounts import recovery, securitylog, sessions, users
from keys import keyformat
from models import ApiKey, Session, User, db, iso_seconds, personal_organisation
from orgs import keyactions, members, organisations


def test_users_create_with_password_stdin(runner):
    result = runner.invoke(args=["users", "create", "bob", "--email", "bob@example.com", "--password-stdin"],
                           input="s3cret-password\nignored second line\n")
    assert result.exit_code == 0, result.output
    user = User.get(User.username == "bob")
    assert users.password_matches(user, "s3cret-password")


def test_users_create_prompts_for_password_on_a_terminal(runner, monkeypatch):
    monkeypatch.setattr(cli.users, "has_terminal", lambda: True)
    result = runner.invoke(args=["users", "create", "bob", "--email", "bob@example.com"],
                           input="s3cret-password\ns3cret-password\n")
    assert result.exit_code == 0, result.output
    assert users.password_matches(User.get(User.username == "bob"), "s3cret-password")


def test_users_create_refuses_a_common_password_before_asking_for_it_again(runner, monkeypatch):
    monkeypatch.setattr(cli.users, "has_terminal", lambda: True)
    result = runner.invoke(args=["users", "create", "bob", "--email", "bob@example.com"],
                           input="password123\ns3cret-password\ns3cret-password\n")
    assert result.exit_code == 0, result.output
    refused = result.output.index("one of the most common passwords")
    assert result.output.count("Password:") == 2
    assert "Repeat for confirmation" not in result.output[:refused]
    assert users.password_matches(User.get(User.username == "bob"), "s3cret-password")


@pytest.mark.parametrize("args, message", [
    (["alice", "--email", "new@example.com"], "already taken"),
    (["bob", "--email", "alice@example.com"], "already belongs"),
    (["bob", "--email", "nope"], "email"),
])
def test_users_create_errors(runner, user, args, message):
    result = runner.invoke(args=["users", "create", *args, "--password-stdin"], input="long enough pw\n")
    assert result.exit_code != 0
    assert message in result.stderr
    assert result.stdout == ""


def test_users_set_password_ends_the_sessions_and_voids_the_reset_links(runner, user):
    assert sessions.start_session(user)
    links = []
    assert recovery.request_reset("alice@example.com", lambda user, token: links.append(token))
    result = runner.invoke(args=["users", "set-password", "alice", "--password-stdin"], input="a new passphrase\n")
    assert result.exit_code == 0, result.output
    assert "Set the password of alice" in result.stdout and "a new passphrase" not in result.output
    assert users.password_matches(User.get_by_id(user.id), "a new passphrase")
    assert not Session.select().where(Session.user == user.id).exists()
    with pytest.raises(recovery.LinkUnusable):
        recovery.find_link(links[0])
    assert [event.event for event in securitylog.recent(user.id, None)][0] == "user.password_changed"


@pytest.mark.parametrize("username, password, message", [
    ("nobody", "a new passphrase", "no user named"),
    ("alice", "password123", "most common"),
    ("alice", "short", "at least 8"),
])
def test_users_set_password_refuses_with_a_sentence_and_changes_nothing(runner, user, username, password, message):
    result = runner.invoke(args=["users", "set-password", username, "--password-stdin"], input=password + "\n")
    assert result.exit_code == 1 and message in result.stderr.lower()
    assert users.password_matches(User.get_by_id(user.id), "correct horse battery")


def test_users_set_password_asks_twice_on_a_terminal(runner, user, monkeypatch):
    monkeypatch.setattr(cli.users, "has_terminal", lambda: True)
    result = runner.invoke(args=["users", "set-password", "alice"], input="a new passphrase\na new passphrase\n")
    assert result.exit_code == 0, result.output
    assert users.password_matches(User.get_by_id(user.id), "a new passphrase")


def test_keys_create_prints_the_secret_last(runner, user):
    result = runner.invoke(args=["keys", "create", "alice", "--name", "ci key", "--type", "production"])
    assert result.exit_code == 0, result.output
    secret = result.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"sk_live_[A-Za-z0-9]{32,}", secret)
    key = auth.authenticate(secret)
    assert (key.name, key.key_type, key.rate_limit_tier) == ("ci key", "production", "free")


def test_keys_create_with_tier(runner, user):
    result = runner.invoke(args=["keys", "create", "alice", "--name", "k", "--type", "development", "--tier", "pro"])
    assert result.exit_code == 0, result.output
    assert auth.authenticate(result.stdout.splitlines()[-1]).rate_limit_tier == "pro"


@pytest.mark.parametrize("args, message", [
    (["nobody", "--name", "k", "--type", "development"], "no user named 'nobody'"),
    (["alice", "--name", "k", "--type", "staging"], "staging"),
    (["alice", "--name", "k", "--type", "development", "--tier", "gold"], "Unknown rate limit tier 'gold'"),
    (["alice", "--name", "", "--type", "development"], "key name"),
])
def test_keys_create_errors(runner, user, args, message):
    result = runner.invoke(args=["keys", "create", *args])
    assert result.exit_code != 0
    assert message in result.stderr
    assert ApiKey.select().count() == 0


def test_keys_list_never_shows_secrets(runner, user, api_key, pro_key):
    revoked = ApiKey.get(ApiKey.key_hash == keyformat.hash_key(pro_key))
    keyactions.revoke_key(revoked)
    result = runner.invoke(args=["keys", "list", "alice"])
    assert result.exit_code == 0
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 2
    first = lines[0].split("\t")
    every_scope = "test:read,user:read,usage:read,time:stream"
    assert first[1:] == ["Alice dev", "development", api_key[:12] + "...", "free", "active", "never", every_scope,
                         "any", "-"]
    assert int(first[0]) == auth.authenticate(api_key).id
    assert lines[1].split("\t")[1:] == ["Alice live", "production", pro_key[:12] + "...", "pro", "revoked", "never",
                                        every_scope, "any", "-"]
    assert api_key not in result.output and pro_key not in result.output


def test_keys_list_unknown_user(runner):
    result = runner.invoke(args=["keys", "list", "nobody"])
    assert result.exit_code != 0
    assert "nobody" in result.stderr


def test_keys_revoke(runner, client, api_key):
    key_id = auth.authenticate(api_key).id
    result = runner.invoke(args=["keys", "revoke", str(key_id)])
    assert result.exit_code == 0
    assert client.get("/api/v1/protected/test", headers={"X-API-Key": api_key}).status_code == 401
    again = runner.invoke(args=["keys", "revoke", str(key_id)])
    assert again.exit_code == 0
    assert "already revoked" in again.stdout


@pytest.mark.parametrize("key_id", ["999", "abc"])
def test_keys_revoke_errors(runner, key_id):
    result = runner.invoke(args=["keys", "revoke", key_id])
    assert result.exit_code != 0
    assert result.stderr


@pytest.mark.parametrize("args", [
    ["keys", "list", "alice"],
    ["keys", "create", "alice", "--name", "k", "--type", "development"],
    ["keys", "revoke", "1"],
    ["users", "create", "bob", "--email", "bob@example.com", "--password-stdin"],
    ["audit", "alice"],
])
def test_database_errors_end_with_a_sentence(runner, user, monkeypatch, args):
    def fail(*args, **kwargs):
        raise peewee.OperationalError("attempt to write a readonly database")

    monkeypatch.setattr(db.obj, "execute_sql", fail)
    result = runner.invoke(args=args, input="long enough pw\n")
    assert result.exit_code == 1
    assert result.stderr == "Error: The database cannot be used right now: attempt to write a readonly database\n"
    assert result.stdout == ""


def test_users_create_without_a_terminal_says_to_use_password_stdin(tmp_path):
    result = run_cli(service_env(tmp_path), "users", "create", "bob", "--email", "bob@example.com", stdin="")
    assert result.returncode == 1
    assert result.stderr == "Error: No terminal to prompt for a password; use --password-stdin.\n"


# --org: acting in an organisation as one of its members

@pytest.fixture
def acme(user):
    """Acme, owned by alice, with bob a developer and carol a viewer."""
    return make_org("Acme", user, {"bob": "developer", "carol": "viewer"})


def test_keys_create_with_org_makes_the_key_there_by_the_user(runner, acme):
    result = runner.invoke(args=["keys", "create", "bob", "--name", "ci", "--type", "development", "--org", "acme"])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0].endswith(") for bob in acme.")
    key = auth.authenticate(result.stdout.splitlines()[-1])
    assert (key.org_id, key.user.username) == (acme.id, "bob")


def test_keys_create_without_org_makes_the_key_in_the_personal_organisation(runner, user):
    result = runner.invoke(args=["keys", "create", "alice", "--name", "ci", "--type", "development"])
    key = auth.authenticate(result.stdout.splitlines()[-1])
    assert result.stdout.splitlines()[0] == f"Created development key 'ci' (id {key.id}) for alice."
    assert key.org_id == personal_organisation(user.id).id


@pytest.mark.parametrize("username, slug, message", [
    ("carol", "acme", "carol is viewer of acme; a viewer cannot create keys."),
    ("dave", "acme", "dave is not a member of acme."),
    ("alice", "nope", "There is no organisation with the slug 'nope'."),
    ("bob", "alice", "bob is not a member of alice."),
])
def test_keys_create_with_org_asks_the_members_role(runner, acme, username, slug, message):
    users.create_user("dave", "dave@example.com", "correct horse battery")
    result = runner.invoke(args=["keys", "create", username, "--name", "k", "--type", "development", "--org", slug])
    assert (result.exit_code, result.stderr, result.stdout) == (1, f"Error: {message}\n", "")
    assert ApiKey.select().count() == 0


def test_keys_list_with_org_lists_every_key_there_with_its_creator(runner, user, acme):
    bob = users.find_user("bob")
    mine, _ = keyactions.issue_key(user, "alice's", "development", org=acme.id)
    bobs, _ = keyactions.issue_key(bob, "bob's", "production", "pro", org=acme.id)
    keyactions.issue_key(user, "personal", "development")
    organisations.delete_account(bob, "correct horse battery")
    every_scope = "test:read,user:read,usage:read,time:stream"
    result = runner.invoke(args=["keys", "list", "carol", "--org", "acme"])
    assert result.exit_code == 0, result.output
    assert result.stdout == (
        f"{mine.id}\talice's\tdevelopment\t{mine.display_prefix}...\tfree\tactive\tnever\t{every_scope}\tany\t-\talice\n"
        f"{bobs.id}\tbob's\tproduction\t{bobs.display_prefix}...\tpro\tactive\tnever\t{every_scope}\tany\t-\t-\n")


def test_keys_list_ends_a_key_revoked_as_leaked_with_who_reported_it_where_and_when(runner, user, acme):
    """Its line keeps every field where it was (active, revoked ...) and adds one last: a script
    that reads the fields by place reads what it read before."""
    url = "https://github.com/acme/app/blob/main/.env"
    keys = {}
    for name, report in [("by GitHub", {"source": "github", "url": url}), ("by GitHub, nowhere said",
                         {"source": "github", "url": ""}), ("by its holder", None), ("plain", "not leaked")]:
        key, secret = keyactions.issue_key(user, name, "development", org=acme.id)
        if report == "not leaked":
            keyactions.revoke_key(key)
        else:
            keyactions.revoke_key(auth.authenticate(secret), leaked=True, report=report)
        keys[name] = ApiKey.get_by_id(key.id)
    when = {name: iso_seconds(key.revoked_at) for name, key in keys.items()}
    result = runner.invoke(args=["keys", "list", "alice", "--org", "acme"])
    assert result.exit_code == 0, result.output
    lines = [line.split("\t") for line in result.stdout.splitlines()]
    assert [fields[5] for fields in lines] == ["revoked"] * 4
    assert [fields[10:] for fields in lines] == [
        ["alice", f"revoked: reported by GitHub at {url} on {when['by GitHub']}"],
        ["alice", f"revoked: reported by GitHub on {when['by GitHub, nowhere said']}"],
        ["alice", f"revoked: reported with POST /api/v1/keys/revoke on {when['by its holder']}"],
        ["alice"]]


def test_keys_list_with_org_is_refused_to_a_non_member(runner, acme):
    users.create_user("dave", "dave@example.com", "correct horse battery")
    result = runner.invoke(args=["keys", "list", "dave", "--org", "acme"])
    assert (result.exit_code, result.stderr, result.stdout) == (1, "Error: dave is not a member of acme.\n", "")


def test_audit_with_org_prints_the_organisations_log_with_who_acted(app, runner, user, acme):
    with app.app_context(), app.test_request_context(environ_base={"REMOTE_ADDR": "203.0.113.7"}):
        g.user = user
        members.change_role(acme.id, users.find_user("carol").id, "admin")
    runner.invoke(args=["orgs", "remove", "acme", "bob"])
    result = runner.invoke(args=["audit", "--org", "acme"])
    assert result.exit_code == 0, result.output
    lines = [line.split("\t") for line in result.stdout.splitlines()]
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", line[0]) for line in lines)
    assert [line[1:] for line in lines] == [
        ["member.removed", "cli", "bob (developer)", "-"],
        ["member.role_changed", "203.0.113.7", "carol: viewer to admin", "alice"],
        ["org.created", "cli", "Acme", "-"],
    ]


def test_audit_of_a_user_keeps_its_lines(runner, user, acme):
    keyactions.issue_key(user, "personal", "development")
    result = runner.invoke(args=["audit", "alice"])
    assert [line.split("\t")[1:] for line in result.stdout.splitlines()][0][0] == "key.created"
    assert all(len(line.split("\t")) == 4 for line in result.stdout.splitlines())
    assert "org.created" not in result.stdout


@pytest.mark.parametrize("args, message", [
    ([], "Give either USERNAME or --org SLUG."),
    (["alice", "--org", "acme"], "Give either USERNAME or --org SLUG."),
    (["--org", "nope"], "There is no organisation with the slug 'nope'."),
])
def test_audit_takes_a_username_or_an_organisation(runner, acme, args, message):
    result = runner.invoke(args=["audit", *args])
    assert (result.exit_code, result.stderr, result.stdout) == (1, f"Error: {message}\n", "")
