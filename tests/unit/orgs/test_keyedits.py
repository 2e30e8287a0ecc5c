"""orgs/keyedits.py: a key changed in place, what it writes, who may widen it, and a change racing a
revocation or a roll; the web form and `keys update` are tested in tests/unit/web/test_keyedit.py."""

import contextlib
import datetime
import json
import sqlite3
import threading

import psycopg
import pytest
from teams import make_org

from keys import lookup
from keys.keyformat import hash_key
from models import ApiKey, Membership, SecurityEvent, User, utcnow
from orgs import keyactions, keyedits, members
from webhooks import endpoints, periodic
from webhooks.models import WebhookMessage

DAY = 86400


@pytest.fixture
def key(user):
    made, _ = keyactions.issue_key(user, "CI", "production", "pro", expires_in=30 * DAY,
                                   scopes=["test:read", "usage:read"], allow_ips="203.0.113.0/24", credits_given=100,
                                   refill=(100, "month"))
    return made


def key_updated_events():
    return [(event.detail, event.ip) for event in SecurityEvent.select().where(SecurityEvent.event == "key.updated")]


def test_a_change_writes_what_changed_with_one_log_line_and_one_webhook_message(app, user, key):
    app.config["WEBHOOK_ALLOW_PRIVATE"] = True
    endpoints.add_endpoint(user, "http://127.0.0.1:9/hooks")
    changed = keyedits.update_key(key.id, True, name="CI runner", scopes=["test:read"], tier="free",
                                  allow_ips="203.0.113.7", expires_in=DAY)
    assert changed == ["name", "scopes", "allow_ips", "expires_at", "tier"]
    row = ApiKey.get_by_id(key.id)
    assert (row.name, row.scopes, row.allow_ips, row.rate_limit_tier) == ("CI runner", "test:read", "203.0.113.7/32",
                                                                         "free")
    assert abs(row.expires_at - (utcnow() + datetime.timedelta(days=1))) < datetime.timedelta(seconds=5)
    assert (row.key_hash, row.credits_remaining, row.revoked_at) == (key.key_hash, 100, None)
    assert key_updated_events() == [(f"CI runner (id {key.id}): changed name, scopes, allow_ips, expires_at, tier",
                                     "cli")]
    [message] = WebhookMessage.select().where(WebhookMessage.event == "key.updated")
    assert json.loads(message.body)["data"] == {"key_id": key.id, "key_name": "CI runner",
                                                "key_prefix": key.display_prefix, "changed": changed,
                                                "actor": None, "org": "alice"}


def test_values_the_key_already_has_change_nothing_and_write_nothing(user, key):
    assert keyedits.update_key(key.id, False, name=" CI ", scopes=["usage:read", "test:read"], tier="pro",
                               allow_ips="203.0.113.9/24", credits_set=100, refill=(100, "month"), rates=None) == []
    assert key_updated_events() == []
    assert ApiKey.get_by_id(key.id).credits_granted == 100


def test_credits_and_windows_change_with_the_rest_in_one_event(user, key):
    changed = keyedits.update_key(key.id, True, name="Metered", credits_add=50, refill=None, rates="5/second")
    assert changed == ["name", "rates", "credits", "refill"]
    row = ApiKey.get_by_id(key.id)
    assert (row.credits_remaining, row.credits_refill_amount, row.rate_limits) == (150, None, "5/second")
    assert len(key_updated_events()) == 1
    assert not SecurityEvent.select().where(SecurityEvent.event == "key.credits_changed").exists()


def test_a_key_without_credits_given_only_a_refill_starts_at_its_amount(user):
    plain, _ = keyactions.issue_key(user, "Plain", "development")
    assert keyedits.update_key(plain.id, False, refill=(10, "day")) == ["credits", "refill"]
    assert ApiKey.get_by_id(plain.id).credits_remaining == 10
    assert keyedits.update_key(plain.id, False, refill=(10, "day")) == []


@pytest.mark.parametrize("change", [
    {"scopes": ["test:read", "usage:read", "time:stream"]},
    {"allow_ips": "203.0.0.0/16"},
    {"allow_ips": "203.0.113.0/24, 198.51.100.1"},
    {"allow_ips": ""},
    {"expires_in": 31 * DAY},
    {"expires_in": None},
    {"rates": "100000/second"},
    {"rates": "1/second"},
    {"credits_set": 101},
    {"credits_add": 1},
    {"refill": (101, "month")},
    {"refill": (100, "day")},
    {"refill": (3, "day")},  # less a month, but every day from tomorrow where the month's is spent
], ids=lambda change: ",".join(f"{name}={value}" for name, value in change.items()))
def test_a_role_that_may_only_narrow_is_refused_any_widening_and_nothing_is_written(user, key, change):
    before = ApiKey.select().where(ApiKey.id == key.id).dicts().get()
    with pytest.raises(keyedits.WideningRefused, match="^Only owners and admins may widen a key: this change would"):
        keyedits.update_key(key.id, False, name="Renamed too", **change)
    assert ApiKey.select().where(ApiKey.id == key.id).dicts().get() == before
    assert key_updated_events() == []
    assert keyedits.update_key(key.id, True, **change)


