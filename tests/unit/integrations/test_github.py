"""POST /api/v1/integrations/github/secret-scanning with Flask's client, on SQLite and PostgreSQL,
against a loopback server of GitHub's keys: a signed report revokes the active keys it names (the
security log, the webhook event with source and url, the owner's mail), labels every token, and
changes nothing when replayed; forged, malformed, oversized and unjudgeable reports are refused and
change nothing; no token reaches a log or an error (the real server: tests/live/test_github_scanning.py;
reports of many keys: test_github_batches.py)."""

import datetime
import io
import json
import logging

import pytest
from contract import assert_conforms, assert_error
from githubscanning import PATH, Signer, report, send
from webhookreceiver import catalog_errors

from accounts import users
from integrations import github
from keys import keyformat
from mail import outbox
from mail.models import MailMessage
from models import ApiKey, Membership, SecurityEvent, utcnow
from orgs import keyactions, members
from webhooks import endpoints
from webhooks.models import WebhookMessage

MIB = 1024 * 1024


def state():
    """What a report may change: the keys' revocations and secrets, events, messages and mails."""
    return ([(key.id, key.revoked_at, key.key_hash, key.previous_key_hash)
             for key in ApiKey.select().order_by(ApiKey.id)],
            SecurityEvent.select().count(), WebhookMessage.select().count(), MailMessage.select().count())


def leaked_events():
    return [json.loads(message.body) for message in
            WebhookMessage.select().where(WebhookMessage.event == "key.revoked_as_leaked").order_by(WebhookMessage.id)]


def test_a_signed_report_revokes_the_key_logs_sends_the_event_and_mails_the_owner(client, signer, bob):
    key, secret = keyactions.issue_key(bob, "Payments server", "production")
    url = "https://github.com/octo/repo/blob/0123abc/settings.py"
    response = send(client, signer, report(secret, url=url))
    assert response.status_code == 200
    assert assert_conforms(response) == [{"token_hash": keyformat.hash_key(secret),
                                          "token_type": "api_key_demo_service_key", "label": "true_positive"}]
    assert ApiKey.get_by_id(key.id).revoked_at is not None
    assert client.get("/api/v1/status", headers={"X-API-Key": secret}).get_json()["authenticated"] is False
    [logged] = SecurityEvent.select().where(SecurityEvent.event == "key.revoked_as_leaked")
    assert logged.detail == f"Payments server (id {key.id}, {key.display_prefix}...) reported by GitHub"
    [event] = leaked_events()
    assert event["data"] == {"key_id": key.id, "key_name": "Payments server", "key_prefix": key.display_prefix,
                             "revoked_at": event["data"]["revoked_at"], "source": "github", "url": url,
                             "org": "bob", "actor": None}
    [mail] = MailMessage.select()
    parts = outbox.parts_of(mail)
    assert mail.recipient == "bob@example.com" and mail.subject == "An API key was revoked: it was found in public"
    for part in parts.values():
        assert "GitHub's secret scanning found it in public, at " + url in part
        assert secret not in part and secret[len(key.display_prefix):] not in part


def test_the_api_revocation_keeps_its_event_data_as_before(client, bob):
    _, secret = keyactions.issue_key(bob, "Found by a person", "production")
    assert client.post("/api/v1/keys/revoke", headers={"X-API-Key": secret}).status_code == 200
    [event] = leaked_events()
    assert set(event["data"]) == {"key_id", "key_name", "key_prefix", "revoked_at", "org", "actor"}
    assert "GitHub" not in outbox.parts_of(MailMessage.get())["text"]


def test_a_replayed_report_changes_nothing_further(client, signer, bob):
    _, secret = keyactions.issue_key(bob, "Payments server", "production")
    body = report(secret)
    headers = signer.headers(body)
    first = client.post(PATH, data=body, headers=headers)
    after_first = state()
    again = client.post(PATH, data=body, headers=headers)
    assert again.status_code == 200 and again.get_json() == first.get_json()
    assert state() == after_first and len(leaked_events()) == 1 and MailMessage.select().count() == 1


def forged(signer, body):
    other = Signer(signer.identifier)
    return {
        "no headers": {"Content-Type": "application/json"},
        "no signature": {"Github-Public-Key-Identifier": signer.identifier},
        "no identifier": {"Github-Public-Key-Signature": signer.sign(body)},
        "another body's signature": signer.headers(body.replace(b"content", b"commit_")),
        "another key's signature": other.headers(body),
        "an unknown identifier": signer.headers(body, identifier="b" * 64),
        "a signature not in base64": {**signer.headers(body), "Github-Public-Key-Signature": "%%%"},
        "a huge identifier": signer.headers(body, identifier="a" * 64 + "0" * 1000),
    }


