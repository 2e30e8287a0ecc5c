"""An account's address, confirmed and changed through tokens: each link acts once and only while it
may, a newer one voids the older, the caps hold, a refused link changes nothing, and a change never
takes another account's address, even in a race."""

import datetime

import pytest

from accounts import emailaddress, emailtokens, securitylog, users
from accounts.emailaddress import OTHER_ACCOUNT, TAKEN, LinkRefused, TooManyMails
from accounts.emailtokens import EMAIL_CHANGE, EMAIL_VERIFY, EXPIRED, UNKNOWN, USED, VOIDED, EmailToken
from models import User, db, utcnow


def fresh(user):
    return User.get_by_id(user.id)


def events(user, name):
    return [event.detail for event in securitylog.recent(user.id) if event.event == name]


def expire(token):
    (EmailToken.update(expires_at=utcnow() - datetime.timedelta(seconds=1))
     .where(EmailToken.token_hash == emailtokens.hashed(token)).execute())


def refused(action, *args):
    """The reason LinkRefused gave, after the action rolled back as its caller's transaction does."""
    with pytest.raises(LinkRefused) as caught, db.atomic():
        action(*args)
    return caught.value.why


@pytest.fixture
def bob(app):
    return users.create_user("bob", "bob@example.com", "another long password")


def test_a_verify_link_confirms_the_address_once(user):
    token = emailaddress.new_verify_token(user)
    with db.atomic():
        assert emailaddress.verify(token).id == user.id
    confirmed = fresh(user).email_verified_at
    assert confirmed is not None and events(user, "user.email_verified") == ["alice@example.com"]
    assert refused(emailaddress.verify, token) == USED
    assert fresh(user).email_verified_at == confirmed and len(events(user, "user.email_verified")) == 1


def test_a_newer_link_voids_the_older(user):
    older = emailaddress.new_verify_token(user)
    newer = emailaddress.verify_token_again(user)
    assert refused(emailaddress.verify, older) == VOIDED
    assert fresh(user).email_verified_at is None
    emailaddress.verify(newer)
    assert fresh(user).email_verified_at is not None


def test_an_expired_link_changes_nothing(user):
    token = emailaddress.new_verify_token(user)
    expire(token)
    assert refused(emailaddress.verify, token) == EXPIRED
    assert fresh(user).email_verified_at is None and events(user, "user.email_verified") == []
    assert EmailToken.get(EmailToken.token_hash == emailtokens.hashed(token)).used_at is None


@pytest.mark.parametrize("token", ["", "x", "A" * 42, "A" * 44, "A" * 1_000_000, "../../etc/passwd", "é" * 43,
                                   "A" * 42 + "\n"])
def test_garbage_tokens_are_unknown(user, token):
    emailaddress.new_verify_token(user)
    assert refused(emailaddress.verify, token) == UNKNOWN
    assert refused(emailaddress.change, token, user) == UNKNOWN


def test_a_guessed_token_of_the_right_shape_is_unknown(user):
    emailaddress.new_verify_token(user)
    assert refused(emailaddress.verify, "A" * 43) == UNKNOWN


def test_a_token_of_one_purpose_does_nothing_for_the_other(user):
    verify = emailaddress.new_verify_token(user)
    _, change = emailaddress.request_change(user, "new@example.com")
    assert refused(emailaddress.change, verify, user) == UNKNOWN
    assert refused(emailaddress.verify, change) == UNKNOWN


def test_sending_again_is_capped_per_account_and_hour(user):
    emailaddress.new_verify_token(user)  # sign-up's counts
    for _ in range(emailaddress.MAILS_PER_HOUR - 1):
        emailaddress.verify_token_again(user)
    with pytest.raises(TooManyMails):
        emailaddress.verify_token_again(user)
    EmailToken.update(created_at=utcnow() - datetime.timedelta(hours=1, seconds=1)).execute()
    emailaddress.verify_token_again(user)


def test_a_confirmed_address_gets_no_new_link(user):
    emailaddress.verify(emailaddress.new_verify_token(user))
    with pytest.raises(ValueError, match="already confirmed"):
        emailaddress.verify_token_again(user)


def test_a_change_makes_the_new_address_the_accounts_and_confirmed(user):
    new, token = emailaddress.request_change(user, "  New@Example.COM ")
    assert new == "new@example.com" and fresh(user).email == "alice@example.com"
    assert events(user, "user.email_change_requested") == ["to new@example.com"]
    assert emailaddress.pending_change(user).email == "new@example.com"
    with db.atomic():
        assert emailaddress.change(token, user) == ("alice@example.com", "new@example.com")
    changed = fresh(user)
    assert changed.email == "new@example.com" and changed.email_verified_at is not None
    assert events(user, "user.email_changed") == ["from alice@example.com to new@example.com"]
    assert emailaddress.pending_change(user) is None
    assert refused(emailaddress.change, token, user) == USED


def test_a_change_voids_the_links_that_confirm_the_old_address(user):
    verify = emailaddress.new_verify_token(user)
    emailaddress.change(emailaddress.request_change(user, "new@example.com")[1], user)
    assert refused(emailaddress.verify, verify) == VOIDED
    assert fresh(user).email == "new@example.com"


