"""Organisations and their members: create, switch, change a role, remove, leave, and revoke the
keys a member (or a former member) made. Every change happens with the organisation's row held
(orgs/organisations.lock_organisation), so two admins at once cannot leave it without an owner,
and the acting member's role is read again under it (a role changed meanwhile decides); each writes
its event to the organisation's security log."""

import datetime

from peewee import JOIN, IntegrityError

from accounts import securitylog, users
from keys import keycache
from models import OWNER, ROLES, ApiKey, FormerSlug, Membership, Organisation, SecurityEvent, Session, User, db, utcnow
from orgs import keyactions, organisations, roles
from orgs.models import Invitation
from store import slugs

MAX_NAME_LENGTH = 64
# Organisations one account may make, and belong to: each organisation has its own allowances, so
# a script must not make them without end.
MAX_CREATED = 20
MAX_MEMBERSHIPS = 100
# Role changes and removals an organisation makes an hour: its log keeps its newest 1,000 events,
# which an admin flipping a role at will could otherwise push out in a minute.
CHANGES_PER_HOUR = 60


class LastOwner(organisations.OrganisationError):
    """The change would leave the organisation without an owner."""


class NotMember(organisations.OrganisationError):
    """The user is not (or no longer) a member of the organisation."""


class NotAllowed(organisations.OrganisationError):
    """The acting member's role does not allow the change."""


class PersonalOwner(LastOwner):
    """The change would take a personal organisation from the user it belongs to."""


def create(name, owner):
    """Make an organisation owned by owner; return it. ValueError with a sentence for a name
    refused or taken, or an account that made MAX_CREATED or belongs to MAX_MEMBERSHIPS already."""
    name, slug = checked_name(name)
    taken = ValueError(f"The name {slug!r} is taken; choose another.")
    try:
        with db.atomic():
            users.lock_user(owner)
            if Organisation.select().where(Organisation.created_by == owner.id).count() >= MAX_CREATED:
                raise ValueError(f"One account may make {MAX_CREATED} organisations.")
            refuse_beyond_memberships(owner.id)
            if Organisation.select().where(Organisation.slug == slug).exists() or former_slug_of(slug) is not None:
                raise taken
            org = Organisation.create(name=name, slug=slug, created_by=owner.id)
            Membership.create(org=org.id, user=owner.id, role=OWNER)
            securitylog.record_in(org.id, "org.created", name)
    except IntegrityError:
        raise taken from None  # another request made it meanwhile
    return org


def checked_name(name):
    """(name, its slug) for an organisation's name; ValueError with a sentence for one refused."""
    name = name.strip()
    users.refuse_control_characters(name, "An organisation's name")
    if not 0 < len(name) <= MAX_NAME_LENGTH:
        raise ValueError(f"An organisation's name is 1 to {MAX_NAME_LENGTH} characters.")
    slug = slugs.slug_of(name)
    if not slug:
        raise ValueError("An organisation's name needs a letter or a digit.")
    return name, slug


def former_slug_of(slug):
    """The kept FormerSlug row of this slug (orgs/orgadmin.py renames), or None."""
    return FormerSlug.get_or_none((FormerSlug.slug == slug) & (FormerSlug.until > utcnow()))


def refuse_beyond_memberships(user_id):
    if Membership.select().where(Membership.user == user_id).count() >= MAX_MEMBERSHIPS:
        raise ValueError(f"One account may belong to {MAX_MEMBERSHIPS} organisations.")


def memberships_of(user):
    """The user's memberships with their organisations, the personal one first, then by name."""
    return list(Membership.select(Membership, Organisation).join(Organisation).where(Membership.user == user.id)
                .order_by(organisations.personal_first(user.id), Organisation.name, Organisation.id))


def find_membership(user, slug):
    """The user's membership of the organisation with this slug; NotMember when there is none."""
    membership = (Membership.select(Membership, Organisation).join(Organisation)
                  .where((Membership.user == user.id) & (Organisation.slug == slug)).first())
    if membership is None and (former := former_slug_of(slug)) is not None:
        membership = (Membership.select(Membership, Organisation).join(Organisation)
                      .where((Membership.user == user.id) & (Organisation.id == former.org_id)).first())
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


def change_role(org_id, user_id, role, actor=None):
    """Give the member the role, when the actor's role allows it (actor None: the command line);
    LastOwner when it is the last owner's, or the personal organisation's own, and role is not owner."""
    if role not in ROLES:
        raise ValueError(f"The roles are {', '.join(ROLES)}.")
    with db.atomic():
        organisations.lock_organisation(org_id)
        target = member(org_id, user_id)
        require(org_id, actor, roles.MEMBER_ROLE, target_role=target.role, new_role=role)
        if target.role == role:
            return target
        if target.role == OWNER:
            refuse_last_owner(org_id, user_id, "lose the role")
        refuse_beyond_hourly_changes(org_id)
        Membership.update(role=role).where(Membership.id == target.id).execute()
        securitylog.record_in(org_id, "member.role_changed", f"{target.user.username}: {target.role} to {role}")
        if role not in ("owner", "admin"):
            revoke_invitations_by(org_id, user_id)
    target.role = role
    return target