# Refused before the database is asked: one database is enough.
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("forgery", list(forged(Signer("x"), b"content")))
def test_a_forged_report_is_refused_and_changes_nothing(client, signer, bob, forgery, caplog):
    caplog.set_level(logging.DEBUG)
    _, secret = keyactions.issue_key(bob, "Payments server", "production")
    body = report(secret)
    before = state()
    response = client.post(PATH, data=body, headers=forged(signer, body)[forgery])
    assert_error(response, 401, "invalid_signature")
    assert response.headers["WWW-Authenticate"]
    assert state() == before
    assert secret not in response.get_data(as_text=True) and secret not in caplog.text


def test_an_unknown_identifier_reads_the_keys_again_at_most_once_a_minute(scanning, client, signer, keys, bob):
    clock = [1000.0]
    scanning.extensions["github_keys"].clock = lambda: clock[0]
    body = report("sk_live_" + "x" * 38)
    assert send(client, signer, body).status_code == 200
    for reads in (1, 2, 3):
        for _ in range(5):
            assert client.post(PATH, data=body, headers=signer.headers(body, identifier="c" * 64)).status_code == 401
        assert keys.read_count() == reads
        clock[0] += 60


def test_github_adds_a_key_and_its_reports_verify_a_minute_later(scanning, client, signer, keys, bob):
    clock = [1000.0]
    scanning.extensions["github_keys"].clock = lambda: clock[0]
    assert send(client, signer, report()).status_code == 200
    new = Signer("d" * 64)
    keys.document["public_keys"].append(new.entry())
    assert send(client, new, report()).status_code == 401
    clock[0] += 60
    assert send(client, new, report()).status_code == 200
    assert keys.read_count() == 2


def test_unreadable_keys_are_a_503_to_try_again_unless_a_kept_key_verifies(scanning, client, signer, keys, bob):
    _, secret = keyactions.issue_key(bob, "Payments server", "production")
    keys.answer = lambda handler: (500, b"{}")
    before = state()
    response = send(client, signer, report(secret))
    assert_error(response, 503, "service_unavailable")
    assert response.headers["Retry-After"] == "60" and state() == before
    # Once read, a key is kept past its 30 minutes while the URL cannot be read.
    keys.answer = None
    clock = [scanning.extensions["github_keys"].clock() + 61]
    scanning.extensions["github_keys"].clock = lambda: clock[0]
    assert send(client, signer, report()).status_code == 200
    keys.answer = lambda handler: None  # never answers
    clock[0] += 31 * 60
    reads = keys.read_count()
    assert send(client, signer, report(secret)).get_json()[0]["label"] == "true_positive"
    assert keys.read_count() == reads + 1


def test_the_endpoint_is_not_served_while_off(make_app, database_url, signer):
    app = make_app({"DATABASE_URL": database_url, "TESTING": True})
    client = app.test_client()
    body = report("sk_live_" + "x" * 38)
    refused = client.post(PATH, data=body, headers=signer.headers(body))
    unknown = client.post("/api/v1/integrations/github/nothing", data=body, headers=signer.headers(body))
    assert_error(refused, 404, "not_found")
    assert refused.get_json() == unknown.get_json()
    for method in ("GET", "PUT", "DELETE", "OPTIONS"):
        assert client.open(PATH, method=method).status_code == 404, method
    # The default body limit holds for it then.
    assert client.post(PATH, data=b"[" + b" " * 70_000 + b"]").status_code == 413


# Refused before the database is asked: one database is enough.
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("body, message", [
    (b"not json", "The report is not JSON in UTF-8."),
    (b"\xff\xfe[]", "The report is not JSON in UTF-8."),
    (b"[" * 100_000 + b"]" * 100_000, "The report is not JSON in UTF-8."),
    (b'{"token": "sk_live_x"}', 'A report is a JSON array of {"token", "type", "url", "source"} objects.'),
    (json.dumps([{"token": "t", "type": "x"}] * 1001).encode(), "A report holds at most 1,000 entries; this one "
                                                                "holds 1,001."),
    (b'["sk_live_secret"]', "Entry 0 of the report is not an object."),
    (b'[{"token": "a", "type": "x"}, {"token": 5, "type": "x"}]', "Entry 1 of the report has no string token."),
    (b'[{"token": "sk_live_secret"}]', "Entry 0 of the report has no string type."),
    (b'[{"token": "sk_live_secret", "type": "x", "url": ["u"]}]', "Entry 0 of the report has no string url."),
    (b'[{"token": "sk_live_secret", "type": "x", "source": 1}]', "Entry 0 of the report has no string source."),
    (b'[{"token": "sk_live_\\ud800", "type": "x"}]', "Entry 0 of the report has a token that is not UTF-8 text."),
    (b'[{"token": "a", "type": "x", "url": "\\udfff"}]', "Entry 0 of the report has a url that is not UTF-8 text."),
], ids=["not json", "not utf-8", "nested deep", "an object", "1001 entries", "a string entry", "a number token",
        "no type", "a list url", "a number source", "a lone surrogate token", "a lone surrogate url"])
