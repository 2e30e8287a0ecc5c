"""orgs/keyimports.py: a JSON Lines file of another system's keys, each line checked alone, written in
bounded transactions, with one log event and a key.created webhook per key; hostile files refused
line by line or whole. What a request does with an imported key: tests/unit/keys/test_imported.py."""

import json

import pytest
from importfiles import argon2id_line, bcrypt_line, jsonl, made_secret, sha256_base64, sha256_hex

from accounts import users
from keys.models import ImportedKey
from models import ApiKey, SecurityEvent
from orgs import importlines, keyactions, keyimports
from webhooks import endpoints
from webhooks.models import WebhookMessage

GOOD_HEX = "a" * 64
BCRYPT_COST_13 = "$2b$13$" + "a" * 21 + "." + "a" * 31
BCRYPT = "$2b$10$" + "a" * 21 + "." + "a" * 31
ARGON2_HUGE = "$argon2id$v=19$m=4194304,t=3,p=4$c29tZXNhbHRzb21lc2FsdA$" + "a" * 43
ARGON2_SLOW = "$argon2id$v=19$m=65536,t=10,p=4$c29tZXNhbHRzb21lc2FsdA$" + "a" * 43

HOSTILE = [
    ("not json {", "not a JSON object"),
    ("[1, 2]", "not a JSON object"),
    ("[" * 100_000, "not a JSON object"),
    ({"hash": GOOD_HEX, "hash_scheme": "sha256-hex", "prefix": "acme_", "name": "x", "owner": "me"},
     "unknown field 'owner'"),
    ({"hash_scheme": "sha256-hex", "prefix": "acme_", "name": "x"}, "hash is required"),
    ({"hash": GOOD_HEX, "hash_scheme": "md5", "prefix": "acme_", "name": "x"}, "hash_scheme is one of"),
    ({"hash": "a" * 63, "hash_scheme": "sha256-hex", "prefix": "acme_", "name": "x"}, "64 hexadecimal digits"),
    ({"hash": "YWJj", "hash_scheme": "sha256-base64", "prefix": "acme_", "name": "x"}, "32 bytes"),
    ({"hash": BCRYPT_COST_13, "hash_scheme": "bcrypt", "lookup_prefix": "rails_tok_abc", "name": "x"},
     "cost is at most 12"),
    ({"hash": "plain", "hash_scheme": "bcrypt", "lookup_prefix": "rails_tok_abc", "name": "x"}, "a bcrypt hash"),
    ({"hash": ARGON2_HUGE, "hash_scheme": "argon2id", "lookup_prefix": "rails_tok_abc", "name": "x"},
     "at most m=65536"),
    ({"hash": ARGON2_SLOW, "hash_scheme": "argon2id", "lookup_prefix": "rails_tok_abc", "name": "x"},
     "t=4"),
    ({"hash": GOOD_HEX, "hash_scheme": "sha256-hex", "prefix": "sk_live_", "name": "x"}, "this service's own form"),
    ({"hash": GOOD_HEX, "hash_scheme": "sha256-hex", "prefix": "sk_", "name": "x"}, "this service's own form"),
    ({"hash": GOOD_HEX, "hash_scheme": "sha256-hex", "prefix": "sk_test_abcd", "name": "x"},
     "this service's own form"),
    ({"hash": GOOD_HEX, "hash_scheme": "sha256-hex", "prefix": "a b", "name": "x"}, "without spaces"),
    ({"hash": GOOD_HEX, "hash_scheme": "sha256-hex", "prefix": "p" * 33, "name": "x"}, "at most 32"),
    ({"hash": GOOD_HEX, "hash_scheme": "sha256-hex", "name": "x"}, "prefix is required"),
    ({"hash": GOOD_HEX, "hash_scheme": "sha256-hex", "prefix": "a", "lookup_prefix": "abcdefghijkl", "name": "x"},
     "lookup_prefix is for bcrypt"),
    ({"hash": BCRYPT, "hash_scheme": "bcrypt", "prefix": "a", "name": "x"}, "prefix is for SHA-256"),
    ({"hash": BCRYPT, "hash_scheme": "bcrypt", "lookup_prefix": "short", "name": "x"}, "lookup_prefix is"),
    ({"hash": BCRYPT, "hash_scheme": "bcrypt", "lookup_prefix": "sk_live_abcdef", "name": "x"},
     "this service's own form"),
    ({"hash": GOOD_HEX, "hash_scheme": "sha256-hex", "prefix": "", "name": "bad\u0000name"}, "control characters"),
    ({"hash": GOOD_HEX, "hash_scheme": "sha256-hex", "prefix": "", "name": "n" * 101}, "1 to 100 characters"),
    ({"hash": GOOD_HEX, "hash_scheme": "sha256-hex", "prefix": "", "name": "x", "start": "ab\ncd"},
     "printable ASCII without spaces"),
    ({"hash": GOOD_HEX, "hash_scheme": "sha256-hex", "prefix": "", "name": "x", "start": "ключ ключ"},
     "printable ASCII without spaces"),
    ({"hash": GOOD_HEX, "hash_scheme": "sha256-hex", "prefix": "", "name": "x", "start": "sk_live_AbCd"},
     "pass for this service's own secrets"),
    ({"hash": GOOD_HEX, "hash_scheme": "sha256-hex", "prefix": "", "name": "x",
      "expires_at": "9999-12-31T23:59:59-01:00"}, "ISO 8601"),
    ({"hash": GOOD_HEX, "hash_scheme": "sha256-hex", "prefix": "", "name": "x",
      "created_at": "0001-01-01T00:00:00+01:00"}, "ISO 8601"),
    ({"hash": "$2b$04$" + "z" * 53, "hash_scheme": "bcrypt", "lookup_prefix": "rails_tok_abc", "name": "x"},
     "a bcrypt hash"),
    ({"hash": GOOD_HEX, "hash_scheme": "sha256-hex", "prefix": "", "name": "x", "external_id": "e" * 256},
     "at most 255"),
    ({"hash": GOOD_HEX, "hash_scheme": "sha256-hex", "prefix": "", "name": "x", "expires_at": "2001-01-01T00:00:00Z"},
     "expires_at has passed"),
    ({"hash": GOOD_HEX, "hash_scheme": "sha256-hex", "prefix": "", "name": "x", "created_at": "2999-01-01"},
     "created_at is in the future"),
    ({"hash": GOOD_HEX, "hash_scheme": "sha256-hex", "prefix": "", "name": "x", "expires_at": "soon"},
     "ISO 8601"),
    ({"hash": GOOD_HEX, "hash_scheme": "sha256-hex", "prefix": "", "name": "x", "credits": -1}, "credits is"),
    ({"hash": GOOD_HEX, "hash_scheme": "sha256-hex", "prefix": "", "name": "x", "credits": True}, "credits is"),
    ({"hash": GOOD_HEX, "hash_scheme": "sha256-hex", "prefix": "", "name": "x", "type": "admin"}, "type is"),
    ({"hash": GOOD_HEX, "hash_scheme": "sha256-hex", "prefix": "", "name": "x", "tier": "gold"}, "Unknown rate limit"),
    ({"hash": GOOD_HEX, "hash_scheme": "sha256-hex", "prefix": "", "name": "x", "scopes": ["root"]}, "Unknown scope"),
    ({"hash": GOOD_HEX, "hash_scheme": "sha256-hex", "prefix": "", "name": "x", "allow_ips": "300.1.1.1"},
     "allow-list"),
    ({"hash": GOOD_HEX, "hash_scheme": "sha256-hex", "prefix": "", "name": "x", "refill": "lots"}, "A refill is"),
]


