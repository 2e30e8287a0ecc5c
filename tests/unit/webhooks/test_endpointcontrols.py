"""An endpoint changed in place, paused and resumed (webhooks/endpoints.py, its forms and commands):
a paused endpoint's messages wait, neither attempted nor failed, and go out in the order they were
made on resume; what each attempt's receiver answered is kept, its first KiB."""

import datetime
import json

import pytest

from models import SecurityEvent, db, utcnow
from orgs import keyactions
from webhooks import delivery, endpoints, outbox, periodic, recovery
from webhooks.models import PENDING, WebhookAttempt, WebhookEndpoint, WebhookMessage


def log_lines(event):
    return [row.detail for row in SecurityEvent.select().where(SecurityEvent.event == event)]


def test_an_update_changes_only_what_differs_and_keeps_the_secret_and_messages(app, user, hook, receiver):
    endpoints.send_test(hook)
    changed = endpoints.update_endpoint(hook, url=f"{receiver.url}/alice", events=["key.created", "key.revoked"],
                                        description=" CI notifications ")
    assert changed == ["events", "description"]
    row = WebhookEndpoint.get_by_id(hook.id)
    assert (row.events, row.description, row.sealed_secret) == ("key.created,key.revoked", "CI notifications",
                                                                hook.sealed_secret)
    assert WebhookMessage.select().where(WebhookMessage.endpoint == hook.id).count() == 1
    assert log_lines("webhook.updated") == [f"{receiver.url}/alice (id {hook.id}): changed events, description"]
    assert endpoints.update_endpoint(hook, events=["key.revoked", "key.created"], description="CI notifications") == []
    assert endpoints.update_endpoint(hook, events=[], description="") == ["events", "description"]
    assert WebhookEndpoint.get_by_id(hook.id).events == "*"


@pytest.mark.parametrize(("change", "message"), [
    ({"url": "ftp://example.com/"}, "http"),
    ({"url": "http://10.0.0.7/hook"}, "Webhooks are not sent to 10.0.0.7"),
    ({"events": ["key.renamed"]}, "Unknown event 'key.renamed'"),
    ({"description": "x" * 201}, "A description is at most 200 characters."),
    ({"description": "line\nbreak"}, "control character"),
])
def test_an_update_refuses_what_a_new_endpoint_would_be_refused(app, user, hook, change, message):
    app.config["WEBHOOK_ALLOW_PRIVATE"] = False
    with pytest.raises(ValueError, match=message):
        endpoints.update_endpoint(hook, **change)
    assert log_lines("webhook.updated") == []


def test_a_paused_endpoints_messages_wait_and_go_out_in_order_on_resume(app, user, hook, receiver):
    assert endpoints.pause_endpoint(hook, by="alice") and not endpoints.pause_endpoint(hook)
    made = [keyactions.issue_key(user, f"Key {number}", "development")[0] for number in range(3)]
    assert delivery.deliver_due(app) == []
    waiting = list(WebhookMessage.select().where(WebhookMessage.endpoint == hook.id).order_by(WebhookMessage.id))
    assert [(message.state, message.next_attempt_at, message.attempts) for message in waiting] == [
        (PENDING, None, 0)] * 3
    assert endpoints.state(WebhookEndpoint.get_by_id(hook.id)) == "paused"
    with pytest.raises(ValueError, match="The endpoint is paused: resume it to send a test event."):
        endpoints.send_test(hook)

    assert endpoints.resume_endpoint(hook) and not endpoints.resume_endpoint(hook)
    for _ in range(3):
        delivery.deliver_due(app, limit=1)
    received = receiver.wait_for(3)
    assert [json.loads(sent.body)["data"]["key_name"] for sent in received] == ["Key 0", "Key 1", "Key 2"]
    assert [key.name for key in made] == ["Key 0", "Key 1", "Key 2"]
    assert log_lines("webhook.paused") == log_lines("webhook.resumed") == [f"{hook.url} (id {hook.id})"]


