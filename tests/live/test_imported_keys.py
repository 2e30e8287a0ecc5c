"""Keys imported by their hash, on real servers: two instances (the Procfile's gunicorn, two workers
each) sharing one database and one Redis, on SQLite and on PostgreSQL. A key of each scheme,
imported through the CLI, answers 200 on both instances from the next request; a bcrypt key used
for the first time by many requests at once on both is rehashed exactly once; a GitHub report
revokes an imported SHA-256 key on both; no secret reaches a log."""

import concurrent.futures
import re

import pytest
import requests
import services
from githubscanning import PATH, Signer, report, serving_keys
from importfiles import argon2id_line, bcrypt_line, jsonl, made_secret, sha256_base64, sha256_hex
from liveserver import PASSWORD, cli, service_env, serving

SIGNER = Signer("d" * 64)
REHASHED = re.compile(r"Imported key (\d+) rehashed to SHA-256 on its first use\.")


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def pair(request, tmp_path_factory):
    """(a, b, env): two instances on one database of each kind and one Redis, alice's organisation made."""
    tmp_path = tmp_path_factory.mktemp("imported")
    with serving_keys(SIGNER) as keys:
        env = service_env(tmp_path, request.param, RATELIMIT_STORAGE_URL=services.redis_url(),
                          GITHUB_SECRET_SCANNING="on", GITHUB_SECRET_SCANNING_KEYS_URL=keys.url)
        cli(env, "users", "create", "alice", "--email", "alice@example.com", "--password-stdin", stdin=PASSWORD)
        with (serving(tmp_path_factory.mktemp("a"), env) as a, serving(tmp_path_factory.mktemp("b"), env) as b):
            yield a, b, env
    output = a.output() + b.output()
    assert "Traceback" not in output


def import_lines(env, tmp_path, *lines):
    path = tmp_path / "keys.jsonl"
    path.write_bytes(jsonl(*lines))
    printed = cli(env, "keys", "import", str(path), "--org", "alice")
    return [int(line.split(": ")[1]) for line in printed.splitlines()[:-1]]


def status(server, secret):
    return requests.get(server.base + "/api/v1/protected/test", headers={"X-API-Key": secret}, timeout=30).status_code


def test_a_key_of_each_scheme_answers_on_both_instances_from_the_next_request(pair, tmp_path):
    a, b, env = pair
    secrets = [made_secret(), made_secret(), made_secret("rails_tok_"), made_secret("argon_tok_")]
    import_lines(env, tmp_path, sha256_hex(secrets[0]), sha256_base64(secrets[1]), bcrypt_line(secrets[2]),
                 argon2id_line(secrets[3]))
    for secret in secrets:
        assert [status(a, secret), status(b, secret), status(a, secret)] == [200, 200, 200]
    assert status(b, made_secret("rails_tok_")) == 401
    output = a.output() + b.output()
    assert not [secret for secret in secrets if secret in output or secret[10:] in output]


@pytest.mark.parametrize("round_", range(3))
def test_a_bcrypt_key_used_at_once_on_both_instances_is_rehashed_exactly_once(pair, tmp_path, round_):
    """Each of the 16 first requests, made at once on both instances, answered 200: none finds the
    key's start unread, its lookup prefix over its allowance, or its hash gone."""
    a, b, env = pair
    secret = made_secret("rails_tok_")
    [key_id] = import_lines(env, tmp_path, bcrypt_line(secret))
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(status, [a, b] * 8, [secret] * 16))
    assert answers == [200] * 16
    rehashed = [int(found) for found in REHASHED.findall(a.output() + b.output())]
    assert rehashed.count(key_id) == 1
    [(slow_hash, key_hash)] = services.rows(
        env["DATABASE_URL"], f"SELECT i.slow_hash, k.key_hash FROM imported_keys i JOIN api_keys k ON k.id = i.key_id "
                             f"WHERE k.id = {key_id}")
    assert slow_hash is None and len(key_hash) == 64


def test_a_github_report_revokes_an_imported_sha256_key_on_both_instances(pair, tmp_path):
    a, b, env = pair
    secret = made_secret()
    import_lines(env, tmp_path, sha256_hex(secret))
    assert status(b, secret) == 200
    body = report(secret)
    response = requests.post(a.base + PATH, data=body, headers=SIGNER.headers(body), timeout=30)
    assert [entry["label"] for entry in response.json()] == ["true_positive"]
    assert [status(a, secret), status(b, secret)] == [401, 401]
