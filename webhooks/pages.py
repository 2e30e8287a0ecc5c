"""The Webhooks tab (/settings/webhooks; the Security tab's former section redirects here): add an
endpoint (its secret shown once), change, pause or resume one, send a test event, resend a message,
recover failed ones, rotate the secret, remove one; templates/_webhooks.html shows each endpoint
with its last attempts, and webhooks.attempts serves one endpoint's attempts alone for the page's
script to refresh them."""

import datetime
import json
from urllib.parse import quote

from flask import abort, flash, g, redirect, render_template, request, session, url_for

from accounts import sessions
from models import utcnow
from orgs import roles
from orgs.keyactions import parse_duration
from web.hooks import MAX_ID, login_required, page_blueprint
from webhooks import endpoints, messagelog, outbox, recovery
from webhooks.models import ALL_EVENTS, WebhookEndpoint

bp = page_blueprint("webhooks", __name__)

TAB = "/settings/webhooks"
# Where the tab's pages and forms were, inside the Security tab: each redirects to its place here.
FORMER_PREFIX = "/settings/security/webhooks"
# The choices of the Recover and Rotate forms: how far back, and how long the old secret signs too.
RECOVER_SINCE = {"1h": "the last hour", "24h": "the last 24 hours", "7d": "the last 7 days"}
OVERLAPS = {"24h": "for 24 hours", "1h": "for an hour", "7d": "for 7 days", "0": "no longer: stop at once"}
# The attempts each endpoint shows open, newest first; the rest of its last 50 wait folded under
# them, beside its message log. Five show whether it works now and a short run of retries, and keep
# the tab short on a phone, where each attempt is a card (11 drawn open made a 7,962 px page).
ATTEMPTS_SHOWN = 5



@bp.app_context_processor
def webhook_section():
    """webhook_section(): what templates/_webhooks.html shows, read only where it is included."""

    def section():
        rows = []
        for endpoint in endpoints.owned(g.org.id):
            state = endpoints.state(endpoint)
            rows.append((endpoint, state, attempts_view(endpoint, state)))
        return {"endpoints": rows,
                "events": outbox.SUBSCRIBABLE, "all_events": ALL_EVENTS, "cap": endpoints.MAX_ENDPOINTS,
                "recover_since": RECOVER_SINCE, "overlaps": OVERLAPS}

    return {"webhook_section": section}


def attempts_view(endpoint, state):
    """What templates/_webhook_attempts.html and _webhook_test.html show of the endpoint: its kept
    attempts, newest first, the first ATTEMPTS_SHOWN open and the rest folded; its test event still
    waiting for a first attempt, or None; whether a test event is still to be delivered or to fail
    (Send test event is refused until then); and the webhook-ids it offers Resend for: none while
    the endpoint is paused, nor a message no longer kept, since resend() refuses those whatever the
    moment."""
    attempts = endpoints.recent_attempts(endpoint)
    resendable = (set() if state == "paused"
                  else endpoints.kept_message_ids(endpoint, {attempt.message_id for attempt in attempts}))
    return {"shown": attempts[:ATTEMPTS_SHOWN], "folded": attempts[ATTEMPTS_SHOWN:],
            "waiting": endpoints.waiting_test(endpoint), "paused": state == "paused",
            "test_pending": endpoints.test_pending(endpoint), "resendable": resendable}


@bp.get(TAB)
@login_required
def settings_webhooks():
    pending = sessions.take_pending_secret(g.session, session["sid"])
    return render_webhooks_tab(new_key=json.loads(pending) if pending else None)


def render_webhooks_tab(status=200, new_key=None):
    return render_template("settings_webhooks.html", new_key=new_key, now=utcnow()), status


@bp.get(f"{TAB}/<int(max={MAX_ID}):endpoint_id>/messages")
@login_required
def messages(endpoint_id):
    """The endpoint's message log, newest first, a page at a time (?before=ID for older ones), in
    one state with ?state=."""
    endpoint = org_endpoint(endpoint_id, roles.VIEW)
    state = request.args.get("state") or None
    if state is not None and state not in messagelog.STATES:
        abort(404)
    before = request.args.get("before", type=int)
    if before is not None and not 0 < before <= MAX_ID:
        abort(404)
    shown, older = messagelog.page(endpoint.id, state, before)
    return render_template("webhook_messages.html", endpoint=endpoint, messages=shown, state=state,
                           states=messagelog.STATES, state_of=messagelog.state_of,
                           older=older and shown[-1].id)


