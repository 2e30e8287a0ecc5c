"""Organisations and their members: create, switch, change a role, remove, leave, and revoke the
keys a member (or a former member) made. Every change happens with the organisation's row held
(accounts/organisations.lock_organisation), so two admins at once cannot leave it without an owner;
each writes its event to the organisation's security log. Callers ask orgs/roles.py first."""

from peewee import JOIN

import auth
from accounts import organisations, securitylog, users
from models import OWNER, ROLES, ApiKey, Membership, Organisation, Session, User, db
from store import slugs

MAX_NAME_LENGTH = 64
# Organisations one user may own: each is a row and a slug, so a script must not make them without end.
MAX_OWNED = 20


class LastOwner(Exception):
    """The change would leave the organisation without an owner (HTTP 409)."""


class NotMember(Exception):
    """The user is not (or no longer) a member of the organisation (HTTP 404)."""


def create(name, owner):
    """Make an organisation owned by owner; return it. ValueError with a sentence for a name
    refused or taken, or an owner of MAX_OWNED already."""
    name = name.strip()
    users.refuse_control_characters(name, "An organisation's name")
    if not 0 < len(name) <= MAX_NAME_LENGTH:
        raise ValueError(f"An organisation's name is 1 to {MAX_NAME_LENGTH} characters.")
    slug = slugs.slug_of(name)
    if not slug:
        raise ValueError("An organisation's name needs a letter or a digit.")
    with db.atomic():
        users.lock_user(owner)
        owned = Membership.select().where((Membership.user == owner.id) & (Membership.role == OWNER)).count()
        if owned >= MAX_OWNED:
            raise ValueError(f"One account may own {MAX_OWNED} organisations.")
        if Organisation.select().where(Organisation.slug == slug).exists():
            raise ValueError(f"The name {slug!r} is taken; choose another.")
        org = Organisation.create(name=name, slug=slug)
        Membership.create(org=org.id, user=owner.id, role=OWNER)
        securitylog.record_in(org.id, "org.created", name)
    return org


def memberships_of(user):
    """The user's memberships with their organisations, the personal one first, then by name."""
    return list(Membership.select(Membership, Organisation).join(Organisation).where(Membership.user == user.id)
                .order_by(organisations.personal_first(user.id), Organisation.name, Organisation.id))


def find_membership(user, slug):
    """The user's membership of the organisation with this slug; NotMember when there is none."""
    membership = (Membership.select(Membership, Organisation).join(Organisation)
                  .where((Membership.user == user.id) & (Organisation.slug == slug)).first())
    if membership is None:
        raise NotMember()
    return membership


def switch(session, user, slug):
    """Make the organisation the session's current one; NotMember unless the user belongs to it."""
    membership = find_membership(user, slug)
    Session.update(org=membership.org_id).where(Session.token_hash == session.token_hash).execute()
    return membership


def members(org_id):
    """The organisation's memberships with their users, owners first, then by username."""
    order = [Membership.role == role for role in ROLES]
    return list(Membership.select(Membership, User).join(User).where(Membership.org == org_id)
                .order_by(*(clause.desc() for clause in order), User.username))


def member(org_id, user_id):
    """The user's membership of the organisation; NotMember when there is none."""
    found = Membership.select(Membership, User).join(User).where(
        (Membership.org == org_id) & (Membership.user == user_id)).first()
    if found is None:
        raise NotMember()
    return found


def former_members_keys(org_id):
    """[(creator's user id or None, username or None, active key count)] for the active keys made
    by users who are no longer members (None: an account since deleted)."""
    current = Membership.select(Membership.user).where(Membership.org == org_id)
    keys = (ApiKey.active_in(org_id).select(ApiKey.user, User.username)
            .join(User, JOIN.LEFT_OUTER, on=(ApiKey.user == User.id))
            .where(ApiKey.user.is_null() | ApiKey.user.not_in(current)).objects())
    counts = {}
    for key in keys:
        creator = (key.user_id, getattr(key, "username", None))
        counts[creator] = counts.get(creator, 0) + 1
    return [(user_id, username, count) for (user_id, username), count in sorted(counts.items(), key=str)]


def change_role(org_id, user_id, role):
    """Give the member the role; LastOwner when it is the last owner's and role is not owner."""
    if role not in ROLES:
        raise ValueError(f"The roles are {', '.join(ROLES)}.")
    with db.atomic():
        organisations.lock_organisation(org_id)
        target = member(org_id, user_id)
        if target.role == role:
            return target
        if target.role == OWNER:
            refuse_last_owner(org_id, user_id, "lose the role")
        Membership.update(role=role).where(Membership.id == target.id).execute()
        securitylog.record_in(org_id, "member.role_changed", f"{target.user.username}: {target.role} to {role}")
    target.role = role
    return target


def remove(org_id, user_id, revoke_keys=False):
    """Remove the member, its keys left working (revoke_keys: revoked too); return how many keys
    were revoked. LastOwner for the last owner."""
    with db.atomic():
        organisations.lock_organisation(org_id)
        target = member(org_id, user_id)
        if target.role == OWNER:
            refuse_last_owner(org_id, user_id, "be removed")
        Membership.delete().where(Membership.id == target.id).execute()
        securitylog.record_in(org_id, "member.removed", f"{target.user.username} ({target.role})"
                              + ("; its keys revoked" if revoke_keys else ""))
    return revoke_keys_of(org_id, user_id) if revoke_keys else 0


def leave(org_id, user):
    """The user leaves the organisation, its keys left working. LastOwner for the last owner;
    ValueError for the user's personal organisation."""
    with db.atomic():
        organisations.lock_organisation(org_id)
        target = member(org_id, user.id)
        if Organisation.get_by_id(org_id).personal_for_id == user.id:
            raise ValueError("You cannot leave your personal organisation.")
        if target.role == OWNER:
            refuse_last_owner(org_id, user.id, "leave")
        Membership.delete().where(Membership.id == target.id).execute()
        securitylog.record_in(org_id, "member.left", f"{user.username} ({target.role})", actor_id=user.id)


def revoke_keys_of(org_id, user_id):
    """Revoke every active key the user (a member or a former one) made in the organisation; return how many."""
    revoked = 0
    for key in ApiKey.active_in(org_id, created_by=user_id):
        revoked += auth.revoke_key(key)
    return revoked


def refuse_last_owner(org_id, user_id, change):
    others = Membership.select().where((Membership.org == org_id) & (Membership.role == OWNER)
                                       & (Membership.user != user_id))
    if not others.exists():
        raise LastOwner(f"An organisation always has an owner: its last owner cannot {change}. Make another "
                        "member an owner first.")