def test_a_message_claimed_before_the_pause_waits_after_a_failed_attempt(app, user, hook, receiver):
    receiver.answer = lambda delivery: 503
    endpoints.send_test(hook)
    [claimed] = delivery.claim(db.obj, 1)
    endpoints.pause_endpoint(hook)
    assert delivery.record(claimed, delivery.send(claimed, True), app.extensions["webhooks"].schedule) == PENDING
    message = WebhookMessage.get(WebhookMessage.endpoint == hook.id)
    assert (message.state, message.next_attempt_at) == (PENDING, None)


def test_messages_a_paused_endpoint_held_a_week_are_forgotten_with_the_ended_ones(app, user, hook):
    endpoints.pause_endpoint(hook)
    keyactions.issue_key(user, "Old", "development")
    assert periodic.forget_old_messages(utcnow() + datetime.timedelta(days=6)) == 0
    assert periodic.forget_old_messages(utcnow() + datetime.timedelta(days=8)) == 1


def test_each_attempt_keeps_the_first_kib_of_the_answer_as_text(app, user, hook, receiver):
    body = b"\x00" + "é".encode() + b"x" * 2000
    receiver.answer = lambda delivery: (b"HTTP/1.1 500 Oops\r\nContent-Type: text/plain\r\nContent-Length: "
                                        + str(len(body)).encode() + b"\r\n\r\n" + body)
    endpoints.send_test(hook)
    delivery.deliver_due(app)
    [attempt] = WebhookAttempt.select()
    assert attempt.status == 500
    assert attempt.answer == "\ufffdé" + "x" * 1021


def test_the_commands_update_pause_and_resume(app, user, hook, receiver):
    runner = app.test_cli_runner()
    result = runner.invoke(args=["webhooks", "update", str(hook.id), "--events", "key.revoked",
                                 "--description", "Revocations"])
    assert result.exit_code == 0 and result.output == f"Changed events, description of webhook endpoint {hook.id}.\n"
    assert "already has these; nothing changed" in runner.invoke(
        args=["webhooks", "update", str(hook.id), "--events", "key.revoked"]).output
    assert runner.invoke(args=["webhooks", "update", str(hook.id)]).exit_code == 1
    refused = runner.invoke(args=["webhooks", "update", str(hook.id), "--url", "gopher://x"])
    assert refused.exit_code == 1 and "http" in refused.output
    paused = runner.invoke(args=["webhooks", "pause", str(hook.id)])
    assert paused.exit_code == 0 and "its messages wait until it is resumed" in paused.output
    assert WebhookEndpoint.get_by_id(hook.id).paused_by is None
    assert "was already paused" in runner.invoke(args=["webhooks", "pause", str(hook.id)]).output
    listed = runner.invoke(args=["webhooks", "list", "alice"]).output
    assert listed == f"{hook.id}\t{hook.url}\tkey.revoked\tpaused\n"
    assert "its waiting messages go out now" in runner.invoke(args=["webhooks", "resume", str(hook.id)]).output
    assert "was not paused" in runner.invoke(args=["webhooks", "resume", str(hook.id)]).output
    assert "There is no webhook endpoint with id 999" in runner.invoke(args=["webhooks", "pause", "999"]).output


def test_the_forms_edit_pause_and_resume_and_the_section_says_who_paused(app, logged_in, hook):
    section = logged_in.get("/settings/webhooks").text
    assert f'/webhooks/{hook.id}/pause"' in section and f'/webhooks/{hook.id}/resume"' not in section
    edited = logged_in.post(f"/settings/webhooks/{hook.id}/update", data={
        "url": hook.url, "events_shown": "1", "subscribe": "chosen", "events": ["key.created"],
        "description": "Audit trail"})
    assert edited.status_code == 302
    assert "Changed events and description of the webhook endpoint." in logged_in.get("/settings/webhooks").text
    refused = logged_in.post(f"/settings/webhooks/{hook.id}/update", data={
        "url": hook.url, "events_shown": "1", "subscribe": "chosen"})
    assert refused.status_code == 400 and "Choose at least one event." in refused.text
    assert logged_in.post(f"/settings/webhooks/{hook.id}/pause").status_code == 302
    section = logged_in.get("/settings/webhooks").text
    assert "Paused by alice on" in section and "Audit trail" in section
    assert f'/webhooks/{hook.id}/resume"' in section and f'/webhooks/{hook.id}/test"' not in section
    assert logged_in.post(f"/settings/webhooks/{hook.id}/resume").status_code == 302
    assert WebhookEndpoint.get_by_id(hook.id).paused_at is None


