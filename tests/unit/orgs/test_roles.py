"""orgs/roles.py's decision over every role and action; the forms that ask it are tested through
the web (tests/unit/web/test_members.py)."""

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
    (roles.WEBHOOK_MANAGE, {}, {"owner", "admin"}),
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