def remove(org_id, user_id, revoke_keys=False, actor=None):
    """Remove the member, when the actor's role allows it (actor None: the command line), its keys
    left working (revoke_keys: revoked too, in the same transaction) and the invitations it sent
    revoked; return how many keys were revoked. LastOwner for the last owner, or the personal
    organisation's own."""
    with keycache.announced_after_commit(), db.atomic():
        organisations.lock_organisation(org_id)
        target = member(org_id, user_id)
        require(org_id, actor, roles.MEMBER_REMOVE, target_role=target.role, new_role=None)
        if revoke_keys:
            require(org_id, actor, roles.MEMBER_REVOKE_KEYS, target_role=target.role, new_role=None)
        if target.role == OWNER:
            refuse_last_owner(org_id, user_id, "be removed")
        refuse_beyond_hourly_changes(org_id)
        Membership.delete().where(Membership.id == target.id).execute()
        revoke_invitations_by(org_id, user_id)
        securitylog.record_in(org_id, "member.removed", f"{target.user.username} ({target.role})"
                              + ("; its keys revoked" if revoke_keys else ""))
        return revoke_keys_of(org_id, user_id) if revoke_keys else 0


def leave(org_id, user):
    """The user leaves the organisation, its keys left working and the invitations it sent revoked.
    LastOwner for the last owner, and for the user's own personal organisation."""
    with db.atomic():
        organisations.lock_organisation(org_id)
        target = member(org_id, user.id)
        if target.role == OWNER:
            refuse_last_owner(org_id, user.id, "leave")
        Membership.delete().where(Membership.id == target.id).execute()
        revoke_invitations_by(org_id, user.id)
        securitylog.record_in(org_id, "member.left", f"{user.username} ({target.role})", actor_id=user.id)


def revoke_keys_of(org_id, user_id, actor=None):
    """Revoke every active key the user (a member or a former one) made in the organisation, when
    the actor's role allows it (actor None: the command line); return how many."""
    if user_id is None:
        raise ValueError("Name whose keys to revoke: a key whose creator's account is gone is revoked on its own.")
    if actor is not None:
        with db.atomic():
            organisations.lock_organisation(org_id)
            target = Membership.get_or_none((Membership.org == org_id) & (Membership.user == user_id))
            require(org_id, actor, roles.MEMBER_REVOKE_KEYS, target_role=target and target.role, new_role=None)
    revoked = 0
    for key in ApiKey.active_in(org_id, created_by=user_id):
        revoked += keyactions.revoke_key(key)
    return revoked


def require(org_id, actor, action, **context):
    """Raise NotAllowed unless the actor (a User; None: the command line, which may) is a member
    whose role, read now, allows the action; call with the organisation's row held."""
    if actor is None:
        return
    acting = Membership.get_or_none((Membership.org == org_id) & (Membership.user == actor.id))
    if acting is None:
        raise NotMember()
    if not roles.allows(acting.role, action, **context):
        raise NotAllowed()


def role_allows(org_id, actor, action, **context):
    """True when the actor is a member whose role, read now, allows the action."""
    acting = Membership.get_or_none((Membership.org == org_id) & (Membership.user == actor.id))
    return acting is not None and roles.allows(acting.role, action, **context)


def refuse_beyond_hourly_changes(org_id):
    since = utcnow() - datetime.timedelta(hours=1)
    changes = SecurityEvent.select().where((SecurityEvent.org == org_id) & (SecurityEvent.created_at > since)
                                           & SecurityEvent.event.in_(["member.role_changed", "member.removed"]))
    if changes.count() >= CHANGES_PER_HOUR:
        raise ValueError(f"An organisation may change roles or remove members {CHANGES_PER_HOUR} times an hour; "
                         "try again later.")


def revoke_invitations_by(org_id, user_id):
    """Revoke the pending invitations a member sent, once it may no longer invite (removed, or no
    longer an owner or admin): it must not come back through an address of its own."""
    (Invitation.update(revoked_at=utcnow())
     .where((Invitation.org == org_id) & (Invitation.invited_by == user_id) & Invitation.accepted_at.is_null()
            & Invitation.revoked_at.is_null()).execute())


def revoke_every_invitation_by(user_id):
    """orgs/organisations.py's account_deleted: a deleted account's pending invitations end
    with it, in every organisation."""
    (Invitation.update(revoked_at=utcnow())
     .where((Invitation.invited_by == user_id) & Invitation.accepted_at.is_null() & Invitation.revoked_at.is_null())
     .execute())


def init_app(app):
    organisations.account_deleted.connect(revoke_every_invitation_by)


def refuse_last_owner(org_id, user_id, change):
    if Organisation.select().where((Organisation.id == org_id) & (Organisation.personal_for == user_id)).exists():
        raise PersonalOwner(f"A personal organisation always keeps its own user as an owner: it cannot {change}.")
    others = Membership.select().where((Membership.org == org_id) & (Membership.role == OWNER)
                                       & (Membership.user != user_id))
    if not others.exists():
        raise LastOwner(f"An organisation always has an owner: its last owner cannot {change}. Make another "
                        "member an owner first.")
