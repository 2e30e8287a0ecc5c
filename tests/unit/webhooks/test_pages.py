"""webhooks/pages.py, the Webhooks tab in-process: an endpoint added with its secret shown once and
its events chosen, Send test event returning to the endpoint's own section, the attempts list served
alone (for the page's script) to its owner only, saying whether a test event still waits for its
first attempt; only the actions that would not be refused offered (no Resend while paused or for a
forgotten message, no Send test event while one is on its way); the newest 5 attempts open, the
rest folded; refusals in a sentence, another account's endpoint a 404, a removed endpoint's
messages dropped, the CSRF token required; the organisation named."""

import html.parser
import re

from werkzeug.datastructures import MultiDict

from accounts import users
from models import SecurityEvent
from webhooks import delivery, endpoints, signing
from webhooks.models import FAILED, PENDING, WebhookAttempt, WebhookEndpoint, WebhookMessage


def test_send_test_event_returns_to_the_endpoints_section(logged_in, hook):
    response = logged_in.post(f"/settings/webhooks/{hook.id}/test")
    assert response.status_code == 302
    assert response.location.endswith(f"/settings/webhooks#webhook-{hook.id}")
    page = logged_in.get("/settings/webhooks").text
    assert f'id="webhook-{hook.id}" aria-labelledby="webhook-{hook.id}-url" tabindex="-1"' in page
    assert "is on its way" in page


def test_the_attempts_list_waits_for_the_test_events_attempt_then_shows_it(app, logged_in, hook):
    url = f"/settings/webhooks/{hook.id}/attempts"
    before = logged_in.get(url)
    assert before.status_code == 200 and before.mimetype == "text/html"
    assert before.headers["Cache-Control"] == "no-store"
    assert "data-waiting" not in before.text and "No attempts yet." in before.text

    message = endpoints.send_test(hook)
    waiting = logged_in.get(url).text
    assert f'id="webhook-{hook.id}-attempts"' in waiting and "data-waiting" in waiting
    assert message.message_id in waiting and 'role="status"' in waiting

    delivery.deliver_due(app)
    after = logged_in.get(url).text
    assert "data-waiting" not in after and "is on its way" not in after
    assert '<tr class="attempt">' in after and "webhook.test" in after and "HTTP 204" in after


def test_the_attempts_list_is_its_owners_alone(client, logged_in, user, hook):
    bob = users.create_user("bob", "bob@example.com", "correct horse battery")
    bobs, _ = endpoints.add_endpoint(bob, "http://127.0.0.1:9/bob")
    assert logged_in.get(f"/settings/webhooks/{bobs.id}/attempts").status_code == 404
    assert logged_in.get("/settings/webhooks/999999/attempts").status_code == 404
    assert logged_in.post(f"/settings/webhooks/{hook.id}/attempts").status_code == 405
    logged_in.post("/logout")
    assert client.get(f"/settings/webhooks/{hook.id}/attempts").status_code == 401
    # A script's question leaves no "log in first" for the next page a person opens.
    assert "Log in first" not in client.get("/login").text


def test_each_attempt_has_a_resend_button_that_sends_its_message_again(app, logged_in, hook):
    message = endpoints.send_test(hook)
    delivery.deliver_due(app)
    attempts = logged_in.get(f"/settings/webhooks/{hook.id}/attempts").text
    assert f'name="message_id" value="{message.message_id}"' in attempts
    assert f'aria-label="Resend {message.message_id}"' in attempts
    response = logged_in.post(f"/settings/webhooks/{hook.id}/resend", data={"message_id": message.message_id})
    assert response.status_code == 302 and response.location.endswith(f"#webhook-{hook.id}")
    assert f"{message.message_id} is being sent again" in logged_in.get("/settings/webhooks").text
    [(claimed, _, state)] = delivery.deliver_due(app)
    assert (claimed.message_id, claimed.number, state) == (message.message_id, 2, "delivered")