def test_a_signed_body_that_is_no_report_is_a_400_naming_no_value(client, signer, bob, body, message, caplog):
    caplog.set_level(logging.DEBUG)
    before = state()
    response = send(client, signer, body)
    assert assert_error(response, 400, "invalid_request")["error"]["message"] == message
    assert state() == before and "sk_live_secret" not in caplog.text


def test_absent_or_null_url_and_source_are_taken_as_empty(client, signer, bob):
    _, secret = keyactions.issue_key(bob, "Payments server", "production")
    body = json.dumps([{"token": secret, "type": "t", "url": None}]).encode()
    assert send(client, signer, body).get_json()[0]["label"] == "true_positive"
    [event] = leaked_events()
    assert event["data"]["url"] == "" and event["data"]["source"] == "github"
    assert "found it in public." in outbox.parts_of(MailMessage.get())["text"]
    assert [error for error in catalog_errors({}, event) if "header" not in error] == []


def test_a_long_url_is_cut_to_a_links_length_in_the_event_the_log_and_the_mail(client, signer, bob):
    _, secret = keyactions.issue_key(bob, "Payments server", "production")
    url = "https://github.com/octo/repo/blob/main/" + "a" * 100_000
    assert send(client, signer, report(secret, url=url)).status_code == 200
    [event] = leaked_events()
    assert event["data"]["url"] == url[:github.MAX_URL_LENGTH]
    assert [error for error in catalog_errors({}, event) if "header" not in error] == []
    assert len(MailMessage.get().subject) < 200 and url[:3000] not in json.dumps(outbox.parts_of(MailMessage.get()))


def test_a_url_s_control_characters_never_reach_the_event_or_the_mail(client, signer, bob):
    _, secret = keyactions.issue_key(bob, "Payments server", "production")
    assert send(client, signer, report(secret, url="https://github.com/a\r\nBcc: x@example.com\x00")).status_code == 200
    [event] = leaked_events()
    assert event["data"]["url"] == "https://github.com/aBcc: x@example.com"
    assert "\nBcc" not in outbox.parts_of(MailMessage.get())["text"]


def test_labels_tell_this_services_secrets_from_others(client, signer, bob):
    _, active = keyactions.issue_key(bob, "active", "production")
    revoked_key, revoked = keyactions.issue_key(bob, "revoked", "development")
    keyactions.revoke_key(revoked_key)
    expired_key, expired = keyactions.issue_key(bob, "expired", "production")
    ApiKey.update(expires_at=utcnow() - datetime.timedelta(minutes=1)).where(ApiKey.id == expired_key.id).execute()
    stripe_like = "sk_live_51H" + "Ab3" * 30  # another provider's key: our prefix, not our form
    checksum_fails = active[:-6] + ("000000" if not active.endswith("000000") else "111111")
    unknown = keyformat.generate_secret("production")  # our form, never issued
    tokens = [active, revoked, expired, stripe_like, checksum_fails, unknown, "", "ghp_" + "a" * 36, active]
    before_revoked = ApiKey.get_by_id(revoked_key.id).revoked_at
    response = send(client, signer, report(*tokens))
    assert [(entry["token_hash"], entry["label"]) for entry in assert_conforms(response)] == [
        (keyformat.hash_key(token), label) for token, label in zip(tokens, [
            "true_positive", "true_positive", "true_positive", "false_positive", "false_positive", "false_positive",
            "false_positive", "false_positive", "true_positive"])]
    # The duplicate revoked once; the revoked and expired keys are as they were.
    assert len(leaked_events()) == 1 and MailMessage.select().count() == 1
    assert ApiKey.get_by_id(revoked_key.id).revoked_at == before_revoked
    assert ApiKey.get_by_id(expired_key.id).revoked_at is None


