"""Invitations: an owner or admin asks an address to join with a role. The link
(/invitations/<TOKEN>) is mailed, and shown once to whoever invited; it works once, for 7 days,
for an account with the invited address; sending it again makes a new link and voids the old."""

import datetime

from accounts import emailtokens, securitylog, users
from mail import addresscap, outbox
from models import ROLES, Membership, Organisation, SecurityEvent, User, db, utcnow
from orgs import members, organisations, roles
from orgs.models import Invitation

LIFETIME = datetime.timedelta(days=7)
# Pending invitations an organisation may hold, links it may mail an hour, and the wait before a
# link is sent again: each mails a stranger, so no account may turn the service into a mail cannon
# (nor may all of them together: one address gets at most mail/addresscap.py's cap).
MAX_PENDING = 50
MAILS_PER_HOUR = 20
RESEND_AFTER = datetime.timedelta(minutes=1)
# Invitations accepted, revoked or expired are kept this long (the Members tab does not list them),
# then deleted at the organisation's next invitation.
KEPT_AFTER_END = datetime.timedelta(days=30)
# Why a link cannot be used, as its page says (emailtokens' words).
UNKNOWN, USED, VOIDED, EXPIRED = emailtokens.UNKNOWN, emailtokens.USED, emailtokens.VOIDED, emailtokens.EXPIRED


class WrongAddress(organisations.OrganisationError):
    """The invitation is for another address than the logged-in account's."""


class Unusable(organisations.OrganisationError):
    """The link cannot be used: why is UNKNOWN, USED, VOIDED or EXPIRED; row the invitation, if any."""

    def __init__(self, row, why):
        super().__init__(why)
        self.row, self.why = row, why


def invite(org_id, email, role, inviter=None):
    """Invite the address with the role, when the inviter's role allows it (inviter None: the
    command line); return (Invitation, link: an absolute URL, or the path when no PUBLIC_URL is
    known). ValueError with a sentence for an address or role refused, a member's or an invited
    address, or a cap reached (addresscap.NoMoreMail, the address's); members.NotAllowed."""
    email = users.checked_email(email)
    outbox.checked_address(email)
    if role not in ROLES:
        raise ValueError(f"The roles are {', '.join(ROLES)}.")
    now = utcnow()
    with db.atomic():
        organisations.lock_organisation(org_id)
        members.require(org_id, inviter, roles.MEMBER_INVITE, target_role=None, new_role=role)
        if (Membership.select().join(User).where((Membership.org == org_id) & (User.email == email)).exists()):
            raise ValueError(f"{email} is already a member.")
        pending = pending_in(org_id)
        if pending.where(Invitation.email == email).exists():
            raise ValueError(f"{email} is already invited: send that invitation again from the list.")
        if pending.count() >= MAX_PENDING:
            raise ValueError(f"An organisation may have {MAX_PENDING} pending invitations; revoke one first.")
        refuse_beyond_hourly_mails(org_id, now)
        forget_ended(org_id, now)
        token = emailtokens.new_token()
        invitation = Invitation.create(org=org_id, email=email, role=role, token_hash=emailtokens.hashed(token),
                                       invited_by=inviter and inviter.id, created_at=now, sent_at=now,
                                       expires_at=now + LIFETIME)
        link = mail(invitation, token, inviter)
        securitylog.record_in(org_id, "member.invited", f"{email} as {role}", actor_id=inviter and inviter.id)
    return invitation, link


def send_again(invitation, actor=None):
    """A new link for a pending invitation, mailed as invite()'s, when the actor's role allows it
    (actor None: the command line); return it. The invitation is made anew (a new row and id) and
    the old one voided with its link, whose page then says so. ValueError (addresscap.NoMoreMail
    among them) as invite()'s."""
    now = utcnow()
    with db.atomic():
        organisations.lock_organisation(invitation.org_id)
        members.require(invitation.org_id, actor, roles.MEMBER_INVITE, target_role=None, new_role=invitation.role)
        if invitation.sent_at > now - RESEND_AFTER:
            raise ValueError("That invitation was sent less than a minute ago; wait a moment before sending it again.")
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
        securitylog.record_in(invitation.org_id, "member.invited",
                              f"{invitation.email} as {invitation.role} (sent again)", actor_id=actor and actor.id)
        return mail(renewed, token, actor)