def test_the_webhooks_tab_names_its_organisation_and_the_former_addresses_redirect_there(logged_in, hook):
    tab = logged_in.get("/settings/webhooks").text
    assert '<h2 id="webhooks-heading">Webhooks of alice</h2>' in tab and hook.url in tab
    assert 'aria-current="page">Webhooks</a>' in tab
    security = logged_in.get("/settings/security").text
    assert 'article class="webhook"' not in security and 'href="/settings/webhooks">Webhooks</a>' in security
    moved = logged_in.post(f"/settings/security/webhooks/{hook.id}/pause?from=bookmark")
    assert moved.status_code == 308 and moved.location == f"/settings/webhooks/{hook.id}/pause?from=bookmark"
    assert WebhookEndpoint.get_by_id(hook.id).paused_at is None
    assert logged_in.post(f"/settings/security/webhooks/{hook.id}/pause", follow_redirects=True).status_code == 200
    assert WebhookEndpoint.get_by_id(hook.id).paused_at is not None
    assert logged_in.get("/settings/security/webhooks").location == "/settings/webhooks"


def test_the_message_log_pages_newest_first_by_state_and_shows_a_message_with_its_answers(app, logged_in, user, hook,
                                                                                        receiver):
    receiver.answer = lambda delivery: b"HTTP/1.1 503 Busy\r\nContent-Length: 9\r\n\r\ntry later"
    endpoints.send_test(hook)
    delivery.deliver_due(app)
    [first] = WebhookMessage.select()
    endpoints.pause_endpoint(hook)
    for number in range(25):
        outbox.emit(hook.org_id, "key.created", {"key_id": number})
    log = logged_in.get(f"/settings/webhooks/{hook.id}/messages")
    assert log.status_code == 200 and log.text.count('class="message-id"') == 20
    ids = [message.message_id for message in WebhookMessage.select().order_by(WebhookMessage.id.desc())]
    assert log.text.index(ids[0]) < log.text.index(ids[19]) and ids[20] not in log.text
    older = logged_in.get(f"/settings/webhooks/{hook.id}/messages?before={WebhookMessage.get(message_id=ids[19]).id}")
    assert older.text.count('class="message-id"') == 6 and first.message_id in older.text and "Older" not in older.text
    assert logged_in.get(f"/settings/webhooks/{hook.id}/messages?state=paused").text.count('class="message-id"') == 20
    # The test message waiting for its retry waits for the paused endpoint too.
    assert "No messages pending." in logged_in.get(f"/settings/webhooks/{hook.id}/messages?state=pending").text
    assert logged_in.get(f"/settings/webhooks/{hook.id}/messages?state=lost").status_code == 404
    assert logged_in.get(f"/settings/webhooks/{hook.id}/messages?before=-1").status_code == 404

    page = logged_in.get(f"/settings/webhooks/{hook.id}/messages/{first.message_id}").text
    assert "&#34;type&#34;: &#34;webhook.test&#34;" in page and "HTTP 503" in page and "try later" in page
    assert logged_in.get(f"/settings/webhooks/{hook.id}/messages/msg_unknown").status_code == 404
    assert logged_in.get(f"/settings/webhooks/{hook.id}/messages/<script>").status_code == 404

    runner = app.test_cli_runner()
    lines = runner.invoke(args=["webhooks", "messages", str(hook.id)]).output.splitlines()
    assert len(lines) == 26 and lines[-1].split("\t") == [first.message_id, lines[-1].split("\t")[1], "webhook.test",
                                                         "paused", "1", "-"]
    assert lines[0].split("\t")[2:] == ["key.created", "paused", "0", "-"]
    failed_only = runner.invoke(args=["webhooks", "messages", str(hook.id), "--state", "failed"])
    assert failed_only.exit_code == 0 and failed_only.output == ""