@pytest.fixture
def org_id(user):
    return users.personal_organisation_id(user)


def imported_rows():
    return list(ImportedKey.select().order_by(ImportedKey.key))


@pytest.mark.parametrize(("line", "reason"), HOSTILE, ids=[str(index) for index in range(len(HOSTILE))])
def test_a_hostile_line_is_refused_with_its_reason_and_nothing_is_written(org_id, line, reason):
    [outcome] = keyimports.import_keys(org_id, jsonl(line))
    assert outcome.key_id is None and reason in outcome.refused, outcome.refused
    assert imported_rows() == [] and ApiKey.select().count() == 0


def test_each_line_is_checked_alone_and_the_good_ones_are_imported_with_what_they_say(org_id):
    secret = made_secret()
    outcomes = keyimports.import_keys(org_id, jsonl(
        sha256_hex(secret, name="Customer 1", external_id="cus_1", start="acme_live_3uX", tier="pro",
                   scopes="test:read,usage:read", allow_ips=["203.0.113.0/24"], credits=50, refill="50/day",
                   expires_at="2099-01-01T00:00:00+02:00", created_at="2024-05-01T12:00:00Z", type="development"),
        "oops", "", sha256_base64(made_secret()), bcrypt_line(made_secret("rails_tok_")),
        argon2id_line(made_secret("argon_tok_"))))
    assert [(outcome.line, outcome.refused) for outcome in outcomes] == [
        (1, None), (2, "not a JSON object."), (4, None), (5, None), (6, None)]
    key = ApiKey.get_by_id(outcomes[0].key_id)
    assert (key.name, key.key_type, key.rate_limit_tier, key.scopes, key.allow_ips, key.display_prefix) == (
        "Customer 1", "development", "pro", "test:read,usage:read", "203.0.113.0/24", "acme_live_3uX")
    assert (key.credits_remaining, key.credits_refill_amount, key.credits_refill_interval) == (50, 50, "day")
    assert (str(key.expires_at), str(key.created_at), key.user_id) == ("2098-12-31 22:00:00", "2024-05-01 12:00:00",
                                                                       None)
    assert [(row.hash_scheme, row.prefix, row.external_id, row.slow_hash is None) for row in imported_rows()] == [
        ("sha256-hex", "acme_live_", "cus_1", True), ("sha256-base64", "acme_live_", None, True),
        ("bcrypt", None, None, False), ("argon2id", None, None, False)]
    assert keyimports.summary(outcomes) == "4 of 5 lines imported, 1 refused."


