"""Forgotten passwords in-process, on SQLite and PostgreSQL: a link asked for by address (the cap,
the one transaction with its mail, nothing for an unknown address) and a password set through it
(the sign-up rules, every session ended, once only, never with a used, voided, expired, changed or
guessed link)."""

import datetime

import pytest

from accounts import emailtokens, recovery, securitylog, sessions, users
from accounts.emailtokens import EmailToken
from models import SecurityEvent, Session, User, utcnow
from orgs import organisations

NEW_PASSWORD = "a brand new passphrase"


class Mailer:
    """mail_link's stand-in: the (username, token) of each link it was given."""

    def __init__(self):
        self.links = []

    def __call__(self, user, token):
        self.links.append((user.username, token))


def ask(address="alice@example.com"):
    """Ask for a link; return the token mailed, or None."""
    mailer = Mailer()
    mailed = recovery.request_reset(recovery.checked_address(address), mailer)
    assert mailed == bool(mailer.links)
    return mailer.links[-1][1] if mailer.links else None


def events(user, event):
    return [row.event for row in securitylog.recent(user.id, None) if row.event == event]


def test_a_known_address_gets_one_link_in_the_transaction_of_its_token(user):
    token = ask("  Alice@Example.COM ")
    row = EmailToken.get()
    assert row.token_hash == emailtokens.hashed(token) and token not in row.token_hash
    assert (row.user_id, row.purpose, row.email) == (user.id, emailtokens.PASSWORD_RESET, "alice@example.com")
    assert events(user, "user.password_reset_requested") == ["user.password_reset_requested"]


def test_an_unknown_address_gets_nothing_and_leaves_nothing(user):
    assert ask("nobody@example.com") is None
    assert EmailToken.select().count() == 0
    assert SecurityEvent.select().where(SecurityEvent.event == "user.password_reset_requested").count() == 0


def test_a_mail_that_cannot_be_written_takes_its_token_and_event_with_it(user):
    def failing(user, token):
        raise ValueError("Not an email address a mail can be sent to.")

    with pytest.raises(ValueError):
        recovery.request_reset("alice@example.com", failing)
    assert EmailToken.select().count() == 0
    assert events(user, "user.password_reset_requested") == []


@pytest.mark.parametrize("address", [
    "alice@example.com\r\nBcc: eve@example.com", "alice@example.com\nSubject: hi", "alice\x00@example.com",
    "alice\u2028@example.com", "no-at-sign", "", "a@b", f"{'a' * 250}@example.com",
])
def test_what_is_no_address_is_refused_with_a_sentence(address):
    with pytest.raises(ValueError, match="email address"):
        recovery.checked_address(address)


def test_an_account_gets_three_links_an_hour(user):
    tokens = [ask() for _ in range(recovery.MAILS_PER_HOUR)]
    assert all(tokens) and ask() is None
    assert EmailToken.select().count() == recovery.MAILS_PER_HOUR
    assert len(events(user, "user.password_reset_requested")) == recovery.MAILS_PER_HOUR
    an_hour_ago = utcnow() - recovery.HOUR - datetime.timedelta(seconds=1)
    EmailToken.update(created_at=an_hour_ago).execute()
    assert ask() is not None


def test_a_link_sets_the_password_ends_every_session_and_is_used_up(user):
    for _ in range(2):
        sessions.start_session(user)
    token = ask()
    changed = recovery.reset_password(token, NEW_PASSWORD)
    assert changed.id == user.id
    assert Session.select().where(Session.user == user.id).count() == 0
    assert users.user_for_login("alice", NEW_PASSWORD).id == user.id
    assert users.user_for_login("alice", "correct horse battery") is None
    assert EmailToken.get().used_at is not None
    assert events(user, "user.password_reset") == ["user.password_reset"]
    with pytest.raises(recovery.LinkUnusable) as refused:
        recovery.reset_password(token, "yet another passphrase")
    assert refused.value.why == emailtokens.USED
    assert users.user_for_login("alice", NEW_PASSWORD) is not None


@pytest.mark.parametrize("password, sentence", [
    ("short", "at least 8 characters"), ("password", "most common"), ("x" * 1025, "at most 1024"),
    ("new\x00password", "control characters"),
])
def test_the_sign_up_rules_hold_and_a_refused_password_leaves_the_link_usable(user, password, sentence):
    token = ask()
    before = User.get_by_id(user.id).password_hash
    with pytest.raises(ValueError, match=sentence):
        recovery.reset_password(token, password)
    assert User.get_by_id(user.id).password_hash == before
    assert recovery.find_link(token).user.id == user.id
    recovery.reset_password(token, NEW_PASSWORD)


def unusable(token):
    with pytest.raises(recovery.LinkUnusable) as refused:
        recovery.find_link(token)
    return refused.value.why