def test_a_resend_of_another_endpoints_or_an_unknown_message_is_a_404(app, logged_in, user, hook):
    other, _ = endpoints.add_endpoint(user, "http://127.0.0.1:9/other")
    elsewhere = endpoints.send_test(other)
    for message_id in [elsewhere.message_id, "msg_nothing", "", "x" * 5000, "msg_\x00x"]:
        response = logged_in.post(f"/settings/webhooks/{hook.id}/resend", data={"message_id": message_id})
        assert response.status_code == 404, message_id


def test_an_eleventh_resend_in_a_minute_is_refused_with_its_reason(app, logged_in, hook):
    message = endpoints.send_test(hook)
    delivery.deliver_due(app)
    for _ in range(10):
        assert logged_in.post(f"/settings/webhooks/{hook.id}/resend",
                              data={"message_id": message.message_id}).status_code == 302
        delivery.deliver_due(app)
    refused = logged_in.post(f"/settings/webhooks/{hook.id}/resend", data={"message_id": message.message_id})
    assert refused.status_code == 409
    assert "This endpoint has had 10 resends in the last minute" in refused.text


def test_recover_failed_messages_says_how_many(app, logged_in, hook):
    failed = endpoints.send_test(hook)
    WebhookMessage.update(state=FAILED, next_attempt_at=None).execute()
    response = logged_in.post(f"/settings/webhooks/{hook.id}/recover", data={"since": "1h"})
    assert response.status_code == 302
    assert "1 failed message of the last hour is being sent to" in logged_in.get("/settings/webhooks").text
    assert WebhookMessage.get_by_id(failed.id).state == PENDING
    assert logged_in.post(f"/settings/webhooks/{hook.id}/recover", data={"since": "1y"}).status_code == 400


def test_rotate_shows_the_new_secret_once_and_the_overlap(app, logged_in, hook):
    response = logged_in.post(f"/settings/webhooks/{hook.id}/rotate", data={"overlap": "24h"})
    assert response.status_code == 302
    page = logged_in.get("/settings/webhooks").text
    [secret] = re.findall(r">(whsec_[A-Za-z0-9+/=]+)<", page)
    assert "The new signing secret of" in page and "each delivery carries\n          two signatures" in page
    assert "the old one signs each delivery too until" in page
    assert secret not in logged_in.get("/settings/webhooks").text
    assert delivery.secrets_in_force(hook.id)[0] == secret
    assert logged_in.post(f"/settings/webhooks/{hook.id}/rotate", data={"overlap": "30d"}).status_code == 400
    assert logged_in.post(f"/settings/webhooks/{hook.id}/rotate", data={"overlap": "0"}).status_code == 302
    assert "The old secret no longer signs" in logged_in.get("/settings/webhooks").text
    assert len(delivery.secrets_in_force(hook.id)) == 1


def test_a_resend_of_a_forgotten_message_from_a_page_drawn_before_says_it_is_no_longer_kept(app, logged_in, hook):
    message = endpoints.send_test(hook)
    delivery.deliver_due(app)
    WebhookMessage.delete().execute()  # forgotten a week on; its attempt is still listed
    response = logged_in.post(f"/settings/webhooks/{hook.id}/resend", data={"message_id": message.message_id})
    assert response.status_code == 409
    assert (f"{message.message_id} is no longer kept: messages are forgotten a week after they were made."
            in response.text)


def test_the_security_tab_adds_an_endpoint_and_shows_its_secret_once(app, logged_in, receiver):
    response = logged_in.post("/settings/webhooks", data={
        "url": f"{receiver.url}/web", "events_shown": "1", "events": ["key.created", "usage.threshold"]})
    assert response.status_code == 302 and response.location.endswith("/settings/webhooks")
    page = logged_in.get("/settings/webhooks").text
    secret = re.search(r'id="webhook-secret"[^>]*>(whsec_[^<]+)<', page)[1]
    assert signing.unseal(WebhookEndpoint.get().sealed_secret) == secret
    assert "key.created, usage.threshold" in page
    again = logged_in.get("/settings/webhooks").text
    assert secret not in again and secret[6:] not in again and "webhook-secret" not in again