def test_a_hash_or_lookup_prefix_already_here_is_refused_in_the_same_file_and_in_a_second_run(org_id):
    secret = made_secret("rails_tok_")
    lines = [sha256_hex(made_secret()), bcrypt_line(secret), bcrypt_line(secret + "x"),
             {**bcrypt_line(made_secret("rails_tok_")), "lookup_prefix": secret[:13]}]
    first = keyimports.import_keys(org_id, jsonl(*lines, lines[0]))
    assert [outcome.refused for outcome in first] == [
        None, None, *["lookup_prefix equals, starts or is the start of another key's lookup prefix."] * 2,
        "a key with this hash or lookup prefix is already here."]
    again = keyimports.import_keys(org_id, jsonl(lines[0], lines[1]))
    assert [outcome.refused is not None for outcome in again] == [True, True]
    assert len(imported_rows()) == 2


def test_a_dry_run_checks_every_line_and_writes_nothing(org_id):
    outcomes = keyimports.import_keys(org_id, jsonl(sha256_hex(made_secret()), "{}"), dry_run=True)
    assert [outcome.refused is None for outcome in outcomes] == [True, False]
    assert keyimports.summary(outcomes, dry_run=True) == "1 of 2 lines would be imported, 1 refused."
    assert imported_rows() == [] and SecurityEvent.select().where(SecurityEvent.event == "key.imported").count() == 0


@pytest.mark.parametrize(("data", "reason"), [
    (b"{}\n" * (keyimports.MAX_LINES + 1), "at most 10,000 lines"),
    (b" " * (keyimports.MAX_BYTES + 1), "at most 5 MiB"),
    (b'{"name": "\xff"}\n', "UTF-8"),
])
def test_a_file_past_its_bounds_is_refused_whole(org_id, data, reason):
    with pytest.raises(keyimports.ImportTooLarge, match=reason):
        keyimports.import_keys(org_id, data)