def test_a_newer_link_voids_the_older_one(user):
    older, newer = ask(), ask()
    assert unusable(older) == emailtokens.VOIDED
    with pytest.raises(recovery.LinkUnusable):
        recovery.reset_password(older, NEW_PASSWORD)
    recovery.reset_password(newer, NEW_PASSWORD)


def test_a_password_changed_on_the_profile_voids_the_link_mailed_before(user):
    token = ask()
    users.change_password(user, "correct horse battery", NEW_PASSWORD)
    assert unusable(token) == recovery.PASSWORD_CHANGED
    with pytest.raises(recovery.LinkUnusable):
        recovery.reset_password(token, "another new passphrase")
    assert users.password_matches(User.get_by_id(user.id), NEW_PASSWORD)


def test_a_refused_profile_change_leaves_the_link_usable(user):
    token = ask()
    with pytest.raises(users.WrongPassword):
        users.change_password(user, "not the password", NEW_PASSWORD)
    with pytest.raises(ValueError, match="most common"):
        users.change_password(user, "correct horse battery", "password123")
    recovery.find_link(token)


def test_a_reset_voids_every_other_link_of_the_account(user):
    used, other = ask(), ask()
    EmailToken.update(voided_at=None).execute()  # two outstanding, as a link made by an older release
    recovery.reset_password(other, NEW_PASSWORD)
    assert unusable(used) == emailtokens.VOIDED


def test_an_expired_link_changes_nothing(user):
    token = ask()
    EmailToken.update(expires_at=utcnow() - datetime.timedelta(seconds=1)).execute()
    before = User.get_by_id(user.id).password_hash
    with pytest.raises(recovery.LinkUnusable) as refused:
        recovery.reset_password(token, NEW_PASSWORD)
    assert refused.value.why == emailtokens.EXPIRED
    assert User.get_by_id(user.id).password_hash == before and EmailToken.get().used_at is None
    assert events(user, "user.password_reset") == []


def test_a_link_to_an_address_the_account_left_is_refused(user):
    token = ask()
    User.update(email="alice@elsewhere.example").where(User.id == user.id).execute()
    assert unusable(token) == recovery.ADDRESS_CHANGED
    User.update(email="alice@example.com").where(User.id == user.id).execute()
    assert recovery.find_link(token)


def test_an_address_changed_while_the_password_was_hashed_is_caught_under_the_lock(user, monkeypatch):
    token = ask()
    hash_password = users.hash_password

    def meanwhile(password):
        User.update(email="alice@elsewhere.example").where(User.id == user.id).execute()
        return hash_password(password)

    monkeypatch.setattr(users, "hash_password", meanwhile)
    with pytest.raises(recovery.LinkUnusable) as refused:
        recovery.reset_password(token, NEW_PASSWORD)
    assert refused.value.why == recovery.ADDRESS_CHANGED and EmailToken.get().used_at is None


def test_two_resets_racing_with_one_link_set_one_password(user, monkeypatch):
    token = ask()
    hash_password = users.hash_password
    raced = []

    def meanwhile(password):
        if not raced:  # the other request finishes while this one hashes
            raced.append(password)
            recovery.reset_password(token, "the other passphrase")
        return hash_password(password)

    monkeypatch.setattr(users, "hash_password", meanwhile)
    with pytest.raises(recovery.LinkUnusable) as refused:
        recovery.reset_password(token, NEW_PASSWORD)
    assert refused.value.why == emailtokens.USED
    assert users.user_for_login("alice", "the other passphrase") is not None
    assert users.user_for_login("alice", NEW_PASSWORD) is None
    assert len(events(user, "user.password_reset")) == 1


def test_a_deleted_accounts_link_is_unknown(user):
    token = ask()
    organisations.delete_account(user, "correct horse battery")
    assert unusable(token) == emailtokens.UNKNOWN


@pytest.mark.parametrize("token", [
    "x" * 1_000_000, "", "a" * 42, "a" * 44, "../../etc/passwd", "é" * 43, "a\x00" + "b" * 41, "%" * 43,
    "' OR 1=1 --" + "a" * 32,
])
def test_a_guessed_or_garbage_token_is_unknown_without_a_query(user, monkeypatch, token):
    def no_query(*args, **kwargs):
        raise AssertionError("looked up")

    monkeypatch.setattr(EmailToken, "get_or_none", no_query)
    assert unusable(token) == emailtokens.UNKNOWN


def test_a_well_formed_guess_is_unknown(user):
    ask()
    assert unusable("A" * 43) == emailtokens.UNKNOWN
    with pytest.raises(recovery.LinkUnusable):
        recovery.reset_password("A" * 43, NEW_PASSWORD)
