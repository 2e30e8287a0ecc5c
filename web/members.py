"""Organisations on the web: the header's switcher, the Members tab (/settings/members) and its
forms to create an organisation, change a member's role, remove a member, leave, and revoke the keys
a member or a former member made. Each form asks orgs/roles.py (403 when the role does not allow
it) about a member of the current organisation only (404 for anyone else); web/invitations.py has
the invitations'."""

import json

from flask import abort, current_app, flash, g, redirect, render_template, request, session, url_for
from peewee import fn
from werkzeug.exceptions import HTTPException

from accounts import sessions
from models import OWNER, ROLES, ApiKey, Membership, User, utcnow
from orgs import invitations, members as org_members, roles
from store import slugs
from web.hooks import MAX_ID, login_required, page_blueprint, status_of

bp = page_blueprint("members", __name__)

MEMBERS_TAB = "members.settings_members"
# The pages that show whichever organisation is current: a switch stays on them. Any other (a key's
# page) belongs to the organisation left, and the switch goes to the Security tab instead; but the
# switch that a key's page offers to the organisation holding the key comes back to it.
SWITCH_STAYS_ON = ("profile.settings_profile", "security.settings_security", "webhooks.settings_webhooks", MEMBERS_TAB,
                   "organisation.settings_organisation", "home.playground")
KEY_PAGE = "keys.key_page"


@bp.app_context_processor
def organisation_helpers():
    """may(action, ...): whether the member's role allows the action (orgs/roles.py), so that a page
    shows only the forms that would be accepted; my_memberships() and switch_stays_here(): the
    header's switcher's list, and whether it returns to this page."""

    def may(action, **context):
        membership = g.get("membership")
        return membership is not None and roles.allows(membership.role, action, **context)

    def my_memberships():
        return org_members.memberships_of(g.user) if g.get("user") else []

    def switch_stays_here():
        # Never true on a page whose address holds a token (a mailed link's): the form must not echo it.
        return request.endpoint in SWITCH_STAYS_ON

    return {"may": may, "roles": roles, "my_memberships": my_memberships, "switch_stays_here": switch_stays_here}


@bp.get("/settings/members")
@login_required
def settings_members():
    refuse_unless_allowed(roles.VIEW)
    pending = sessions.take_pending_secret(g.session, session["sid"])
    shown_once = json.loads(pending) if pending else None
    # A key's secret kept for the Security tab is no invitation's link: nothing of it shows here.
    return render_members_tab(invitation=shown_once if shown_once and "invitation_link" in shown_once else None)


def render_members_tab(status=200, invitation=None):
    org_id = g.org.id
    key_counts = dict(ApiKey.active_in(org_id).select(ApiKey.user, fn.COUNT(ApiKey.id))
                      .group_by(ApiKey.user).order_by().tuples())
    invitable = [role for role in ROLES
                 if roles.allows(g.membership.role, roles.MEMBER_INVITE, target_role=None, new_role=role)]
    memberships = org_members.members(org_id)
    owners = [membership.user_id for membership in memberships if membership.role == OWNER]
    # Whose role no form may change (orgs/members.py would refuse): the last owner, and the user
    # whose personal organisation this is.
    role_kept = {g.org.personal_for_id, *(owners if len(owners) == 1 else [])} - {None}
    return render_template("settings_members.html", memberships=memberships, key_counts=key_counts,
                           invitations=list(invitations.pending_in(org_id)), invitable=invitable,
                           roles_to_give=roles_to_give, former_members=org_members.former_members_keys(org_id),
                           new_invitation=invitation, max_name_length=org_members.MAX_NAME_LENGTH,
                           role_kept=role_kept, resend_after=invitations.RESEND_AFTER, now=utcnow(),
                           invite_sent=request.form if request.endpoint == "invitations.invite" else {}), status


def roles_to_give(target_role):
    """The roles the member may give a member who has target_role (the Change role form's choices)."""
    return [role for role in ROLES if role != target_role
            and roles.allows(g.membership.role, roles.MEMBER_ROLE, target_role=target_role, new_role=role)]


def members_tab_error(sentence, status):
    flash(sentence, "error")
    return render_members_tab(status=status)


def refuse_unless_allowed(action, **context):
    """403 unless the member's role allows the action."""
    if not roles.allows(g.membership.role, action, **context):
        abort(403)