def test_a_file_of_exactly_the_most_lines_is_read(org_id):
    assert len(keyimports.read_lines(b"{}\n" * keyimports.MAX_LINES)) == keyimports.MAX_LINES


def test_one_log_event_counts_the_import_and_each_key_gets_a_key_created_webhook(app, user, org_id, monkeypatch):
    app.config["WEBHOOK_ALLOW_PRIVATE"] = True
    endpoints.add_endpoint(user, "http://127.0.0.1:9/hooks")
    monkeypatch.setattr(keyimports, "BATCH", 2)
    outcomes = keyimports.import_keys(org_id, jsonl(*(sha256_hex(made_secret(), external_id=f"cus_{n}")
                                                       for n in range(3))))
    [event] = SecurityEvent.select().where(SecurityEvent.event == "key.imported")
    assert (event.detail, event.org_id) == ("imported 3 keys by their hash", org_id)
    assert SecurityEvent.select().where(SecurityEvent.event == "key.created").count() == 0
    data = [json.loads(message.body)["data"] for message in
            WebhookMessage.select().where(WebhookMessage.event == "key.created").order_by(WebhookMessage.id)]
    assert [(item["key_id"], item["imported"], item["external_id"], item["key_prefix"]) for item in data] == [
        (outcome.key_id, True, f"cus_{n}", "acme_live_") for n, outcome in enumerate(outcomes)]


def test_an_interrupted_import_leaves_whole_batches_and_a_second_run_imports_the_rest(org_id, monkeypatch):
    lines = [sha256_hex(made_secret(), external_id=f"cus_{n}") for n in range(5)]
    monkeypatch.setattr(keyimports, "BATCH", 2)
    create = keyimports.create

    def fail_at_the_fourth(org_id, fields):
        if ImportedKey.select().count() == 3:
            raise RuntimeError("the process was stopped")
        return create(org_id, fields)

    monkeypatch.setattr(keyimports, "create", fail_at_the_fourth)
    with pytest.raises(RuntimeError):
        keyimports.import_keys(org_id, jsonl(*lines))
    assert [row.external_id for row in imported_rows()] == ["cus_0", "cus_1"]
    monkeypatch.setattr(keyimports, "create", create)
    again = keyimports.import_keys(org_id, jsonl(*lines))
    assert [outcome.refused is None for outcome in again] == [False, False, True, True, True]
    [event] = SecurityEvent.select().where(SecurityEvent.event == "key.imported").order_by(SecurityEvent.id.desc())[:1]
    assert event.detail == "imported 3 keys by their hash"


def test_imported_keys_leave_the_cap_on_keys_made_here(app, user, org_id):
    app.config["MAX_KEYS_PER_USER"] = 1
    keyimports.import_keys(org_id, jsonl(*(sha256_hex(made_secret()) for _ in range(3))))
    keyactions.issue_key(user, "made here", "development")
    with pytest.raises(keyactions.KeyCapReached):
        keyactions.issue_key(user, "one too many", "development")


def test_an_organisation_holds_at_most_its_bound_of_imported_keys(org_id, monkeypatch):
    monkeypatch.setattr(keyimports, "MAX_IMPORTED_KEYS", 2)
    outcomes = keyimports.import_keys(org_id, jsonl(*(sha256_hex(made_secret()) for _ in range(3))))
    assert [outcome.refused for outcome in outcomes][1:] == [
        None, "the organisation holds 2 imported keys, the most it may."]