def test_raising_the_tier_is_widening_and_lowering_it_is_not(user):
    free, _ = keyactions.issue_key(user, "Free", "development")
    with pytest.raises(keyedits.WideningRefused, match="change its tier to pro, which is not tighter"):
        keyedits.update_key(free.id, False, tier="pro")
    assert keyedits.update_key(free.id, True, tier="pro") == ["tier"]
    assert keyedits.update_key(free.id, False, tier="free") == ["tier"]


@pytest.mark.parametrize("change", [
    {"scopes": ["usage:read"]},
    {"allow_ips": "203.0.113.128/25\n203.0.113.7"},
    {"expires_in": DAY},
    {"tier": "free"},
    {"credits_set": 99},
    {"refill": None},
    {"refill": (99, "month")},
], ids=lambda change: ",".join(f"{name}={value}" for name, value in change.items()))
def test_a_role_that_may_only_narrow_may_narrow(user, key, change):
    assert keyedits.update_key(key.id, False, **change)


def test_a_tier_narrows_only_when_each_window_of_the_old_has_a_tighter_one_of_the_same_length():
    minute, hour, day, second = 60, 3600, 86400, 1
    assert keyedits.no_looser([(2, minute)], [(3, minute)])
    assert keyedits.no_looser([(2, minute), (10, second)], [(3, minute)])  # a window added
    assert not keyedits.no_looser([(3 * 24 * 60, day)], [(3, minute)])  # as many a day, all at once
    assert not keyedits.no_looser([(3, minute)], [(3, minute), (100, hour)])  # a window dropped
    assert not keyedits.no_looser([(4, minute)], [(3, minute)])


def test_blank_scopes_are_refused_not_taken_for_every_scope(user, key):
    for blank in ([""], [" ", ""], []):
        with pytest.raises(ValueError, match="Choose at least one scope."):
            keyedits.update_key(key.id, True, scopes=blank)
    assert ApiKey.get_by_id(key.id).scopes == "test:read,usage:read"


def test_a_new_expiry_is_announced_afresh_seven_days_before_it(user):
    soon, _ = keyactions.issue_key(user, "Soon", "production", expires_in=3 * DAY)
    assert periodic.run() == 1  # key.expiring, its marker written
    keyedits.update_key(soon.id, True, expires_in=30 * DAY)
    assert periodic.run() == 0
    assert periodic.run(now=utcnow() + datetime.timedelta(days=24)) == 1


def test_a_key_that_may_make_any_request_is_narrowed_by_any_allow_list_expiry_or_credits(user):
    open_key, _ = keyactions.issue_key(user, "Open", "development")
    assert keyedits.update_key(open_key.id, False, allow_ips="2001:db8::/32", expires_in=365 * DAY,
                               credits_set=10**12) == ["allow_ips", "expires_at", "credits"]


def test_bad_values_are_refused_with_a_sentence_before_anything_is_written(user, key):
    for change, message in [({"name": " "}, "A key name is 1 to 100 characters."),
                            ({"scopes": ["admin"]}, "Unknown scope 'admin'"),
                            ({"allow_ips": "localhost"}, "is not an IP address"),
                            ({"tier": "gold"}, "Unknown rate limit tier 'gold'"),
                            ({"expires_in": 0}, "A key's expiry must be in the future.")]:
        with pytest.raises(ValueError, match=message):
            keyedits.update_key(key.id, True, **change)
    assert key_updated_events() == []


def test_a_revoked_or_expired_key_cannot_be_changed(user, key):
    expired, _ = keyactions.issue_key(user, "Old", "development", expires_in=60)
    with pytest.raises(keyedits.KeyNotChangeable, match="'Old' is expired"):
        keyedits.update_key(expired.id, True, name="Again", now=utcnow() + datetime.timedelta(minutes=2))
    keyactions.revoke_key(key)
    with pytest.raises(keyedits.KeyNotChangeable, match="'CI' is revoked"):
        keyedits.update_key(key.id, True, expires_in=None)
    assert ApiKey.get_by_id(key.id).revoked_at is not None