def revoke(invitation, actor=None):
    """Revoke a pending invitation, when the actor's role allows it (actor None: the command line);
    its link stops working. False when it was no longer pending."""
    with db.atomic():
        organisations.lock_organisation(invitation.org_id)
        members.require(invitation.org_id, actor, roles.MEMBER_INVITE, target_role=None, new_role=invitation.role)
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
    for an account with the invited address only. It does not confirm that address: whoever
    invited saw the link too, and could have made an account with someone else's address. Return
    the Membership; Unusable when the link cannot be used, WrongAddress for an account with
    another address, ValueError past MAX_MEMBERSHIPS."""
    with db.atomic():
        users.lock_user(user)
        row, why = find(token)
        if why is not None:
            raise Unusable(row, why)
        organisations.lock_organisation(row.org_id)
        if User.get_by_id(user.id).email != row.email:
            raise WrongAddress()
        members.refuse_beyond_memberships(user.id)
        now = utcnow()
        # The token again: a link sent anew since find read the row is void.
        if not (Invitation.update(accepted_at=now)
                .where((Invitation.id == row.id) & (Invitation.token_hash == emailtokens.hashed(token))
                       & Invitation.accepted_at.is_null() & Invitation.revoked_at.is_null()
                       & (Invitation.expires_at > now))
                .execute()):
            raise Unusable(row, USED)
        membership = Membership.get_or_none((Membership.org == row.org_id) & (Membership.user == user.id))
        if membership is None:
            membership = Membership.create(org=row.org_id, user=user.id, role=row.role, created_at=now)
            securitylog.record_in(row.org_id, "member.joined", f"{user.username} as {row.role}", actor_id=user.id)
    return membership


def forget_ended(org_id, now):
    before = now - KEPT_AFTER_END
    (Invitation.delete().where((Invitation.org == org_id) & ((Invitation.accepted_at < before)
                                                              | (Invitation.revoked_at < before)
                                                              | (Invitation.expires_at < before))).execute())


def pending_in(org_id):
    """The organisation's invitations that can still be accepted, oldest first."""
    return (Invitation.select().where((Invitation.org == org_id) & Invitation.accepted_at.is_null()
                                      & Invitation.revoked_at.is_null() & (Invitation.expires_at > utcnow()))
            .order_by(Invitation.id))


def refuse_beyond_hourly_mails(org_id, now):
    """The cap on an organisation's invitation mails: each invitation, and each sent again, is a
    member.invited event of its log."""
    since = now - datetime.timedelta(hours=1)
    sent = SecurityEvent.select().where((SecurityEvent.org == org_id) & (SecurityEvent.event == "member.invited")
                                        & (SecurityEvent.created_at > since)).count()
    if sent >= MAILS_PER_HOUR:
        raise ValueError(f"An organisation may send {MAILS_PER_HOUR} invitations an hour; try again later.")


def mail(invitation, token, asker):
    """Queue the invitation's mail (inside the caller's transaction) as the account asker asks it,
    counted in the address's cap (addresscap.NoMoreMail past it); return its link: absolute when
    PUBLIC_URL (or a request) gives the site's address, else the path alone (the command line
    prints it, and no mail goes, as the link in it would lead nowhere)."""
    path = f"/invitations/{token}"
    link = outbox.link(path)
    if link is not None:
        org = Organisation.get_by_id(invitation.org_id)
        inviter = invitation.invited_by_id and User.get_or_none(User.id == invitation.invited_by_id)
        addresscap.queue(asker, invitation.email, "invitation", org=org.name,
                         inviter=inviter.username if inviter else None, role=invitation.role, link=link,
                         days=LIFETIME.days)
    return link or path