def test_a_resume_restarts_the_days_of_failing_so_a_long_pause_never_disables_the_endpoint(app, user, hook,
                                                                                            receiver):
    receiver.answer = lambda delivery: 503
    endpoints.send_test(hook)
    delivery.deliver_due(app)
    endpoints.pause_endpoint(hook)
    WebhookEndpoint.update(failing_since=utcnow() - datetime.timedelta(days=6)).where(
        WebhookEndpoint.id == hook.id).execute()
    endpoints.resume_endpoint(hook)
    assert WebhookEndpoint.get_by_id(hook.id).failing_since is None
    delivery.deliver_due(app)
    assert WebhookEndpoint.get_by_id(hook.id).disabled_at is None
    assert WebhookMessage.get(WebhookMessage.endpoint == hook.id).state == PENDING


def test_after_a_resume_the_messages_are_claimed_in_the_order_they_were_made(app, user, hook, receiver):
    endpoints.pause_endpoint(hook)
    for number in range(3):
        outbox.emit(hook.org_id, "key.created", {"key_id": number})
    made = [message.id for message in WebhookMessage.select().order_by(WebhookMessage.id)]
    with pytest.raises(ValueError, match="The endpoint is paused: resume it to send its messages."):
        recovery.resend(WebhookMessage.get_by_id(made[2]))
    endpoints.resume_endpoint(hook)
    # Each claim as another process's would be: the oldest first.
    assert [[claimed.pk for claimed in delivery.claim(db.obj, 50)] for _ in made] == [[pk] for pk in made]


def test_a_pause_and_resume_during_an_attempt_leave_it_alone(app, user, hook, receiver):
    endpoints.send_test(hook)
    [claimed] = delivery.claim(db.obj, 1)
    endpoints.pause_endpoint(hook)
    endpoints.resume_endpoint(hook)
    assert delivery.claim(db.obj, 1) == []  # the message under its attempt is not due again
    assert delivery.record(claimed, delivery.send(claimed, True), app.extensions["webhooks"].schedule) == "delivered"
    assert WebhookAttempt.select().count() == 1 and receiver.wait_for(1)


def test_failed_messages_recovered_while_paused_wait_for_the_resume(app, user, hook, receiver):
    endpoints.send_test(hook)
    WebhookMessage.update(state="failed", next_attempt_at=None).execute()
    endpoints.pause_endpoint(hook)
    assert recovery.recover(hook, utcnow() - datetime.timedelta(hours=1)) == 1
    assert WebhookMessage.get(WebhookMessage.endpoint == hook.id).next_attempt_at is None
    endpoints.resume_endpoint(hook)
    delivery.deliver_due(app)
    assert receiver.wait_for(1)


def test_a_paused_endpoint_disabled_after_failures_says_both(logged_in, hook):
    WebhookEndpoint.update(disabled_at=utcnow()).where(WebhookEndpoint.id == hook.id).execute()
    endpoints.pause_endpoint(hook)
    section = logged_in.get("/settings/webhooks").text
    assert "Paused from the command" in section and "every attempt failed for" in section


def test_a_former_address_keeps_its_query_as_it_came_and_never_climbs_out(logged_in, hook):
    moved = logged_in.get(f"/settings/security/webhooks/{hook.id}/messages?state=%C3%BF&x=a+b")
    assert moved.location == f"/settings/webhooks/{hook.id}/messages?state=%C3%BF&x=a+b"
    assert logged_in.get("/settings/security/webhooks/x/../../logout").status_code == 404