@contextlib.contextmanager
def held_by_another_connection(database_url, sets, values):
    """Another connection runs `UPDATE api_keys SET <sets> WHERE id = ?` with values (`?` marks them;
    the last is the key's id) and holds the key's row until the block ends, then commits."""
    statement = f"UPDATE api_keys SET {sets} WHERE id = ?"
    if database_url.startswith("sqlite"):
        other = sqlite3.connect(database_url.removeprefix("sqlite:///"), isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        other.execute(statement, [value.isoformat(" ") if isinstance(value, datetime.datetime) else value
                                  for value in values])
    else:
        other = psycopg.connect(database_url)
        other.execute(statement.replace("?", "%s"), values)
    try:
        yield
    finally:
        other.execute("COMMIT")
        other.close()


def revoked_by_another_connection(database_url, key_id):
    """Another connection revokes the key and holds its row until the block ends, then commits."""
    return held_by_another_connection(database_url, "revoked_at = ?", [utcnow(), key_id])


def changed_in_a_thread(app, key_id, outcome, **change):
    """A thread that changes the key as an owner would, and appends what update_key gave or raised."""
    def change_key():
        with app.app_context():
            try:
                outcome.append(keyedits.update_key(key_id, True, **change))
            except keyedits.KeyNotChangeable as error:
                outcome.append(error)
    return threading.Thread(target=change_key)


def test_a_change_waiting_for_a_revocation_is_refused_and_never_brings_the_key_back(app, database_url, user, key):
    outcome = []
    with revoked_by_another_connection(database_url, key.id):
        waiting = changed_in_a_thread(app, key.id, outcome, name="Back", expires_in=None)
        waiting.start()
        waiting.join(0.5)
        assert waiting.is_alive(), "the change did not wait for the revocation's row"
    waiting.join(10)
    assert isinstance(outcome[0], keyedits.KeyNotChangeable)
    row = ApiKey.get_by_id(key.id)
    assert (row.name, row.revoked_at is not None) == ("CI", True)


def test_the_actors_role_read_with_the_keys_row_decides_not_the_one_the_page_was_drawn_with(user):
    acme = make_org("Acme", user, {"dora": "developer"})
    dora = User.get(User.username == "dora")
    own, _ = keyactions.issue_key(dora, "Dora's", "development", org=acme.id)
    Membership.update(role="viewer").where(Membership.user == dora.id).execute()  # since the page
    with pytest.raises(members.NotAllowed):
        keyedits.update_key(own.id, False, actor=dora, name="Still mine?")
    Membership.update(role="admin").where(Membership.user == dora.id).execute()
    assert keyedits.update_key(own.id, False, actor=dora, tier="pro") == ["tier"]  # an admin's now: it may widen
    assert ApiKey.get_by_id(own.id).name == "Dora's"


def test_a_change_waiting_for_a_roll_keeps_the_new_secret_and_the_old_one_only_for_its_grace(app, database_url, user,
                                                                                            key):
    old_hash, new_hash = key.key_hash, hash_key("sk_test_rolled-by-the-other-connection")
    grace_ends = utcnow() + datetime.timedelta(hours=1)
    outcome = []
    with held_by_another_connection(database_url, "key_hash = ?, previous_key_hash = ?, previous_expires_at = ?",
                                    [new_hash, old_hash, grace_ends, key.id]):
        waiting = changed_in_a_thread(app, key.id, outcome, name="Renamed", scopes=["test:read"])
        waiting.start()
        waiting.join(0.5)
        assert waiting.is_alive(), "the change did not wait for the roll's row"
    waiting.join(10)
    assert outcome == [["name", "scopes"]]
    row = ApiKey.get_by_id(key.id)
    assert (row.name, row.scopes, row.key_hash, row.previous_key_hash) == ("Renamed", "test:read", new_hash, old_hash)
    assert lookup.secret_is_active(new_hash) and lookup.secret_is_active(old_hash)


def test_a_roll_of_a_key_read_before_a_change_keeps_the_change(user, key):
    seen_by_the_roll = ApiKey.get_by_id(key.id)
    keyedits.update_key(key.id, True, name="Renamed", tier="free", scopes=["usage:read"])
    secret = keyactions.roll_key(seen_by_the_roll, grace=0)
    row = ApiKey.get_by_id(key.id)
    assert (row.name, row.rate_limit_tier, row.scopes, row.key_hash) == ("Renamed", "free", "usage:read",
                                                                         hash_key(secret))
    assert not lookup.secret_is_active(key.key_hash)


def test_a_roll_racing_a_revocation_after_a_change_never_brings_the_key_back(user, key):
    seen_by_the_roll = ApiKey.get_by_id(key.id)
    keyedits.update_key(key.id, True, name="Renamed")
    keyactions.revoke_key(ApiKey.get_by_id(key.id))
    with pytest.raises(keyactions.RollConflict):
        keyactions.roll_key(seen_by_the_roll, grace=0)
    assert ApiKey.get_by_id(key.id).revoked_at is not None
