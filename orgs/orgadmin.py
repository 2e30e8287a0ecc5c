"""An organisation renamed or deleted by an owner. A rename moves its slug; the former one still
finds it for FORMER_SLUG_KEPT, and no other organisation may take it meanwhile. A deletion revokes
every key first, each with its events, then ends the endpoints, invitations and memberships."""

import datetime

from peewee import IntegrityError

from accounts import securitylog, users
from keys import keycache
from models import ApiKey, FormerSlug, Membership, Organisation, SecurityEvent, User, db, utcnow
from orgs import keyactions, members, organisations, roles
from orgs.models import Invitation

FORMER_SLUG_KEPT = datetime.timedelta(days=30)
# Former slugs an organisation keeps at once: each is a slug no one else may take for 30 days, so
# renames in a loop would otherwise reserve names without end.
MAX_FORMER_SLUGS = 5


class PersonalOrganisation(organisations.OrganisationError):
    """A personal organisation cannot be deleted while its user exists (HTTP 409)."""


def find(slug, now=None):
    """The organisation with this slug, or the one that had it until a rename less than
    FORMER_SLUG_KEPT ago; None."""
    slug = slug.strip().lower()
    found = Organisation.get_or_none(Organisation.slug == slug)
    if found is None:
        former = FormerSlug.get_or_none((FormerSlug.slug == slug) & (FormerSlug.until > (now or utcnow())))
        found = former and Organisation.get_by_id(former.org_id)
    return found


def rename(org_id, name, actor=None, now=None):
    """Give the organisation a new name and the slug it makes, for actor (a User whose role, read
    under the organisation's row, must allow it; None: the command line); return the organisation
    as it is now. Its former slug is kept FORMER_SLUG_KEPT, each former one its own 30 days.
    ValueError with a sentence for a name refused or a slug taken."""
    now = now or utcnow()
    name, slug = members.checked_name(name)
    taken = ValueError(f"The name {slug!r} is taken; choose another.")
    try:
        with db.atomic():
            holding(org_id, actor)
            org = Organisation.get_by_id(org_id)
            others = Organisation.select().where((Organisation.id != org_id) & (Organisation.slug == slug))
            kept = FormerSlug.select().where((FormerSlug.org != org_id) & (FormerSlug.slug == slug)
                                             & (FormerSlug.until > now))
            if others.exists() or kept.exists():
                raise taken
            if slug != org.slug:
                refuse_beyond_former_slugs(org_id, slug, now)
                # A former slug of its own comes back; one whose 30 days ended is anyone's again.
                FormerSlug.delete().where((FormerSlug.slug.in_([slug, org.slug]))
                                          & ((FormerSlug.org == org_id) | (FormerSlug.until <= now))).execute()
                FormerSlug.create(slug=org.slug, org=org_id, until=now + FORMER_SLUG_KEPT)
            Organisation.update(name=name, slug=slug).where(Organisation.id == org_id).execute()
            securitylog.record_in(org_id, "org.renamed", f"{org.name} ({org.slug}) is now {name} ({slug})")
    except IntegrityError:
        raise taken from None  # another organisation took the slug meanwhile
    return Organisation.get_by_id(org_id)


def refuse_beyond_former_slugs(org_id, new_slug, now):
    """ValueError when the organisation already keeps MAX_FORMER_SLUGS former slugs (taking one of
    them back is always allowed)."""
    kept = list(FormerSlug.select().where((FormerSlug.org == org_id) & (FormerSlug.until > now))
                .order_by(FormerSlug.until))
    if len(kept) >= MAX_FORMER_SLUGS and new_slug not in {former.slug for former in kept}:
        raise ValueError(f"{MAX_FORMER_SLUGS} former names of this organisation are kept for 30 days; rename it "
                         f"again after {kept[0].until.strftime('%Y-%m-%d %H:%M')} UTC, or take back a former name.")


def delete(org_id, actor=None):
    """Delete the organisation for actor (as rename's): every key revoked first (its events sent,
    in this transaction), then its endpoints, invitations, memberships and log; the deletion is
    recorded in the actor's own log. PersonalOrganisation for the personal organisation of a user
    who exists."""
    with keycache.announced_after_commit(), db.atomic():
        holding(org_id, actor)
        org = Organisation.get_by_id(org_id)
        if org.personal_for_id is not None:
            raise PersonalOrganisation(f"{org.name} is {User.get_by_id(org.personal_for_id).username}'s "
                                       "personal organisation: it goes only with that account.")
        keys = list(ApiKey.select().where((ApiKey.org == org_id) & ApiKey.revoked_at.is_null()).order_by(ApiKey.id))
        for key in keys:
            keyactions.revoke_key(key)
        Invitation.delete().where(Invitation.org == org_id).execute()
        organisations.organisations_deleted.send([org_id])
        Membership.delete().where(Membership.org == org_id).execute()
        SecurityEvent.delete().where(SecurityEvent.org == org_id).execute()
        ApiKey.delete().where(ApiKey.org == org_id).execute()
        Organisation.delete().where(Organisation.id == org_id).execute()
        if actor is not None:
            securitylog.record(actor.id, "org.deleted", f"{org.name} ({org.slug}), {len(keys)} active keys revoked")
    return org


def holding(org_id, actor):
    """Hold the actor's row, then the organisation's (the order key creation takes them in), and
    refuse unless the actor's role, read now, may manage the organisation."""
    if actor is not None:
        users.lock_user(actor)
    organisations.lock_organisation(org_id)
    members.require(org_id, actor, roles.ORG_MANAGE)