def sent_as_shown(page, action):
    """The fields a browser sends from the page's form with this action, left as shown: its hidden
    inputs, and the radio buttons and boxes the page checks."""
    fields, within = [], []

    class Form(html.parser.HTMLParser):
        def handle_starttag(self, tag, attrs):
            attrs = dict(attrs)
            if tag == "form":
                within[:] = [attrs.get("action") == action]
            elif tag == "input" and any(within) and (attrs.get("type") == "hidden" or "checked" in attrs):
                fields.append((attrs["name"], attrs["value"]))

        def handle_endtag(self, tag):
            if tag == "form":
                within.clear()

    Form().feed(page)
    return fields


def test_the_security_tab_form_subscribes_to_all_events_unless_events_are_chosen(app, logged_in, receiver):
    page = logged_in.get("/settings/webhooks").text
    assert re.search(r'<label[^>]*><input type="radio" name="subscribe" value="all" checked> All events', page)
    fields = sent_as_shown(page, "/settings/webhooks")
    assert [name for name, _ in fields] == ["csrf_token", "events_shown", "subscribe"]
    response = logged_in.post("/settings/webhooks", data=MultiDict([*fields, ("url", f"{receiver.url}/a")]))
    assert response.status_code == 302 and WebhookEndpoint.get().events == "*"
    assert "Events: all, including those added later" in logged_in.get("/settings/webhooks").text

    chosen = {"url": f"{receiver.url}/b", "events_shown": "1", "subscribe": "chosen"}
    response = logged_in.post("/settings/webhooks", data=chosen)
    assert response.status_code == 400 and "Choose at least one event." in response.text
    assert re.search(r'value="chosen" checked', response.text) and f'value="{receiver.url}/b"' in response.text
    response = logged_in.post("/settings/webhooks", data={**chosen, "subscribe": "some"})
    assert response.status_code == 400 and "Choose All events or Chosen events." in response.text
    response = logged_in.post("/settings/webhooks", data={**chosen, "events": ["key.revoked", "key.created"]})
    assert response.status_code == 302
    assert [endpoint.events for endpoint in WebhookEndpoint.select().order_by(WebhookEndpoint.id)] == [
        "*", "key.created,key.revoked"]
    assert "Events: key.created, key.revoked" in logged_in.get("/settings/webhooks").text


def test_the_security_tab_sends_a_test_event_and_lists_the_attempt(app, logged_in, user, receiver):
    endpoint, secret = endpoints.add_endpoint(user, f"{receiver.url}/web")
    receiver.secrets["/web"] = secret
    response = logged_in.post(f"/settings/webhooks/{endpoint.id}/test")
    assert response.status_code == 302
    assert logged_in.post(f"/settings/webhooks/{endpoint.id}/test").status_code == 409  # one at a time
    delivery.deliver_due(app)
    assert receiver.received()[0].verified["type"] == "webhook.test"
    page = logged_in.get("/settings/webhooks").text
    assert re.search(r'<tr class="attempt">.*webhook\.test.*HTTP 204.*ms.*>1<', page, re.S)
    assert secret not in page and secret[6:] not in page


def test_the_security_tab_refuses_with_a_sentence(app, logged_in):
    app.config["WEBHOOK_ALLOW_PRIVATE"] = False
    response = logged_in.post("/settings/webhooks", data={"url": "http://10.0.0.7/", "events_shown": "1",
                                                                   "events": ["key.created"]})
    assert response.status_code == 400 and "Webhooks are not sent to 10.0.0.7" in response.text
    response = logged_in.post("/settings/webhooks", data={"url": "https://93.184.216.34/",
                                                                   "events_shown": "1"})
    assert response.status_code == 400 and "Choose at least one event." in response.text
    assert WebhookEndpoint.select().count() == 0


