"""Reports that name many keys at once (POST /api/v1/integrations/github/secret-scanning with Flask's
client, on SQLite and PostgreSQL): an organisation's security log trimmed once at the report's end,
revocations committed a few at a time, each announced after its commit, and one warning for the
owner's mails past the hourly cap (the report's other promises: test_github.py)."""

import logging

from githubscanning import report, send

from accounts import securitylog
from integrations import github
from mail import notices
from mail.models import MailMessage
from models import ApiKey, db, personal_organisation
from orgs import keyactions


def test_a_report_trims_each_organisations_log_once_at_its_end(client, signer, bob, monkeypatch):
    """Eight keys revoked by one report in a log that keeps five: the newest five events are kept,
    and the trim's index walk ran once for the organisation, not once per key."""
    monkeypatch.setattr(securitylog, "KEPT", 5)
    secrets = [keyactions.issue_key(bob, f"key {n}", "development")[1] for n in range(8)]
    trims = []
    forget = securitylog.forget_beyond_kept
    monkeypatch.setattr(securitylog, "forget_beyond_kept", lambda whose: trims.append(whose) or forget(whose))
    assert send(client, signer, report(*secrets)).status_code == 200
    kept = securitylog.recent_in(personal_organisation(bob.id).id, limit=None)
    assert [event.event for event in kept] == ["key.revoked_as_leaked"] * 5
    revoked_in_order = [f"key {secrets.index(secret)}" for secret in sorted(secrets)]  # the secrets' order
    assert [event.detail.split(" (")[0] for event in kept] == revoked_in_order[:2:-1]
    assert len(trims) == 1


def test_a_report_s_revocations_commit_a_few_at_a_time_each_announced_after_its_commit(scanning, client, signer,
                                                                                       bob, monkeypatch):
    """Seven keys in transactions of three: three announcements, each of its transaction's keys and
    made once it has committed (another process must never read a key's old row under the new
    generation); the keys are taken in their secrets' order, whatever the report's."""
    monkeypatch.setattr(github, "ENTRIES_PER_TRANSACTION", 3)
    made = [keyactions.issue_key(bob, f"key {n}", "development") for n in range(7)]
    announced = []
    monkeypatch.setattr(scanning.extensions["keys"], "announce_change",
                        lambda keys: announced.append((db.in_transaction(), [key.id for key in keys])))
    assert send(client, signer, report(*(secret for _, secret in made))).status_code == 200
    ids = [key.id for key, _ in sorted(made, key=lambda pair: pair[1])]
    assert announced == [(False, ids[:3]), (False, ids[3:6]), (False, ids[6:])]
    assert ApiKey.select().where(ApiKey.revoked_at.is_null()).count() == 0


def test_a_report_of_many_keys_of_one_creator_counts_their_mails_once_past_the_cap(client, signer, bob, caplog):
    """Fourteen keys of one creator: ten notices reach the address, and the four past the hourly cap
    are one warning, not one each."""
    secrets = [keyactions.issue_key(bob, f"key {n}", "development")[1] for n in range(14)]
    caplog.set_level(logging.WARNING, logger="mail.notices")
    assert send(client, signer, report(*secrets)).status_code == 200
    assert MailMessage.select().where(MailMessage.recipient == "bob@example.com").count() == notices.NOTICES_PER_HOUR
    assert [record.getMessage() for record in caplog.records if record.name == "mail.notices"] == [
        f"No key_leaked notice for user {bob.id}: 10 mails went to their address in the last hour."]
