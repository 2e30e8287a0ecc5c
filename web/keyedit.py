"""A key's Edit form (/settings/security/keys/<KEY_ID>/edit): its name, scopes, allow-list, expiry,
tier, own windows and credits changed in place by whoever may roll it. A role that may only narrow
the key is offered only what narrows it; orgs/keyedits.py decides either way."""

import datetime

from flask import abort, flash, g, redirect, render_template, request, url_for

import ratelimit
from accounts import throttles
from metering import credits
from models import SCOPES, display_time, utcnow
from orgs import keyactions, keyedits, roles
from web import keyforms
from web.hooks import MAX_ID, login_required, page_blueprint
from web.security import EXPIRIES

bp = page_blueprint("keyedit", __name__)

EDIT_PATH = f"/settings/security/keys/<int(max={MAX_ID}):key_id>/edit"


@bp.get(EDIT_PATH)
@login_required
def edit_key(key_id):
    return render_edit_form(changeable_key(key_id))


@bp.post(EDIT_PATH)
@login_required
def update_key(key_id):
    key = changeable_key(key_id)
    try:
        throttles.count_key_change(g.user)
        changed = keyedits.update_key(key.id, roles.allows(g.membership.role, roles.KEY_WIDEN), actor=g.user,
                                      **asked_changes(request.form))
    except ratelimit.RateLimitExceeded as error:
        flash(f"Too many key changes in the last hour; try again in {-(-error.retry_after // 60)} minutes.", "error")
        return render_edit_form(key, status=429)
    except keyedits.KeyNotChangeable:
        abort(404)
    except keyedits.WideningRefused as error:
        flash(str(error), "error")
        return render_edit_form(key, status=403)
    except ValueError as error:
        flash(str(error), "error")
        return render_edit_form(key, status=400)
    flash(outcome(key.id, changed))
    return redirect(url_for("keys.key_page", key_id=key.id))


def changeable_key(key_id):
    """The current organisation's active key that the member may change (else 404 or 403)."""
    key = keyforms.org_key(key_id, roles.KEY_CHANGE)
    if key.revoked_at or key.is_expired():
        abort(404)
    return key


def asked_changes(form):
    """update_key's arguments for the fields the form sends: one it leaves out stays as it is."""
    asked = {}
    if "name" in form:
        asked["name"] = form["name"]
    if "scopes_shown" in form or "scopes" in form:
        asked["scopes"] = form.getlist("scopes")
    if "allow_ips" in form:
        asked["allow_ips"] = form["allow_ips"]
    if expires_in := form.get("expires_in", "").strip():
        asked["expires_in"] = keyactions.parse_duration(expires_in)
    if tier := form.get("tier", "").strip():
        asked["tier"] = tier
    if "rates" in form:
        asked["rates"] = ratelimit.parse_limits(form["rates"]) if form["rates"].strip() else None
    if credits_set := form.get("credits_set", "").strip():
        asked["credits_set"] = credits.parse_credits(credits_set, "The credits to set")
    if credits_add := form.get("credits_add", "").strip():
        asked["credits_add"] = credits.parse_credits(credits_add, "The credits to add")
    if "refill" in form:
        asked["refill"] = credits.parse_refill(form["refill"])
    return asked


def outcome(key_id, changed):
    """The sentence after a change: what changed, and what it does from now on."""
    key = keyforms.org_key(key_id, roles.VIEW)
    if not changed:
        return f"Nothing changed: “{key.name}” already had these."
    labels = [keyedits.LABELS[field] for field in changed]
    listed = labels[0] if len(labels) == 1 else f"{', '.join(labels[:-1])} and {labels[-1]}"
    sentence = f"Changed {listed} of “{key.name}”."
    if {"tier", "rates"} & set(changed):
        sentence += " Its new limits apply from the next request."
    if "expires_at" in changed:
        sentence += f" It expires {display_time(key.expires_at) if key.expires_at else 'never'}."
    return sentence


def render_edit_form(key, status=200):
    """The form with the key's current values, or with what was just sent after a refusal."""
    may_widen = roles.allows(g.membership.role, roles.KEY_WIDEN)
    now = utcnow()
    current = keyedits.tier_windows(key.rate_limit_tier)
    tiers = {tier: keyedits.describe_tier(tier) for tier in sorted(keyedits.configured_tiers())
             if may_widen or tier == key.rate_limit_tier or keyedits.no_looser(keyedits.tier_windows(tier), current)}
    expiries = {value: label for value, label in EXPIRIES.items()
                if may_widen or not key.expires_at or shortens(key, value, now)}
    return render_template("key_edit.html", key=key, now=now, may_widen=may_widen, scopes=SCOPES, tiers=tiers,
                           expiries=expiries, credits_left=credits.effective_remaining(key, now),
                           sent=request.form if request.method == "POST" else None), status


def shortens(key, duration, now):
    """True when an expiry `duration` from now comes no later than the key's."""
    seconds = keyactions.parse_duration(duration)
    return seconds is not None and now + datetime.timedelta(seconds=seconds) <= key.expires_at
