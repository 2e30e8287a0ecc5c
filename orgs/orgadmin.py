"""An organisation renamed or deleted by an owner. A rename moves its slug; the former one still
finds it for FORMER_SLUG_KEPT, and no other organisation may take it meanwhile. A deletion revokes
every key first, each with its events, then ends the endpoints, invitations and memberships."""

import datetime

from peewee import IntegrityError

from accounts import securitylog
from keys import keycache
from models import ApiKey, Membership, Organisation, SecurityEvent, User, db, utcnow
from orgs import keyactions, members, organisations
from orgs.models import Invitation

FORMER_SLUG_KEPT = datetime.timedelta(days=30)


class PersonalOrganisation(organisations.OrganisationError):
    """A personal organisation cannot be deleted while its user exists (HTTP 409)."""


def find(slug, now=None):
    """The organisation with this slug, or the one that had it until a rename less than
    FORMER_SLUG_KEPT ago; None."""
    slug = slug.strip().lower()
    found = Organisation.get_or_none(Organisation.slug == slug)
    if found is None:
        found = Organisation.get_or_none((Organisation.former_slug == slug)
                                         & (Organisation.former_slug_until > (now or utcnow())))
    return found


def slug_taken(slug, org_id, now):
    """True when another organisation has the slug, or had it until a rename that still keeps it."""
    other = Organisation.id != org_id
    return Organisation.select().where(other & ((Organisation.slug == slug) | (
        (Organisation.former_slug == slug) & (Organisation.former_slug_until > now)))).exists()


def rename(org_id, name, now=None):
    """Give the organisation a new name and the slug it makes; return the organisation as it is now.
    ValueError with a sentence for a name refused or a slug taken."""
    now = now or utcnow()
    name, slug = members.checked_name(name)
    taken = ValueError(f"The name {slug!r} is taken; choose another.")
    try:
        with db.atomic():
            organisations.lock_organisation(org_id)
            org = Organisation.get_by_id(org_id)
            if slug_taken(slug, org_id, now):
                raise taken
            changes = {Organisation.name: name}
            if slug != org.slug:
                changes.update({Organisation.slug: slug, Organisation.former_slug: org.slug,
                                Organisation.former_slug_until: now + FORMER_SLUG_KEPT})
            Organisation.update(changes).where(Organisation.id == org_id).execute()
            securitylog.record_in(org_id, "org.renamed", f"{org.name} ({org.slug}) is now {name} ({slug})")
    except IntegrityError:
        raise taken from None  # another organisation took the slug meanwhile
    return Organisation.get_by_id(org_id)


def delete(org_id):
    """Delete the organisation: every key revoked first (its events sent, in this transaction),
    then its endpoints, invitations, memberships and log; PersonalOrganisation for the personal
    organisation of a user who exists."""
    with keycache.announced_after_commit(), db.atomic():
        organisations.lock_organisation(org_id)
        org = Organisation.get_by_id(org_id)
        if org.personal_for_id is not None:
            raise PersonalOrganisation(f"{org.name} is {User.get_by_id(org.personal_for_id).username}'s "
                                       "personal organisation: it goes only with that account.")
        for key in ApiKey.select().where((ApiKey.org == org_id) & ApiKey.revoked_at.is_null()).order_by(ApiKey.id):
            keyactions.revoke_key(key)
        Invitation.delete().where(Invitation.org == org_id).execute()
        organisations.organisations_deleted.send([org_id])
        Membership.delete().where(Membership.org == org_id).execute()
        SecurityEvent.delete().where(SecurityEvent.org == org_id).execute()
        ApiKey.delete().where(ApiKey.org == org_id).execute()
        Organisation.delete().where(Organisation.id == org_id).execute()
    return org