def test_a_change_voids_a_reset_link_mailed_to_the_old_address(user):
    """Else it would work again, within its hour, should the address be changed back."""
    reset = emailtokens.issue(user.id, emailtokens.PASSWORD_RESET, user.email)
    emailaddress.change(emailaddress.request_change(user, "new@example.com")[1], user)
    emailaddress.change(emailaddress.request_change(fresh(user), "alice@example.com")[1], fresh(user))
    assert emailtokens.find(reset, emailtokens.PASSWORD_RESET)[1] == VOIDED


def test_a_verify_link_for_an_address_the_account_no_longer_has_is_void(user):
    # As if the address were changed some other way (an operator's UPDATE): the row's address is checked.
    token = emailaddress.new_verify_token(user)
    User.update(email="other@example.com").where(User.id == user.id).execute()
    assert refused(emailaddress.verify, token) == VOIDED
    assert fresh(user).email_verified_at is None


@pytest.mark.parametrize("address, sentence", [
    ("not-an-address", "does not look like an email address"),
    ("new@example.com\r\nBcc: eve@example.com", "control characters"),
    ("new@example.com\nBcc: eve@example.com", "control characters"),
    ("new@exam\x00ple.com", "control characters"),
    ("new@example.com, eve@example.com", "does not look like an email address"),
    ("x" * 250 + "@example.com", "does not look like an email address"),
    ("alice@example.com", "already your address"),
    ("ALICE@example.com", "already your address"),
])
def test_an_address_that_cannot_be_the_accounts_is_refused_before_anything_is_written(user, address, sentence):
    with pytest.raises(ValueError, match=sentence), db.atomic():
        emailaddress.request_change(user, address)
    assert EmailToken.select().count() == 0 and events(user, "user.email_change_requested") == []


def test_asking_for_changes_is_capped_per_account_and_hour(user):
    for n in range(emailaddress.MAILS_PER_HOUR):
        emailaddress.request_change(user, f"new{n}@example.com")
    with pytest.raises(TooManyMails):
        emailaddress.request_change(user, "one-more@example.com")
    assert len(events(user, "user.email_change_requested")) == emailaddress.MAILS_PER_HOUR


def test_only_the_newest_change_link_acts(user):
    _, first = emailaddress.request_change(user, "first@example.com")
    _, second = emailaddress.request_change(user, "second@example.com")
    assert refused(emailaddress.change, first, user) == VOIDED
    emailaddress.change(second, user)
    assert fresh(user).email == "second@example.com"


def test_a_change_link_acts_only_for_its_own_account(user, bob):
    _, token = emailaddress.request_change(user, "new@example.com")
    assert refused(emailaddress.change, token, bob) == OTHER_ACCOUNT
    assert fresh(bob).email == "bob@example.com" and fresh(user).email == "alice@example.com"
    emailaddress.change(token, user)  # still unused
    assert fresh(user).email == "new@example.com"


def test_an_expired_change_link_changes_nothing(user):
    _, token = emailaddress.request_change(user, "new@example.com")
    expire(token)
    assert refused(emailaddress.change, token, user) == EXPIRED
    assert fresh(user).email == "alice@example.com"


def test_asking_for_another_accounts_address_is_answered_alike_and_refused_when_followed(user, bob):
    new, token = emailaddress.request_change(user, "bob@example.com")
    assert new == "bob@example.com"  # no word of bob here: the link's page says it
    assert refused(emailaddress.change, token, user) == TAKEN
    assert fresh(user).email == "alice@example.com" and fresh(bob).email == "bob@example.com"
    assert EmailToken.get(EmailToken.token_hash == emailtokens.hashed(token)).used_at is None
    assert events(user, "user.email_changed") == []


def test_two_accounts_following_links_to_one_address_one_wins(user, bob):
    _, alices = emailaddress.request_change(user, "shared@example.com")
    _, bobs = emailaddress.request_change(bob, "shared@example.com")
    with db.atomic():
        emailaddress.change(alices, user)
    assert refused(emailaddress.change, bobs, bob) == TAKEN
    assert fresh(user).email == "shared@example.com" and fresh(bob).email == "bob@example.com"


def test_the_unique_address_refuses_a_change_the_check_missed(user, bob, monkeypatch):
    # The race the check cannot see: another account took the address after it looked.
    _, token = emailaddress.request_change(bob, "alice@example.com")
    monkeypatch.setattr(emailaddress, "taken_by_another", lambda email, user_id: False)
    assert refused(emailaddress.change, token, bob) == TAKEN
    assert fresh(bob).email == "bob@example.com"
    assert EmailToken.get(EmailToken.token_hash == emailtokens.hashed(token)).used_at is None
    assert events(bob, "user.email_changed") == []


def test_a_token_is_stored_hashed_only(user):
    token = emailaddress.new_verify_token(user)
    [row] = EmailToken.select()
    assert row.token_hash == emailtokens.hashed(token) and token not in str(row.__data__)
    assert EMAIL_VERIFY == row.purpose and EMAIL_CHANGE != row.purpose