@bp.get(f"{TAB}/<int(max={MAX_ID}):endpoint_id>/messages/<message_id>")
@login_required
def message(endpoint_id, message_id):
    """One message: its body as signed, and each kept attempt with what the receiver answered."""
    endpoint = org_endpoint(endpoint_id, roles.VIEW)
    if not recovery.MESSAGE_ID.fullmatch(message_id):
        abort(404)
    found, attempts = messagelog.message_with_attempts(endpoint.id, message_id)
    if found is None and not attempts:
        abort(404)
    body = found and json.dumps(json.loads(found.body), indent=2, ensure_ascii=False)
    return render_template("webhook_message.html", endpoint=endpoint, message=found, message_id=message_id,
                           body=body, attempts=attempts, state=found and messagelog.state_of(found))


@bp.route(FORMER_PREFIX, methods=["GET", "POST"])
@bp.route(f"{FORMER_PREFIX}/<path:rest>", methods=["GET", "POST"])
def former_address(rest=None):
    """A form or a link of the Security tab's former Webhooks section: 308 keeps a POST a POST, its
    body (the CSRF token with it) and its query."""
    if rest is not None and ".." in rest.split("/"):
        abort(404)
    target = TAB + (f"/{rest}" if rest else "")
    # The query as it came, its bytes percent-encoded where they are not URL characters already.
    query = quote(request.query_string, safe="=&%+;/?:@,$!*'()~")
    return redirect(target + (f"?{query}" if query else ""), 308)


@bp.post(TAB)
@login_required
def add_endpoint():
    form = request.form
    try:
        events = chosen_events(form) or []
        if not roles.allows(g.membership.role, roles.WEBHOOK_MANAGE):
            abort(403)
        endpoint, secret = endpoints.add_endpoint(g.user, form.get("url", ""), events, org=g.org.id)
    except ValueError as error:
        flash(str(error), "error")
        return render_webhooks_tab(status=400)
    # Kept with the session on the server, encrypted, and forgotten once the next page shows it.
    sessions.keep_pending_secret(g.session, session["sid"],
                              json.dumps({"webhook_url": endpoint.url, "webhook_secret": secret}))
    return redirect(url_for("webhooks.settings_webhooks"))


@bp.post(f"{TAB}/<int(max={MAX_ID}):endpoint_id>/update")
@login_required
def update(endpoint_id):
    endpoint = org_endpoint(endpoint_id, roles.WEBHOOK_MANAGE)
    form = request.form
    try:
        changed = endpoints.update_endpoint(endpoint, url=form.get("url"), events=chosen_events(form),
                                            description=form.get("description"))
    except endpoints.EndpointGone:
        abort(404)
    except ValueError as error:
        flash(str(error), "error")
        return render_webhooks_tab(status=400)
    flash(f"Changed {' and '.join(changed)} of the webhook endpoint." if changed
          else "Nothing changed: the endpoint already had these.")
    return redirect(url_for("webhooks.settings_webhooks") + f"#webhook-{endpoint.id}")


@bp.post(f"{TAB}/<int(max={MAX_ID}):endpoint_id>/pause")
@login_required
def pause(endpoint_id):
    endpoint = org_endpoint(endpoint_id, roles.WEBHOOK_MANAGE)
    if endpoints.pause_endpoint(endpoint, by=g.user.username):
        flash(f"Paused {endpoint.url}: its messages wait until you resume it.")
    return redirect(url_for("webhooks.settings_webhooks") + f"#webhook-{endpoint.id}")


@bp.post(f"{TAB}/<int(max={MAX_ID}):endpoint_id>/resume")
@login_required
def resume(endpoint_id):
    endpoint = org_endpoint(endpoint_id, roles.WEBHOOK_MANAGE)
    if endpoints.resume_endpoint(endpoint):
        flash(f"Resumed {endpoint.url}: its waiting messages go out now, oldest first.")
    return redirect(url_for("webhooks.settings_webhooks") + f"#webhook-{endpoint.id}")


def chosen_events(form):
    """The events an Add or Edit form asks for (None when it does not say): "all" (ALL_EVENTS) or
    "chosen" (the events ticked), which a post that does not say is taken for."""
    if not {"subscribe", "events", "events_shown"} & form.keys():
        return None
    subscribe = form.get("subscribe", "chosen")
    if subscribe not in ("all", "chosen"):
        raise ValueError("Choose All events or Chosen events.")
    events = form.getlist("events") if subscribe == "chosen" else []
    if subscribe == "chosen" and "events_shown" in form and not events:
        raise ValueError("Choose at least one event.")
    return events


@bp.post(f"{TAB}/<int(max={MAX_ID}):endpoint_id>/test")
@login_required
def send_test(endpoint_id):
    endpoint = org_endpoint(endpoint_id, roles.WEBHOOK_MANAGE)
    try:
        message = endpoints.send_test(endpoint)
    except ValueError as error:
        flash(str(error), "error")
        return render_webhooks_tab(status=409)
    flash(f"A test event ({message.message_id}) is on its way to {endpoint.url}.")
    # Back to the endpoint the button belongs to, where its attempts list shows the test's attempt.
    return redirect(url_for("webhooks.settings_webhooks") + f"#webhook-{endpoint.id}")


