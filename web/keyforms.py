"""The Security tab's key forms: create, roll and revoke a key."""

import json

from flask import abort, flash, g, redirect, request, session, url_for

import ratelimit
from accounts import sessions, throttles
from metering import credits
from models import ApiKey
from orgs import keyactions, roles
from web.hooks import MAX_ID, login_required, page_blueprint
from web.security import render_security_tab

bp = page_blueprint("keyforms", __name__)


@bp.post("/settings/security/keys")
@login_required
def create_key():
    if not roles.allows(g.membership.role, roles.KEY_CREATE):
        abort(403)
    form = request.form
    try:
        throttles.count_key_creation(g.user)
        scopes = form.getlist("scopes")
        if "scopes_shown" in form and not scopes:
            raise ValueError("Choose at least one scope.")
        given = form.get("credits", "").strip()
        key, secret = keyactions.issue_key(g.user, form.get("name", ""), form.get("type", ""), org=g.org.id,
                                           expires_in=keyactions.parse_duration(form.get("expires_in") or "never"),
                                           scopes=scopes, allow_ips=form.get("allow_ips"),
                                           credits_given=credits.parse_credits(given) if given else None,
                                           refill=credits.parse_refill(form.get("refill")))
    except ratelimit.RateLimitExceeded as error:
        minutes = -(-error.retry_after // 60)
        flash(f"Too many keys created in the last hour; try again in {minutes} minutes.", "error")
        return render_security_tab(status=429)
    except ValueError as error:
        flash(str(error), "error")
        return render_security_tab(status=400)
    # Kept with the session on the server, encrypted, and forgotten once the next page shows it.
    sessions.keep_pending_secret(g.session, session["sid"], json.dumps({"name": key.name, "secret": secret}))
    return redirect(url_for("security.settings_security"))


@bp.post(f"/settings/security/keys/<int(max={MAX_ID}):key_id>/roll")
@login_required
def roll_key(key_id):
    key = org_key(key_id, roles.KEY_CHANGE)
    if key.revoked_at or key.is_expired():
        abort(404)
    form = request.form
    try:
        throttles.count_key_roll(g.user)
        grace = keyactions.parse_duration(form.get("grace", "24h"), allow_never=False)
        secret = keyactions.roll_key(key, grace, end_previous=form.get("end_previous") == "1",
                                     current=form.get("current"))
    except ratelimit.RateLimitExceeded as error:
        minutes = -(-error.retry_after // 60)
        flash(f"Too many keys rolled in the last hour; try again in {minutes} minutes.", "error")
        return render_security_tab(status=429)
    except keyactions.GraceRunning as error:
        flash(f"{error} Tick “End the previous secret now” to confirm.", "error")
        return render_security_tab(status=409)
    except keyactions.RollConflict as error:
        flash(str(error), "error")
        return render_security_tab(status=409)
    except ValueError as error:
        flash(str(error), "error")
        return render_security_tab(status=400)
    sessions.keep_pending_secret(g.session, session["sid"],
                              json.dumps({"name": key.name, "secret": secret, "rolled": True}))
    return redirect(url_for("security.settings_security"))


def org_key(key_id, action):
    """The current organisation's key with this id (another organisation's, or none, is a 404),
    when the member's role allows the action on it (else 403)."""
    key = ApiKey.get_or_none((ApiKey.id == key_id) & (ApiKey.org == g.org.id))
    if key is None:
        abort(404)
    if not roles.allows(g.membership.role, action, own_key=key.user_id == g.user.id):
        abort(403)
    return key


@bp.post(f"/settings/security/keys/<int(max={MAX_ID}):key_id>/revoke")
@login_required
def revoke_key(key_id):
    key = org_key(key_id, roles.KEY_CHANGE)
    keyactions.revoke_key(key)
    flash(f"Revoked {key.name!r}: requests with it now fail.")
    return redirect(url_for("security.settings_security"))