def test_the_command_prints_a_line_for_each_line_then_a_summary_and_exits_1_on_a_refusal(runner, user, tmp_path):
    path = tmp_path / "keys.jsonl"
    path.write_bytes(jsonl(sha256_hex(made_secret()), '{"hash": 1}'))
    result = runner.invoke(args=["keys", "import", str(path), "--org", "alice", "--dry-run"])
    assert (result.exit_code, result.output) == (1, "line 1: ok\nline 2: refused: hash is required, a string.\n"
                                                    "1 of 2 lines would be imported, 1 refused.\n")
    assert imported_rows() == []
    path.write_bytes(jsonl(sha256_hex(made_secret())))
    result = runner.invoke(args=["keys", "import", str(path), "--org", "alice"])
    [row] = imported_rows()
    assert (result.exit_code, result.output) == (0, f"line 1: {row.key_id}\n1 of 1 line imported, 0 refused.\n")
    result = runner.invoke(args=["keys", "import", str(path), "--org", "nobody"])
    assert (result.exit_code, result.output) == (1, "Error: There is no organisation with the slug 'nobody'.\n")


def test_keys_scan_finds_the_starts_imports_declared_and_never_prints_the_secret(runner, org_id, tmp_path):
    secret, slow_secret = made_secret(), made_secret("rails_tok_")
    keyimports.import_keys(org_id, jsonl(sha256_hex(secret), bcrypt_line(slow_secret)))
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    (checkout / "config.env").write_text(f'TOKEN="{secret}"\nOTHER=acme_live_\nslow: {slow_secret}\n')
    result = runner.invoke(args=["keys", "scan", str(checkout)])
    assert result.exit_code == 1
    assert result.output == (f"{checkout}/config.env:1: acme_live_... an imported key's start\n"
                             f"{checkout}/config.env:3: {slow_secret[:14]}... an imported key's start\n")
    assert secret not in result.output and slow_secret not in result.output


def test_a_hash_another_import_took_meanwhile_refuses_its_line_and_the_batch_is_written_again(org_id, monkeypatch):
    taken, free = made_secret(), made_secret()
    keyimports.import_keys(org_id, jsonl(sha256_hex(taken)))
    monkeypatch.setattr(keyimports, "hashes_here", lambda key_hashes: set())  # as if it came after the look-up
    outcomes = keyimports.import_keys(org_id, jsonl(sha256_hex(free), sha256_hex(taken)))
    assert [outcome.refused for outcome in outcomes] == [None, keyimports.ALREADY_HERE]
    assert len(imported_rows()) == 2


def test_the_hash_of_a_secret_rolled_out_in_its_grace_is_refused_so_no_one_takes_its_holders(app, user, org_id):
    key, old_secret = keyactions.issue_key(user, "rolled", "production")
    keyactions.roll_key(key, grace=7 * 86400)
    mallory = users.create_user("mallory", "mallory@example.com", "correct horse battery")
    [outcome] = keyimports.import_keys(users.personal_organisation_id(mallory),
                                       jsonl(sha256_hex(old_secret, prefix="sk_")))
    assert outcome.refused is not None
    [outcome] = keyimports.import_keys(users.personal_organisation_id(mallory),
                                       jsonl(sha256_hex(old_secret, prefix="mal_")))
    assert outcome.refused == keyimports.ALREADY_HERE
    response = app.test_client().get("/api/v1/protected/test", headers={"X-API-Key": old_secret})
    assert response.json["api_key_name"] == "rolled"


def test_a_lookup_prefix_another_import_committed_since_the_file_was_read_is_seen_under_the_lock(org_id):
    taken = keyimports.TakenStarts()
    taken.read_new()
    first = made_secret("nestnestnest")
    keyimports.import_keys(org_id, jsonl({**bcrypt_line(first), "lookup_prefix": "nestnestnest"}))
    second = bcrypt_line("nestnestnest_X" + made_secret(""))
    outcomes = keyimports.write_batch(org_id, [(1, importlines.parsed(json.dumps(second)))], False,
                                      keyimports.ImportLog(org_id, None), taken)
    assert [outcome.refused for outcome in outcomes] == [
        "lookup_prefix equals, starts or is the start of another key's lookup prefix."]