@bp.post("/orgs")
@login_required
def create_organisation():
    try:
        org = org_members.create(request.form.get("name", ""), g.user)
    except ValueError as refused:
        return members_tab_error(str(refused), status_of(refused))
    org_members.switch(g.session, g.user, org.slug)
    flash(f"{org.name} is made, with you as its owner; it is now the organisation you work in.")
    return redirect(url_for(MEMBERS_TAB))


@bp.post("/orgs/switch")
@login_required
def switch_organisation():
    slug = request.form.get("org", "")
    # Only what could be a slug reaches the query (PostgreSQL refuses a NUL with an error).
    if not slug or slugs.slug_of(slug) != slug:
        abort(404)
    membership = org_members.switch(g.session, g.user, slug)
    flash(f"You now work in {membership.org.name}, as {membership.role}.")
    return redirect(page_after_switch(request.form.get("next", ""), membership.org_id))


def page_after_switch(path, org_id):
    """The page the switcher was used on, when it shows whichever organisation is current or is the
    page of a key of the organisation switched to; else the Security tab."""
    if path in {url_for(endpoint) for endpoint in SWITCH_STAYS_ON}:
        return path
    try:
        endpoint, arguments = current_app.url_map.bind("").match(path, method="GET")
    except HTTPException:  # no page's path, or one that redirects
        endpoint = None
    if endpoint == KEY_PAGE and ApiKey.select().where((ApiKey.id == arguments["key_id"])
                                                      & (ApiKey.org == org_id)).exists():
        # Built again: the router matched "////settings/..." too, which a browser reads as a host.
        return url_for(KEY_PAGE, **arguments)
    return url_for("security.settings_security")


@bp.post(f"/settings/members/<int(max={MAX_ID}):user_id>/role")
@login_required
def change_role(user_id):
    role = request.form.get("role", "")
    try:
        target = org_members.change_role(g.org.id, user_id, role, actor=g.user)
    except (org_members.LastOwner, ValueError) as refused:
        return members_tab_error(str(refused), status_of(refused))
    flash(f"{target.user.username} is now {role}.")
    return redirect(url_for(MEMBERS_TAB))


@bp.post(f"/settings/members/<int(max={MAX_ID}):user_id>/remove")
@login_required
def remove_member(user_id):
    target = org_members.member(g.org.id, user_id)
    revoke_keys = request.form.get("revoke_keys") == "1"
    # orgs/members.remove asks for MEMBER_REMOVE alone, under its lock; revoking too asks this as well.
    if revoke_keys:
        refuse_unless_allowed(roles.MEMBER_REVOKE_KEYS, target_role=target.role, new_role=None)
    try:
        revoked = org_members.remove(g.org.id, user_id, revoke_keys=revoke_keys, actor=g.user)
    except (org_members.LastOwner, ValueError) as refused:
        return members_tab_error(str(refused), status_of(refused))
    kept = ("; its keys keep working, listed below as created by a former member" if not revoke_keys
            else f"; {revoked} of its keys revoked")
    flash(f"{target.user.username} is no longer a member{kept}.")
    return redirect(url_for(MEMBERS_TAB))


@bp.post("/settings/members/leave")
@login_required
def leave_organisation():
    refuse_unless_allowed(roles.LEAVE)
    org = g.org
    try:
        org_members.leave(org.id, g.user)
    except org_members.LastOwner as refused:
        return members_tab_error(str(refused), status_of(refused))
    flash(f"You left {org.name}; the keys you made there keep working for it.")
    return redirect(url_for(MEMBERS_TAB))


@bp.post(f"/settings/members/<int(max={MAX_ID}):user_id>/revoke-keys")
@login_required
def revoke_member_keys(user_id):
    # A former member is one who made a key here; any other user is no business of this organisation.
    if not (Membership.select().where((Membership.org == g.org.id) & (Membership.user == user_id)).exists()
            or ApiKey.select().where((ApiKey.org == g.org.id) & (ApiKey.user == user_id)).exists()):
        abort(404)
    revoked = org_members.revoke_keys_of(g.org.id, user_id, actor=g.user)
    creator = User.get_or_none(User.id == user_id)
    flash(f"Revoked {revoked} key{'' if revoked == 1 else 's'} made by {creator.username if creator else 'that user'}: "
          "requests with them now fail.")
    return redirect(url_for(MEMBERS_TAB))
