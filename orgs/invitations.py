"""Invitations: an owner or admin asks an address to join with a role. The link
(/invitations/<TOKEN>) is mailed, and shown once to whoever invited; it works once, for 7 days,
for an account with the invited address; sending it again makes a new link and voids the old."""

import datetime

from accounts import emailtokens, organisations, securitylog, users
from mail import outbox
from models import ROLES, Membership, Organisation, User, db, utcnow
from orgs.models import Invitation

LIFETIME = datetime.timedelta(days=7)
# Pending invitations an organisation may hold, and links it may mail an hour: each mails a
# stranger, so an account must not turn the service into a mail cannon.
MAX_PENDING = 50
MAILS_PER_HOUR = 20
# Why a link cannot be used, as its page says (emailtokens' words).
UNKNOWN, USED, VOIDED, EXPIRED = emailtokens.UNKNOWN, emailtokens.USED, emailtokens.VOIDED, emailtokens.EXPIRED


class WrongAddress(Exception):
    """The invitation is for another address than the logged-in account's (HTTP 403)."""


class Unusable(Exception):
    """The link cannot be used: why is UNKNOWN, USED, VOIDED or EXPIRED; row the invitation, if any."""

    def __init__(self, row, why):
        super().__init__(why)
        self.row, self.why = row, why


def invite(org_id, email, role, inviter=None):
    """Invite the address with the role; return (Invitation, link: an absolute URL, or the path
    when no PUBLIC_URL is known). ValueError with a sentence for an address or role refused, a
    member's or an invited address, or a cap reached."""
    email = users.checked_email(email)
    outbox.checked_address(email)
    if role not in ROLES:
        raise ValueError(f"The roles are {', '.join(ROLES)}.")
    now = utcnow()
    with db.atomic():
        organisations.lock_organisation(org_id)
        if (Membership.select().join(User).where((Membership.org == org_id) & (User.email == email)).exists()):
            raise ValueError(f"{email} is already a member.")
        pending = pending_in(org_id)
        if pending.where(Invitation.email == email).exists():
            raise ValueError(f"{email} is already invited: send that invitation again from the list.")
        if pending.count() >= MAX_PENDING:
            raise ValueError(f"An organisation may have {MAX_PENDING} pending invitations; revoke one first.")
        refuse_beyond_hourly_mails(org_id, now)
        token = emailtokens.new_token()
        invitation = Invitation.create(org=org_id, email=email, role=role, token_hash=emailtokens.hashed(token),
                                       invited_by=inviter and inviter.id, created_at=now, sent_at=now,
                                       expires_at=now + LIFETIME)
        link = mail(invitation, token)
        securitylog.record_in(org_id, "member.invited", f"{email} as {role}")
    return invitation, link


def send_again(invitation):
    """A new link for a pending invitation, mailed as invite()'s; return it. The invitation is made
    anew (a new row, which the hourly cap counts as the mail it is) and the old one voided with its
    link."""
    now = utcnow()
    with db.atomic():
        organisations.lock_organisation(invitation.org_id)
        refuse_beyond_hourly_mails(invitation.org_id, now)
        voided = (Invitation.update(revoked_at=now)
                  .where((Invitation.id == invitation.id) & Invitation.accepted_at.is_null()
                         & Invitation.revoked_at.is_null()).execute())
        if not voided:
            raise ValueError("That invitation was accepted or revoked meanwhile.")
        token = emailtokens.new_token()
        renewed = Invitation.create(org=invitation.org_id, email=invitation.email, role=invitation.role,
                                    token_hash=emailtokens.hashed(token), invited_by=invitation.invited_by_id,
                                    created_at=invitation.created_at, sent_at=now, expires_at=now + LIFETIME)
        return mail(renewed, token)


def revoke(invitation):
    """Revoke a pending invitation; its link stops working. False when it was no longer pending."""
    with db.atomic():
        revoked = (Invitation.update(revoked_at=utcnow())
                   .where((Invitation.id == invitation.id) & Invitation.accepted_at.is_null()
                          & Invitation.revoked_at.is_null()).execute())
        if revoked:
            securitylog.record_in(invitation.org_id, "invitation.revoked", f"{invitation.email} as {invitation.role}")
    return bool(revoked)


def find(token, now=None):
    """(Invitation, None) for a link that can be used, else (None or the row, why not: UNKNOWN,
    USED, VOIDED (revoked) or EXPIRED)."""
    if not isinstance(token, str) or not emailtokens.TOKEN_PATTERN.fullmatch(token):
        return None, UNKNOWN
    row = Invitation.select(Invitation, Organisation).join(Organisation).where(
        Invitation.token_hash == emailtokens.hashed(token)).first()
    if row is None:
        return None, UNKNOWN
    if row.accepted_at is not None:
        return row, USED
    if row.revoked_at is not None:
        return row, VOIDED
    if row.expires_at <= (now or utcnow()):
        return row, EXPIRED
    return row, None


def accept(token, user):
    """The logged-in user joins the organisation with the invitation's role; the link works once,
    and following it confirms the address. Return the Membership; Unusable when the link cannot
    be used, WrongAddress for an account with another address."""
    with db.atomic():
        users.lock_user(user)
        row, why = find(token)
        if why is not None:
            raise Unusable(row, why)
        organisations.lock_organisation(row.org_id)
        if User.get_by_id(user.id).email != row.email:
            raise WrongAddress()
        now = utcnow()
        if not (Invitation.update(accepted_at=now)
                .where((Invitation.id == row.id) & Invitation.accepted_at.is_null() & Invitation.revoked_at.is_null())
                .execute()):
            raise Unusable(row, USED)
        User.update(email_verified_at=now).where((User.id == user.id) & User.email_verified_at.is_null()).execute()
        membership = Membership.get_or_none((Membership.org == row.org_id) & (Membership.user == user.id))
        if membership is None:
            membership = Membership.create(org=row.org_id, user=user.id, role=row.role, created_at=now)
            securitylog.record_in(row.org_id, "member.joined", f"{user.username} as {row.role}", actor_id=user.id)
    return membership


def pending_in(org_id):
    """The organisation's invitations that can still be accepted, oldest first."""
    return (Invitation.select().where((Invitation.org == org_id) & Invitation.accepted_at.is_null()
                                      & Invitation.revoked_at.is_null() & (Invitation.expires_at > utcnow()))
            .order_by(Invitation.id))


def refuse_beyond_hourly_mails(org_id, now):
    sent = Invitation.select().where((Invitation.org == org_id)
                                     & (Invitation.sent_at > now - datetime.timedelta(hours=1))).count()
    if sent >= MAILS_PER_HOUR:
        raise ValueError(f"An organisation may send {MAILS_PER_HOUR} invitations an hour; try again later.")


def mail(invitation, token):
    """Queue the invitation's mail (inside the caller's transaction); return its link: absolute
    when PUBLIC_URL (or a request) gives the site's address, else the path alone (the command line
    prints it, and no mail goes, as the link in it would lead nowhere)."""
    path = f"/invitations/{token}"
    link = outbox.link(path)
    if link is not None:
        org = Organisation.get_by_id(invitation.org_id)
        inviter = invitation.invited_by_id and User.get_or_none(User.id == invitation.invited_by_id)
        outbox.queue(invitation.email, "invitation", org=org.name, inviter=inviter.username if inviter else None,
                     role=invitation.role, link=link, days=LIFETIME.days)
    return link or path
