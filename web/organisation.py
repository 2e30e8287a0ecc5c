"""Profile Settings' Organisation tab (/settings/organisation): the current organisation's name and
slug, renamed by an owner, and deleted by an owner after typing its name; keys another system
issued imported by an owner or admin (orgs/keyimports.py); its billing customer, given by an owner
when the service exports usage to a billing system (billing/customers.py)."""

from flask import abort, current_app, flash, g, redirect, render_template, request, url_for

from accounts import throttles
from billing import customers
from models import ApiKey, FormerSlug, utcnow
from orgs import keyimports, orgadmin, roles
from serving import bodylimit
from web.hooks import login_required, page_blueprint
from web.members import refuse_unless_allowed

bp = page_blueprint("organisation", __name__)
IMPORT_PATH = "/settings/organisation/import"
# The file's own bound and room for the form around it.
bp.record_once(lambda state: bodylimit.allow_larger_bodies(state.app, IMPORT_PATH, keyimports.MAX_BYTES + 65536))
# Refused lines the page lists; the rest are counted.
REFUSALS_SHOWN = 200


@bp.get("/settings/organisation")
@login_required
def settings_organisation():
    return render_organisation_tab()


def render_organisation_tab(status=200, imported=None):
    former = (FormerSlug.select().where((FormerSlug.org == g.org.id) & (FormerSlug.until > utcnow()))
              .order_by(FormerSlug.until.desc()))
    export = current_app.config["BILLING_EXPORT"]
    billing = customers.status(export, [g.org.id]) if export != "off" else []
    return render_template("settings_organisation.html", active_keys=ApiKey.active_in(g.org.id).count(),
                           former_slug_kept_days=orgadmin.FORMER_SLUG_KEPT.days, former_slugs=list(former),
                           imported=imported, import_limits=keyimports, billing_export=export,
                           billing=billing[0] if billing else None), status


@bp.post(IMPORT_PATH)
@login_required
def import_keys():
    refuse_unless_allowed(roles.KEY_IMPORT)
    if stale := page_of_another_organisation():
        return stale
    throttles.count_key_import(g.user)
    upload = request.files.get("file")
    dry_run = request.form.get("dry_run") == "on"
    try:
        if upload is None or not upload.filename:
            raise keyimports.ImportTooLarge("Choose a JSON Lines file to import.")
        outcomes = keyimports.import_keys(g.org.id, upload.read(keyimports.MAX_BYTES + 1), dry_run=dry_run,
                                          actor=g.user)
    except keyimports.ImportTooLarge as refused:
        flash(str(refused), "error")
        return render_organisation_tab(status=400)
    refused = [outcome for outcome in outcomes if outcome.refused]
    summary = keyimports.summary(outcomes, dry_run)
    if not refused:
        flash(summary if dry_run else f"{summary} They work from the next request; the Security tab lists them.")
        return redirect(url_for("organisation.settings_organisation"))
    report = {"summary": summary, "dry_run": dry_run,
              "refused": refused[:REFUSALS_SHOWN], "more_refused": max(0, len(refused) - REFUSALS_SHOWN)}
    return render_organisation_tab(status=400, imported=report)


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


@bp.post("/settings/organisation/billing")
@login_required
def set_billing_customer():
    if current_app.config["BILLING_EXPORT"] == "off":
        abort(404)
    refuse_unless_allowed(roles.ORG_MANAGE)
    if stale := page_of_another_organisation():
        return stale
    removing = request.form.get("action") == "remove"
    try:
        row = customers.set_customer(g.org.id, None if removing else request.form.get("customer", ""), actor=g.user)
    except ValueError as refused:
        flash(str(refused), "error")
        return render_organisation_tab(status=400)
    if row is None or row.customer is None:
        flash(f"{g.org.name}'s usage is exported no more after the hour under way, which still goes out.")
    else:
        flash(f"{g.org.name}'s usage is exported as customer {row.customer}: its hours from "
              f"{customers.first_hour_of(g.org.id, row.customer):%Y-%m-%d %H:00} UTC on.")
    return redirect(url_for("organisation.settings_organisation"))


def page_of_another_organisation():
    """The 409 page when the form was drawn for another organisation than the current one (the
    organisation switched, or deleted, in another tab since), else None."""
    if request.form.get("org_id") == str(g.org.id):
        return None
    flash("This form was for another organisation than the one you now work in; nothing changed. Here is "
          f"{g.org.name}'s.", "error")
    return render_organisation_tab(status=409)
