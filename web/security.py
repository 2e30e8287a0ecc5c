"""Profile Settings' Security tab: the organisation's API keys with their totals, the log, and
"Sign out everywhere" (web/keyforms.py has the key forms, web/webprotection.py two-factor and passkeys)."""

import datetime
import json

from flask import flash, g, redirect, render_template, request, session, url_for
from peewee import fn

from accounts import securitylog, sessions
from keys import allowips
from metering import analytics
from models import SCOPES, ApiKey, utcnow
from orgs import members as org_members
from web.hooks import MAX_ID, login_required, page_blueprint

bp = page_blueprint("security", __name__)

KEY_TYPES = {"development": "Development", "production": "Production"}
EXPIRIES = {"7d": "7 days", "30d": "30 days", "90d": "90 days", "365d": "365 days", "never": "Never"}
# When a rolled key's current secret stops working.
GRACES = {"0": "now", "1h": "in 1 hour", "24h": "in 24 hours", "7d": "in 7 days"}
# Keys a page of the tab lists, newest first, of the active ones and of the revoked ones each: an
# organisation that imported keys (orgs/keyimports.py) may hold 100,000.
KEYS_SHOWN = 100

# A key's IP allow-list in a few words on the Security tab.
bp.add_app_template_filter(allowips.summary, "allow_ips_summary")


@bp.get("/settings/security")
@login_required
def settings_security():
    pending = sessions.take_pending_secret(g.session, session["sid"])
    return render_security_tab(new_key=json.loads(pending) if pending else None)


def render_security_tab(status=200, new_key=None):
    now = utcnow()
    org_keys = ApiKey.select(ApiKey.id).where(ApiKey.org == g.org)
    active = ApiKey.active_in(g.org.id).order_by(ApiKey.id.desc())
    before = request.args.get("keys_before", type=int)
    if before is not None and 0 < before <= MAX_ID:
        active = active.where(ApiKey.id < before)
    else:
        before = None
    active = list(active.limit(KEYS_SHOWN + 1))
    ended = ApiKey.revoked_at.is_null(False) | (ApiKey.expires_at <= now)
    inactive = ApiKey.select().where((ApiKey.org == g.org) & ended).order_by(ApiKey.id.desc())
    return render_template("settings_security.html", keys=org_keys.exists(), active_keys=active[:KEYS_SHOWN],
                           older_keys=active[KEYS_SHOWN - 1].id if len(active) > KEYS_SHOWN else None,
                           newer_keys=before is not None, inactive_keys=list(inactive.limit(KEYS_SHOWN)),
                           inactive_count=inactive.count(), active_count=ApiKey.active_in(g.org.id).count(),
                           totals=account_totals(org_keys, now), now=now, creators=key_creators(g.org.id),
                           new_key=new_key, key_types=KEY_TYPES, scopes=SCOPES, expiries=EXPIRIES,
                           graces=GRACES, events=org_log()), status


@bp.post("/settings/security/sessions/revoke")
@login_required
def sign_out_everywhere():
    sessions.end_all_sessions(g.user)
    session.clear()
    flash("You are signed out everywhere, this browser included.")
    return redirect(url_for("signin.login"))


def key_creators(org_id):
    """{user id: username} of the organisation's members: a key made by anyone else was made by a
    former member (or an account since deleted)."""
    return {membership.user_id: membership.user.username for membership in org_members.members(org_id)}


def org_log():
    """The current organisation's log; in the user's personal organisation, with the account's own events."""
    if g.org.personal_for_id == g.user.id:
        return securitylog.recent(g.user.id)
    return securitylog.recent_in(g.org.id)


def account_totals(key_ids, now):
    """The requests of all the organisation's keys (key_ids: a query of their ids): in the last 24
    hours and 30 days, refused in those 30 days, and counted over the keys' lives."""
    days = analytics.daily(key_ids, now=now)
    refused = sum(day.requests - day.by_outcome()["success"] for day in days)
    lifetime = ApiKey.select(fn.COALESCE(fn.SUM(ApiKey.total_requests), 0)).where(ApiKey.id.in_(key_ids)).scalar()
    return {"day": sum(hour.requests for hour in analytics.hourly(key_ids, now=now)),
            "month": sum(day.requests for day in days), "refused": refused, "lifetime": lifetime}


@bp.app_template_filter("days_until")
def days_until(moment):
    """Whole days from now until moment, rounded up: 'expires in N days'."""
    return max(0, -(-(moment - utcnow()) // datetime.timedelta(days=1)))