def test_another_accounts_endpoint_is_a_404(app, logged_in, receiver):
    bob = users.create_user("bob", "bob@example.com", "correct horse battery")
    endpoint, _ = endpoints.add_endpoint(bob, f"{receiver.url}/bob")
    assert logged_in.post(f"/settings/webhooks/{endpoint.id}/test").status_code == 404
    assert logged_in.post(f"/settings/webhooks/{endpoint.id}/remove").status_code == 404
    assert WebhookEndpoint.select().count() == 1


def test_removing_an_endpoint_drops_its_messages(app, logged_in, user, receiver):
    endpoint, _ = endpoints.add_endpoint(user, f"{receiver.url}/web")
    endpoints.send_test(endpoint)
    assert logged_in.post(f"/settings/webhooks/{endpoint.id}/remove").status_code == 302
    assert WebhookMessage.select().count() == 0 and delivery.deliver_due(app) == []
    assert SecurityEvent.select().where(SecurityEvent.event == "webhook.removed").count() == 1


def test_the_webhook_forms_need_the_csrf_token(app, logged_in, user, receiver):
    app.config["WTF_CSRF_ENABLED"] = True
    endpoint, _ = endpoints.add_endpoint(user, f"{receiver.url}/web")
    for path in ["/settings/webhooks", f"/settings/webhooks/{endpoint.id}/test",
                 f"/settings/webhooks/{endpoint.id}/remove"]:
        assert logged_in.post(path, data={"url": f"{receiver.url}/x"}).status_code == 400
    assert WebhookEndpoint.select().count() == 1 and WebhookMessage.select().count() == 0


def words(page):
    """The page's text with its runs of white space made one space, as a browser shows it."""
    return " ".join(page.split())


def test_the_tab_says_whose_endpoints_they_are_and_that_the_cap_is_an_organisations(app, logged_in, user, hook):
    tab = words(logged_in.get("/settings/webhooks").text)
    assert "The service POSTs an event to the endpoints of alice when one of its keys is created" in tab
    assert "your endpoints" not in tab and "your receiver" not in tab
    for number in range(endpoints.MAX_ENDPOINTS - 1):
        endpoints.add_endpoint(user, f"http://127.0.0.1:9/{number}")
    full = words(logged_in.get("/settings/webhooks").text)
    assert "alice has 10 endpoints, the most an organisation may have; remove one to add another." in full
    assert "Add endpoint" not in full and "the most an account may have" not in full


def resend_buttons(page):
    """The webhook-ids the page offers Resend for."""
    return re.findall(r'aria-label="Resend (msg_[^"]+)"', page)


def test_a_paused_endpoint_offers_no_resend_which_it_would_refuse(app, logged_in, hook):
    message = endpoints.send_test(hook)
    delivery.deliver_due(app)
    attempts = f"/settings/webhooks/{hook.id}/attempts"
    assert resend_buttons(logged_in.get(attempts).text) == [message.message_id]
    endpoints.pause_endpoint(hook)
    refused = logged_in.post(f"/settings/webhooks/{hook.id}/resend", data={"message_id": message.message_id})
    assert refused.status_code == 409 and "The endpoint is paused: resume it to send its messages." in refused.text
    for page in [refused.text, logged_in.get("/settings/webhooks").text, logged_in.get(attempts).text,
                 logged_in.get(f"/settings/webhooks/{hook.id}/messages").text,
                 logged_in.get(f"/settings/webhooks/{hook.id}/messages/{message.message_id}").text]:
        assert message.message_id in page
        assert resend_buttons(page) == [] and f"/webhooks/{hook.id}/resend" not in page
    assert "none is sent again before then" in words(logged_in.get("/settings/webhooks").text)
    endpoints.resume_endpoint(hook)
    assert resend_buttons(logged_in.get(attempts).text) == [message.message_id]