def test_a_rolled_out_secret_ends_alone_as_posting_it_to_keys_revoke_would(client, signer, bob):
    key, old = keyactions.issue_key(bob, "rolled", "production")
    new = keyactions.roll_key(key, 3600)
    response = send(client, signer, report(old))
    assert response.get_json()[0]["label"] == "true_positive"
    assert client.get("/api/v1/status", headers={"X-API-Key": old}).get_json()["authenticated"] is False
    assert client.get("/api/v1/status", headers={"X-API-Key": new}).get_json()["authenticated"] is True
    assert SecurityEvent.select().where(SecurityEvent.event == "key.previous_secret_revoked").count() == 1
    # Reported again: the service keeps no trace of a secret rolled out and ended (its hash is gone),
    # so it cannot tell it from a stranger's; nothing more changes.
    before = state()
    assert send(client, signer, report(old)).get_json()[0]["label"] == "false_positive"
    assert state() == before


def test_a_rolled_out_secret_past_its_grace_is_still_known_and_changes_nothing(client, signer, bob):
    key, old = keyactions.issue_key(bob, "rolled", "production")
    keyactions.roll_key(key, 3600)
    ApiKey.update(previous_expires_at=utcnow() - datetime.timedelta(seconds=1)).where(ApiKey.id == key.id).execute()
    before = state()
    assert send(client, signer, report(old)).get_json()[0]["label"] == "true_positive"
    assert state() == before


def test_a_key_of_another_organisation_is_revoked_there_and_its_creator_told(client, signer, bob):
    carol = users.create_user("carol", "carol@example.com", "correct horse battery")
    acme = members.create("Acme", carol)
    Membership.create(org=acme.id, user=bob.id, role="developer")
    endpoints.add_endpoint(carol, "http://127.0.0.1:9/acme", org=acme.id)
    key, secret = keyactions.issue_key(bob, "Acme's", "production", org=acme.id)
    assert send(client, signer, report(secret)).get_json()[0]["label"] == "true_positive"
    [event] = leaked_events()
    assert event["data"]["org"] == "acme" and event["data"]["key_id"] == key.id
    assert SecurityEvent.select().where((SecurityEvent.org == acme.id)
                                        & (SecurityEvent.event == "key.revoked_as_leaked")).count() == 1
    assert [mail.recipient for mail in MailMessage.select()] == ["bob@example.com"]


@pytest.mark.parametrize("sending", ["declared", "chunked"])
def test_a_report_of_1_mib_passes_whatever_max_body_bytes_says_and_one_byte_more_is_a_413(
        make_app, database_url, keys, signer, sending):
    app = make_app({"DATABASE_URL": database_url, "TESTING": True, "MAX_BODY_BYTES": 1024,
                    "GITHUB_SECRET_SCANNING": True, "GITHUB_SECRET_SCANNING_KEYS_URL": keys.url})
    client = app.test_client()
    empty = len(report("t", url=""))
    body = report("t", url="u" * (MIB - empty))
    assert len(body) == MIB
    for data, status in [(body, 200), (body[:-2] + b'u"}]', 413)]:
        options = {"data": data} if sending == "declared" else {
            "input_stream": io.BytesIO(data),
            "environ_overrides": {"HTTP_TRANSFER_ENCODING": "chunked", "wsgi.input_terminated": True}}
        response = client.post(PATH, headers=signer.headers(data), **options)
        assert response.status_code == status, response.get_data(as_text=True)
    assert_error(response, 413, "payload_too_large")
    assert response.get_json()["error"]["message"] == (f"The request body is larger than the {MIB} bytes "
                                                       "this service accepts.")
    # Other paths keep MAX_BODY_BYTES.
    assert client.post("/api/v1/keys/revoke", data=b"x" * 1025).status_code == 413


def test_reports_are_limited_per_client_ip(client, signer, bob):
    body = report()
    for _ in range(50):
        assert send(client, signer, body).status_code == 200
    response = send(client, signer, body)
    assert_error(response, 429, "rate_limit_exceeded")
    assert response.headers["RateLimit-Policy"].startswith('"public"')


def test_no_token_reaches_the_log_or_an_answer(client, signer, bob, caplog):
    caplog.set_level(logging.DEBUG)
    _, secret = keyactions.issue_key(bob, "Payments server", "production")
    tokens = [secret, "sk_live_" + "S" * 40]
    answers = [send(client, signer, report(*tokens)),
               send(client, signer, b'[{"token": "' + tokens[1].encode() + b'", "type": 5}]'),
               client.post(PATH, data=report(*tokens), headers=signer.headers(b"other"))]
    assert [answer.status_code for answer in answers] == [200, 400, 401]
    for token in tokens:
        assert token not in caplog.text and token[8:] not in caplog.text
        assert all(token not in answer.get_data(as_text=True) for answer in answers)
    assert "GitHub reported 2 tokens: 1 of this service's secrets, 1 revoked now." in caplog.text
