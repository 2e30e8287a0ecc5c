"""orgs/roles.py's decision over every role and action, and docs/organisations.md's table of it;
the forms that ask it are tested through the web (tests/unit/web/test_members.py)."""

from pathlib import Path

import pytest

from models import ROLES
from orgs import roles

EVERYONE = set(ROLES)
# (action, keyword arguments) -> the roles it allows.
EXPECTED = [
    (roles.VIEW, {}, EVERYONE),
    (roles.LEAVE, {}, EVERYONE),
    (roles.KEY_CREATE, {}, {"owner", "admin", "developer"}),
    (roles.KEY_CHANGE, {"own_key": True}, {"owner", "admin", "developer"}),
    (roles.KEY_CHANGE, {"own_key": False}, {"owner", "admin"}),
    (roles.KEY_WIDEN, {}, {"owner", "admin"}),
    (roles.KEY_IMPORT, {}, {"owner", "admin"}),
    (roles.WEBHOOK_MANAGE, {}, {"owner", "admin"}),
    (roles.ORG_MANAGE, {}, {"owner"}),
    (roles.MEMBER_INVITE, {"target_role": None, "new_role": "developer"}, {"owner", "admin"}),
    (roles.MEMBER_INVITE, {"target_role": None, "new_role": "owner"}, {"owner"}),
    (roles.MEMBER_ROLE, {"target_role": "developer", "new_role": "admin"}, {"owner", "admin"}),
    (roles.MEMBER_ROLE, {"target_role": "owner", "new_role": "admin"}, {"owner"}),
    (roles.MEMBER_ROLE, {"target_role": "viewer", "new_role": "owner"}, {"owner"}),
    (roles.MEMBER_REMOVE, {"target_role": "admin", "new_role": None}, {"owner", "admin"}),
    (roles.MEMBER_REMOVE, {"target_role": "owner", "new_role": None}, {"owner"}),
    (roles.MEMBER_REVOKE_KEYS, {"target_role": None, "new_role": None}, {"owner", "admin"}),
    (roles.MEMBER_REVOKE_KEYS, {"target_role": "owner", "new_role": None}, {"owner"}),
]


@pytest.mark.parametrize(("action", "context", "allowed"), EXPECTED)
def test_each_role_may_take_exactly_its_actions(action, context, allowed):
    assert {role for role in ROLES if roles.allows(role, action, **context)} == allowed


def test_every_action_is_decided_for_every_role():
    assert {action for action, _, _ in EXPECTED} == set(roles.ACTIONS)


def test_an_action_on_members_that_does_not_say_whom_it_acts_on_is_an_owner_s_alone():
    for action in roles.ON_MEMBERS:
        assert not roles.allows("admin", action) and not roles.allows("admin", action, target_role="viewer")
        assert roles.allows("owner", action)


def test_no_role_or_a_made_up_one_allows_nothing():
    for action in roles.ACTIONS:
        assert not roles.allows(None, action) and not roles.allows("superuser", action)


DOC = Path(__file__).resolve().parents[3] / "docs" / "organisations.md"
# Each row of the doc's table: the decision it states.
DOCUMENTED = {
    "See the keys, usage, endpoints, members and security log": (roles.VIEW, {}),
    "Create a key": (roles.KEY_CREATE, {}),
    "Roll, revoke or change a key it created": (roles.KEY_CHANGE, {"own_key": True}),
    "Roll, revoke or change another member's key": (roles.KEY_CHANGE, {"own_key": False}),
    "Widen a key it may change: a scope or an address it lacks, a later expiry, a tier not tighter in each window, "
    "its own windows, more credits or a larger refill": (roles.KEY_WIDEN, {}),
    "Import keys another system issued, by their hash ([Importing keys](importing-keys.md))": (roles.KEY_IMPORT, {}),
    "Add, remove or test a webhook endpoint; resend or recover its messages, rotate its secret": (
        roles.WEBHOOK_MANAGE, {}),
    "Invite, send again or revoke an invitation as admin, developer or viewer": (
        roles.MEMBER_INVITE, {"target_role": None, "new_role": "admin"}),
    "Invite, send again or revoke an invitation as owner": (
        roles.MEMBER_INVITE, {"target_role": None, "new_role": "owner"}),
    "Change the role of a member other than an owner, to any role but owner": (
        roles.MEMBER_ROLE, {"target_role": "developer", "new_role": "admin"}),
    "Make a member an owner, or change an owner's role": (
        roles.MEMBER_ROLE, {"target_role": "viewer", "new_role": "owner"}),
    "Remove a member other than an owner": (roles.MEMBER_REMOVE, {"target_role": "admin", "new_role": None}),
    "Remove an owner": (roles.MEMBER_REMOVE, {"target_role": "owner", "new_role": None}),
    "Revoke every key a member (not an owner) or a former member created": (
        roles.MEMBER_REVOKE_KEYS, {"target_role": None, "new_role": None}),
    "Revoke every key an owner created": (roles.MEMBER_REVOKE_KEYS, {"target_role": "owner", "new_role": None}),
    "Leave the organisation": (roles.LEAVE, {}),
    "Rename or delete the organisation, or give it its billing customer ([Billing](billing.md))":
        (roles.ORG_MANAGE, {}),
}


def doc_table():
    """[(first cell, {role: "yes" or "no"})] of the table under docs/organisations.md's Roles."""
    section = DOC.read_text(encoding="utf-8").split("## Roles", 1)[1].split("\n## ", 1)[0]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in section.splitlines()
            if line.startswith("|")]
    header, _, *body = rows
    assert header == ["action", *ROLES]
    return [(label, dict(zip(ROLES, cells))) for label, *cells in body]


def test_the_docs_table_states_what_allows_decides():
    table = doc_table()
    assert [label for label, _ in table] == list(DOCUMENTED)
    for label, cells in table:
        action, context = DOCUMENTED[label]
        assert cells == {role: "yes" if roles.allows(role, action, **context) else "no" for role in ROLES}, label


def test_the_docs_table_covers_every_action():
    assert {action for action, _ in DOCUMENTED.values()} == set(roles.ACTIONS)
