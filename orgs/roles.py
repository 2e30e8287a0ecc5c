"""The one authorisation decision: what a member's role allows. Every page, form and command that
acts in an organisation asks allows() (docs/organisations.md has the table)."""

from models import OWNER, ROLES

# What a member can ask to do in its organisation.
VIEW = "view"  # its keys, usage, endpoints, members and security log
KEY_CREATE = "key.create"
KEY_CHANGE = "key.change"  # roll, revoke, or change a key (narrowing it, unless KEY_WIDEN is allowed too)
KEY_WIDEN = "key.widen"  # give a key a scope, an address, a later expiry, a looser tier, windows, credits
KEY_IMPORT = "key.import"  # import keys another system issued, by their hash
WEBHOOK_MANAGE = "webhook.manage"  # add, remove, test endpoints; resend, recover, rotate their secrets
MEMBER_INVITE = "member.invite"  # invite, and revoke or resend an invitation
MEMBER_ROLE = "member.role"
MEMBER_REMOVE = "member.remove"
MEMBER_REVOKE_KEYS = "member.revoke_keys"  # revoke every key a member, or a former member, created
LEAVE = "member.leave"
ORG_MANAGE = "org.manage"  # rename or delete the organisation, give its billing customer
ACTIONS = (VIEW, KEY_CREATE, KEY_CHANGE, KEY_WIDEN, KEY_IMPORT, WEBHOOK_MANAGE, MEMBER_INVITE, MEMBER_ROLE,
           MEMBER_REMOVE, MEMBER_REVOKE_KEYS, LEAVE, ORG_MANAGE)
# The actions on another member, or giving a role: an admin may take them for members other than
# owners, and give any role but owner.
ON_MEMBERS = {MEMBER_INVITE, MEMBER_ROLE, MEMBER_REMOVE, MEMBER_REVOKE_KEYS}


# target_role or new_role not given: an action on members must say whom it acts on and what it
# gives, or an admin would pass for an owner's case.
UNSAID = object()


def allows(role, action, *, own_key=False, target_role=UNSAID, new_role=UNSAID):
    """True when a member with this role may take the action. own_key: the key acted on was
    created by this member (KEY_CHANGE). For the actions on members, both are said: target_role
    the role of the member acted on (None for a former member or an invitation), new_role the role
    given (None where none is: removing, revoking keys). The last owner's protection is
    orgs/members.py's: it depends on the others, not on the role."""
    assert action in ACTIONS, action
    if role not in ROLES:
        return False
    if action in (VIEW, LEAVE):
        return True
    if role == OWNER:
        return True
    if role == "admin":
        if action == ORG_MANAGE:
            return False
        if action in ON_MEMBERS:
            return UNSAID not in (target_role, new_role) and OWNER not in (target_role, new_role)
        return True
    if role == "developer":
        return action == KEY_CREATE or (action == KEY_CHANGE and own_key)
    return False
