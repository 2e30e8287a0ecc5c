"""Organisations: the errors of their rules, a row held for a change, the one a session works in,
and what an account's deletion does to them (the organisations it alone belonged to deleted, its
keys elsewhere kept for their organisations). Member changes are orgs/members.py's."""

from blinker import Namespace
from peewee import PostgresqlDatabase, fn

from accounts import users
from keys import keycache
from models import (
    OWNER,
    ApiKey,
    Membership,
    Organisation,
    SecurityEvent,
    Session,
    User,
    create_personal_organisation,
    db,
    personal_organisation,
)

signals = Namespace()
# Sent inside the deleting transaction with org_ids, before their keys go: the rooms above delete
# what those organisations held (webhook endpoints), which an upgraded SQLite database has no
# foreign key to cascade to, and billing writes their last hours.
organisations_deleted = signals.signal("organisations-deleted")
# Sent inside the deleting transaction with the account's user id: the invitations it sent and
# that are still pending end with it, as when it is removed from their organisation.
account_deleted = signals.signal("account-deleted")


class OrganisationError(Exception):
    """What an organisation's rules refuse, or a change that found the organisation gone. Whoever
    answers the request says how: web/hooks.py's REFUSAL_STATUS, cli/orgs.py's sentences."""


class SoleOwner(OrganisationError, ValueError):
    """The account is the only owner of an organisation that has other members; a ValueError as
    well, whose sentence the password-confirmed forms show as any other refusal's."""


class OrganisationGone(OrganisationError):
    """The organisation was deleted since it was read."""


def lock_organisation(org_id):
    """Hold the organisation's row until the transaction ends, so two requests cannot both pass a
    cap (keys, endpoints, owners); a write first on SQLite (accounts.users.lock_user says why).
    Raise OrganisationGone when it no longer exists."""
    if isinstance(db.obj, PostgresqlDatabase):
        found = Organisation.select(Organisation.id).where(Organisation.id == org_id).for_update().first() is not None
    else:
        found = Organisation.update(created_at=Organisation.created_at).where(Organisation.id == org_id).execute() > 0
    if not found:
        raise OrganisationGone()


def personal_first(user_id):
    """An ORDER BY term that puts the user's personal organisation first: the comparison alone is
    NULL for the others, which PostgreSQL sorts before TRUE in descending order."""
    return fn.COALESCE(Organisation.personal_for == user_id, False).desc()


def current_membership(user, session_org_id=None):
    """The membership a logged-in user works in: the session's organisation while the user belongs
    to it, else the personal one (made for an account that belongs to none, which only a row
    written outside the service can leave)."""
    memberships = Membership.select(Membership, Organisation).join(Organisation).where(Membership.user == user.id)
    if session_org_id is not None:
        chosen = memberships.where(Membership.org == session_org_id).first()
        if chosen is not None:
            return chosen
    found = memberships.order_by(personal_first(user.id), Membership.id).first()
    if found is None:
        with db.atomic():
            personal = personal_organisation(user.id)
            if personal is None:
                create_personal_organisation(user)
            else:
                Membership.create(org=personal.id, user=user.id, role=OWNER)
        found = memberships.order_by(personal_first(user.id), Membership.id).first()
    return found


def leave_for_deletion(user):
    """Inside the deletion's transaction: delete the organisations the account alone belongs to,
    with their keys; keep the keys it made in the others, working, their creator forgotten; return
    the keys deleted or changed. Raise SoleOwner, changing nothing, where the account is the only
    owner of others' organisation."""
    # In the organisations' order, as every deletion locks them: two at once must not deadlock.
    memberships = list(Membership.select(Membership.org).where(Membership.user == user.id).order_by(Membership.org))
    alone = []
    for membership in memberships:
        lock_organisation(membership.org_id)
        others = list(Membership.select(Membership.role).where(
            (Membership.org == membership.org_id) & (Membership.user != user.id)))
        if not others:
            alone.append(membership.org_id)
        elif not any(other.role == OWNER for other in others):
            name = Organisation.get_by_id(membership.org_id).name
            raise SoleOwner(f"You are the only owner of {name}: make another member an owner first.")
    changed = list(ApiKey.select(ApiKey.id, ApiKey.org).where(ApiKey.user == user.id))
    if alone:
        deleted = ApiKey.select(ApiKey.id, ApiKey.org).where(ApiKey.org.in_(alone)).order_by(ApiKey.id)
        if isinstance(db.obj, PostgresqlDatabase):
            # In id order, as the usage flush locks keys (a DELETE alone could deadlock with it).
            deleted = deleted.for_update()
        changed += list(deleted)
        # Before the keys go: billing writes their last hours from their usage rows.
        organisations_deleted.send(alone)
        ApiKey.delete().where(ApiKey.org.in_(alone)).execute()
        SecurityEvent.delete().where(SecurityEvent.org.in_(alone)).execute()
        Organisation.delete().where(Organisation.id.in_(alone)).execute()
    ApiKey.update(user=None).where(ApiKey.user == user.id).execute()
    SecurityEvent.delete().where((SecurityEvent.user == user.id) & SecurityEvent.org.is_null()).execute()
    SecurityEvent.update(user=None).where(SecurityEvent.user == user.id).execute()
    Organisation.update(personal_for=None).where(Organisation.personal_for == user.id).execute()
    Membership.delete().where(Membership.user == user.id).execute()
    account_deleted.send(user.id)
    return changed


def delete_account(user, password):
    """Delete the account and its sessions after checking the password, with the organisations it
    alone belongs to and their keys (which fail from the next request on, and whose open time
    sockets close); the keys it made in other organisations keep working for them (raise
    SoleOwner where it is the only owner of one with other members)."""
    if not users.password_matches(user, password):
        raise users.WrongPassword("The password is not correct.")
    with db.atomic():
        users.lock_user(user)
        changed = leave_for_deletion(user)
        Session.delete().where(Session.user == user.id).execute()
        User.delete().where(User.id == user.id).execute()
    keycache.announce_change(*changed)