def test_an_attempt_of_a_forgotten_message_offers_no_resend_and_says_why(app, logged_in, hook):
    forgotten = endpoints.send_test(hook)
    delivery.deliver_due(app)
    kept = endpoints.send_test(hook)
    delivery.deliver_due(app)
    WebhookMessage.delete().where(WebhookMessage.id == forgotten.id).execute()
    for url in ["/settings/webhooks", f"/settings/webhooks/{hook.id}/attempts"]:
        page = logged_in.get(url).text
        assert page.count('<tr class="attempt">') == 2 and forgotten.message_id in page
        assert resend_buttons(page) == [kept.message_id]
        assert words(page).count("Message no longer kept") == 1


def test_send_test_event_is_not_offered_while_a_test_event_is_on_its_way(app, logged_in, hook, receiver):
    form = f'action="/settings/webhooks/{hook.id}/test"'
    hint = f'<p class="hint waiting-test" id="webhook-{hook.id}-test">A test event is on its way</p>'
    tab, attempts = "/settings/webhooks", f"/settings/webhooks/{hook.id}/attempts"
    assert form in logged_in.get(tab).text
    message = endpoints.send_test(hook)
    drawn = logged_in.get(tab).text
    assert form not in drawn and hint in words(drawn)
    # The list's script puts the fragment's control in the page's: the same id on both.
    assert f'data-control="webhook-{hook.id}-test"' in drawn
    for page in [drawn, logged_in.get(attempts).text]:
        assert form not in page and hint in words(page)
    assert logged_in.post(f"/settings/webhooks/{hook.id}/test").status_code == 409
    # A failed first attempt leaves the test event waiting for its retry: still none offered.
    answer, receiver.answer = receiver.answer, lambda delivery: 500
    delivery.deliver_due(app)
    receiver.answer = answer
    assert WebhookMessage.get_by_id(message.id).state == PENDING
    assert form not in logged_in.get(attempts).text and hint in words(logged_in.get(tab).text)
    WebhookMessage.update(next_attempt_at=WebhookMessage.created_at).execute()  # its retry due now
    delivery.deliver_due(app)
    for page in [logged_in.get(tab).text, logged_in.get(attempts).text]:
        assert form in page and hint not in words(page)
    assert logged_in.post(f"/settings/webhooks/{hook.id}/test").status_code == 302


def test_the_attempts_fragment_has_no_send_test_event_for_a_paused_endpoint(app, logged_in, hook):
    endpoints.pause_endpoint(hook)
    fragment = logged_in.get(f"/settings/webhooks/{hook.id}/attempts").text
    assert f'id="webhook-{hook.id}-attempts"' in fragment and f'id="webhook-{hook.id}-test"' not in fragment


def test_the_newest_five_attempts_show_open_and_the_rest_folded_beside_the_message_log(app, logged_in, hook):
    sent = []
    for _ in range(12):
        sent.append(endpoints.send_test(hook).message_id)
        delivery.deliver_due(app)
    newest = sent[::-1]
    for url in ["/settings/webhooks", f"/settings/webhooks/{hook.id}/attempts"]:
        page = logged_in.get(url).text
        assert page.count('<tr class="attempt">') == 12 and page.count('<details class="older-attempts">') == 1
        shown, folded = page.split('<details class="older-attempts">')
        assert resend_buttons(shown) == newest[:5] and shown.count('<tr class="attempt">') == 5
        assert "The newest 5 of the last 12 attempts" in shown
        assert resend_buttons(folded) == newest[5:] and "<summary>7 older attempts</summary>" in folded
    assert (f'<a href="/settings/webhooks/{hook.id}/messages">Message log'
            in logged_in.get("/settings/webhooks").text.split('<details class="older-attempts">')[1])
    WebhookAttempt.delete().where(WebhookAttempt.message_id.not_in(sent[-3:])).execute()
    page = logged_in.get(f"/settings/webhooks/{hook.id}/attempts").text
    assert "older-attempts" not in page and "The last 3 attempts, newest first" in page
    assert resend_buttons(page) == newest[:3]
