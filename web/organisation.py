"""Profile Settings' Organisation tab (/settings/organisation): the current organisation's name and
slug, renamed by an owner, and deleted by an owner after typing its name."""

from flask import flash, g, redirect, render_template, request, url_for

from models import ApiKey, FormerSlug, utcnow
from orgs import orgadmin, roles
from web.hooks import login_required, page_blueprint
from web.members import refuse_unless_allowed

bp = page_blueprint("organisation", __name__)


@bp.get("/settings/organisation")
@login_required
def settings_organisation():
    return render_organisation_tab()


def render_organisation_tab(status=200):
    former = (FormerSlug.select().where((FormerSlug.org == g.org.id) & (FormerSlug.until > utcnow()))
              .order_by(FormerSlug.until.desc()))
    return render_template("settings_organisation.html", active_keys=ApiKey.active_in(g.org.id).count(),
                           former_slug_kept_days=orgadmin.FORMER_SLUG_KEPT.days, former_slugs=list(former)), status


@bp.post("/settings/organisation/rename")
@login_required
def rename_organisation():
    refuse_unless_allowed(roles.ORG_MANAGE)
    if stale := page_of_another_organisation():
        return stale
    try:
        renamed = orgadmin.rename(g.org.id, request.form.get("name", ""), actor=g.user)
    except ValueError as refused:
        flash(str(refused), "error")
        return render_organisation_tab(status=400)
    flash(f"The organisation is now {renamed.name}, its slug {renamed.slug}.")
    return redirect(url_for("organisation.settings_organisation"))


@bp.post("/settings/organisation/delete")
@login_required
def delete_organisation():
    refuse_unless_allowed(roles.ORG_MANAGE)
    if stale := page_of_another_organisation():
        return stale
    if request.form.get("confirm_name", "").strip() != g.org.name:
        flash(f"Type the organisation's name, {g.org.name}, to delete it.", "error")
        return render_organisation_tab(status=400)
    try:
        deleted = orgadmin.delete(g.org.id, actor=g.user)
    except orgadmin.PersonalOrganisation as refused:
        flash(str(refused), "error")
        return render_organisation_tab(status=409)
    flash(f"Deleted {deleted.name}: its keys are revoked. You now work in your personal organisation.")
    return redirect(url_for("security.settings_security"))


def page_of_another_organisation():
    """The 409 page when the form was drawn for another organisation than the current one (the
    organisation switched, or deleted, in another tab since), else None."""
    if request.form.get("org_id") == str(g.org.id):
        return None
    flash("This form was for another organisation than the one you now work in; nothing changed. Here is "
          f"{g.org.name}'s.", "error")
    return render_organisation_tab(status=409)
