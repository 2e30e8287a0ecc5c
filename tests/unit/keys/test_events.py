"""keys/events.py: every key change sends key_changed once, inside its transaction, and the security
log and webhooks' outbox are its subscribers."""

import pytest
from peewee import OperationalError

from accounts import securitylog
from keys import events
from mail import notices
from models import ApiKey, SecurityEvent, db, personal_organisation
from orgs import keyactions, keyedits
from webhooks import outbox


@pytest.fixture
def sent():
    """(event, the key's organisation, detail, data, in a transaction) for each key_changed sent while the test runs."""
    received = []

    def listen(event, key, detail=None, data=None):
        received.append((event, key.org_id, detail, data, db.obj.in_transaction()))

    with events.key_changed.connected_to(listen):
        yield received


def test_each_key_action_sends_one_signal_inside_its_transaction(app, user, sent):
    key, _ = keyactions.issue_key(user, "Laptop", "production")
    keyactions.roll_key(key, grace=60)
    key = ApiKey.get_by_id(key.id)
    keyactions.limit_key(key, "5/second")
    keyactions.grant_credits(key, set_to=10)
    keyedits.update_key(key.id, True, name="Desk", credits_add=5)
    key = ApiKey.get_by_id(key.id)
    key.presented_hash = key.previous_key_hash
    keyactions.revoke_previous_secret(key)
    keyactions.revoke_key(key)
    org = personal_organisation(user.id).id
    assert [(event, org_id, in_transaction) for event, org_id, _, _, in_transaction in sent] == [
        ("key.created", org, True), ("key.rolled", org, True), ("key.limit_changed", org, True),
        ("key.credits_changed", org, True), ("key.updated", org, True), ("key.previous_secret_revoked", org, True),
        ("key.revoked", org, True)]
    # What the security log records is the signal's detail, event for event.
    logged = [(row.event, row.detail) for row in SecurityEvent.select().where(SecurityEvent.event.startswith("key."))
              .order_by(SecurityEvent.id)]
    assert logged == [(event, detail) for event, _, detail, _, _ in sent]
    # The webhook events carry the key, never its secret.
    assert {event: data["key_id"] for event, _, _, data, _ in sent if data} == {
        "key.created": key.id, "key.rolled": key.id, "key.updated": key.id, "key.revoked": key.id}


def test_a_subscriber_that_fails_rolls_the_change_back(app, user, monkeypatch):
    def refuse(*args, **kwargs):
        raise OperationalError("disk full")

    monkeypatch.setattr(outbox, "emit", refuse)
    with pytest.raises(OperationalError):
        keyactions.issue_key(user, "Laptop", "production")
    assert ApiKey.select().count() == 0
    assert not SecurityEvent.select().where(SecurityEvent.event.startswith("key.")).exists()


def test_the_subscribers_are_connected_once_however_many_apps_are_made(make_app, database_url):
    for _ in range(3):
        make_app({"DATABASE_URL": database_url, "RATELIMIT_STORAGE_URL": "memory://", "TESTING": True})
    assert {receiver.__qualname__ for receiver in (ref() for ref in events.key_changed.receivers.values())} == {
        securitylog.record_key_event.__qualname__, outbox.emit_key_event.__qualname__,
        notices.mail_key_notice.__qualname__}
    assert len(events.key_changed.receivers) == 3
    assert [ref().__qualname__ for ref in securitylog.recorded.receivers.values()] == [
        notices.mail_account_notice.__qualname__]