@bp.get(f"{TAB}/<int(max={MAX_ID}):endpoint_id>/attempts")
def attempts(endpoint_id):
    """The endpoint's attempts list alone (templates/_webhook_attempts.html), followed, for whoever
    may send a test event, by its Send test event or why not yet (_webhook_test.html), which the
    test's answer changes too; reading changes nothing, so a GET needs no CSRF token, and another
    account's endpoint is a 404."""
    if g.user is None:
        # No flash and no redirect to the log-in page: a script asks, not a person.
        abort(401)
    endpoint = org_endpoint(endpoint_id, roles.VIEW)
    state = endpoints.state(endpoint)
    view = attempts_view(endpoint, state)
    fragment = render_template("_webhook_attempts.html", endpoint=endpoint, view=view)
    if state != "paused" and roles.allows(g.membership.role, roles.WEBHOOK_MANAGE):
        fragment += render_template("_webhook_test.html", endpoint=endpoint, view=view)
    return fragment


@bp.post(f"{TAB}/<int(max={MAX_ID}):endpoint_id>/resend")
@login_required
def resend(endpoint_id):
    endpoint = org_endpoint(endpoint_id, roles.WEBHOOK_MANAGE)
    message_id = request.form.get("message_id", "")[:40]
    message = recovery.find_message(message_id, endpoint.id)
    if message is None:
        if not recovery.MESSAGE_ID.fullmatch(message_id) or not endpoints.attempted(endpoint, message_id):
            abort(404)
        # Its attempts are still listed after the message is forgotten, without the button; a page
        # drawn before then still has it.
        flash(f"{message_id} is no longer kept: messages are forgotten a week after they were made.", "error")
        return render_webhooks_tab(status=409)
    try:
        recovery.resend(message)
    except ValueError as refused:
        flash(str(refused), "error")
        return render_webhooks_tab(status=409)
    flash(f"{message.message_id} is being sent again to {endpoint.url}.")
    return redirect(url_for("webhooks.settings_webhooks") + f"#webhook-{endpoint.id}")


@bp.post(f"{TAB}/<int(max={MAX_ID}):endpoint_id>/recover")
@login_required
def recover(endpoint_id):
    endpoint = org_endpoint(endpoint_id, roles.WEBHOOK_MANAGE)
    since = request.form.get("since", "24h")
    if since not in RECOVER_SINCE:
        flash("Choose how far back to recover failed messages.", "error")
        return render_webhooks_tab(status=400)
    count = recovery.recover(endpoint, recovery.since_moment(since))
    flash(f"{count} failed message{'' if count == 1 else 's'} of {RECOVER_SINCE[since]} "
          f"{'is' if count == 1 else 'are'} being sent to {endpoint.url} again.")
    return redirect(url_for("webhooks.settings_webhooks") + f"#webhook-{endpoint.id}")


@bp.post(f"{TAB}/<int(max={MAX_ID}):endpoint_id>/rotate")
@login_required
def rotate(endpoint_id):
    endpoint = org_endpoint(endpoint_id, roles.WEBHOOK_MANAGE)
    overlap = request.form.get("overlap", "24h")
    if overlap not in OVERLAPS:
        flash("Choose how long the old secret goes on signing.", "error")
        return render_webhooks_tab(status=400)
    try:
        secret, until = endpoints.rotate_secret(endpoint, datetime.timedelta(seconds=parse_duration(overlap)))
    except ValueError as error:
        flash(str(error), "error")
        return render_webhooks_tab(status=409)
    sessions.keep_pending_secret(g.session, session["sid"], json.dumps({
        "webhook_url": endpoint.url, "webhook_secret": secret, "webhook_rotated": True,
        "webhook_previous_until": until and until.strftime("%Y-%m-%d %H:%M")}))
    return redirect(url_for("webhooks.settings_webhooks"))


@bp.post(f"{TAB}/<int(max={MAX_ID}):endpoint_id>/remove")
@login_required
def remove_endpoint(endpoint_id):
    endpoint = org_endpoint(endpoint_id, roles.WEBHOOK_MANAGE)
    endpoints.remove_endpoint(endpoint)
    flash(f"Removed the webhook endpoint {endpoint.url}.")
    return redirect(url_for("webhooks.settings_webhooks"))


def org_endpoint(endpoint_id, action):
    """The current organisation's endpoint with this id (another organisation's, or none, is a
    404), when the member's role allows the action on it (else 403)."""
    endpoint = WebhookEndpoint.get_or_none((WebhookEndpoint.id == endpoint_id) & (WebhookEndpoint.org == g.org.id))
    if endpoint is None:
        abort(404)
    if not roles.allows(g.membership.role, action):
        abort(403)
    return endpoint
