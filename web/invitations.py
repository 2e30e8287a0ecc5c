"""Invitations on the web: the Members tab's forms to invite an address, revoke an invitation or send
it again (the link shown once to whoever sent it), and the link's own page (/invitations/<TOKEN>),
whose GET only says what the invitation is and whose form (POST) joins."""

import json

from flask import abort, flash, g, redirect, render_template, request, session, url_for

from accounts import sessions
from mail import outbox
from orgs import invitations, members as org_members
from orgs.models import Invitation
from web.hooks import MAX_ID, login_required, page_blueprint, status_of
from web.members import MEMBERS_TAB, members_tab_error
from web.recovery import LINK_REFERRER_POLICY

bp = page_blueprint("invitations", __name__)

UNUSABLE_STATUS = {invitations.UNKNOWN: 404, invitations.USED: 410, invitations.VOIDED: 410,
                   invitations.EXPIRED: 410}
SECTION = "#invitations"


@bp.post("/settings/members/invite")
@login_required
def invite():
    try:
        invitation, link = invitations.invite(g.org.id, request.form.get("email", ""), request.form.get("role", ""),
                                              g.user)
    except ValueError as refused:  # addresscap.NoMoreMail among them
        return members_tab_error(str(refused), status_of(refused))
    show_link_once(invitation, link)
    return redirect(url_for(MEMBERS_TAB) + SECTION)


def show_link_once(invitation, link):
    """Keep the link with the session, encrypted, for the Members tab to show once (as a new key's secret)."""
    sessions.keep_pending_secret(g.session, session["sid"], json.dumps({
        "invitation_link": link, "email": invitation.email, "role": invitation.role, "mailed": outbox.enabled()}))


def pending_invitation(invitation_id):
    """The current organisation's pending invitation with this id; 404 for any other."""
    invitation = invitations.pending_in(g.org.id).where(Invitation.id == invitation_id).first()
    if invitation is None:
        abort(404)
    return invitation


@bp.post(f"/settings/members/invitations/<int(max={MAX_ID}):invitation_id>/revoke")
@login_required
def revoke_invitation(invitation_id):
    invitation = pending_invitation(invitation_id)
    if not invitations.revoke(invitation, actor=g.user):
        return members_tab_error("That invitation was accepted or revoked meanwhile.", 409)
    flash(f"The invitation of {invitation.email} is revoked: its link no longer works.")
    return redirect(url_for(MEMBERS_TAB) + SECTION)


@bp.post(f"/settings/members/invitations/<int(max={MAX_ID}):invitation_id>/resend")
@login_required
def resend_invitation(invitation_id):
    invitation = pending_invitation(invitation_id)
    try:
        link = invitations.send_again(invitation, actor=g.user)
    except ValueError as refused:  # addresscap.NoMoreMail among them
        return members_tab_error(str(refused), status_of(refused))
    show_link_once(invitation, link)
    return redirect(url_for(MEMBERS_TAB) + SECTION)


@bp.get("/invitations/<token>")
def invitation_page(token):
    invitation, why = invitations.find(token)
    if why is not None:
        return unusable_page(invitation, why)
    wrong_address = g.user is not None and g.user.email != invitation.email
    return (render_template("invitation.html", invitation=invitation, wrong_address=wrong_address),
            403 if wrong_address else 200, LINK_REFERRER_POLICY)


@bp.post("/invitations/<token>")
@login_required
def accept_invitation(token):
    try:
        membership = invitations.accept(token, g.user)
    except invitations.Unusable as unusable:
        return unusable_page(unusable.row, unusable.why)
    except invitations.WrongAddress as refused:
        invitation, _ = invitations.find(token)
        return (render_template("invitation.html", invitation=invitation, wrong_address=True), status_of(refused),
                LINK_REFERRER_POLICY)
    except ValueError as refused:  # a cap of the account's (memberships)
        flash(str(refused), "error")
        invitation, _ = invitations.find(token)
        return render_template("invitation.html", invitation=invitation), status_of(refused), LINK_REFERRER_POLICY
    org = org_members.switch(g.session, g.user, membership.org.slug).org
    flash(f"You joined {org.name} as {membership.role}; it is now the organisation you work in.")
    return redirect(url_for(MEMBERS_TAB))


def unusable_page(invitation, why):
    return (render_template("invitation.html", invitation=invitation, why=why), UNUSABLE_STATUS[why],
            LINK_REFERRER_POLICY)
