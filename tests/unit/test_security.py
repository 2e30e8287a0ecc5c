"""Findings of SECURITY.md that tests can hold: secrets at rest, password hashing, cache headers."""

import math
import os
import secrets
import stat
import threading
import time

import pytest

from app import instance_secret_key
from keys import keyformat
from models import ApiKey, User


def test_key_secrets_carry_over_190_bits_from_a_csprng():
    assert keyformat.RANDOM_LENGTH * math.log2(len(keyformat.KEY_ALPHABET)) > 190


def test_the_database_holds_no_secret_a_reader_could_use(user, api_key):
    row = ApiKey.select().dicts().get()
    assert api_key not in map(str, row.values())
    assert row["key_hash"] == keyformat.hash_key(api_key)
    assert len(api_key) - len(row["display_prefix"]) >= 32
    stored = User.get_by_id(user.id).password_hash
    assert stored.startswith("scrypt:") and "correct horse battery" not in stored


def test_session_secret_file_is_private(monkeypatch, tmp_path):
    monkeypatch.setattr("app.INSTANCE", tmp_path)
    instance_secret_key()
    assert stat.S_IMODE(os.stat(tmp_path / "secret_key").st_mode) == 0o600


def test_workers_that_start_together_share_one_whole_session_secret(monkeypatch, tmp_path):
    monkeypatch.setattr("app.INSTANCE", tmp_path)
    token_hex = secrets.token_hex

    def slow_token_hex():
        # A worker between making its secret and writing it, as under load.
        time.sleep(0.05)
        return token_hex()

    monkeypatch.setattr(secrets, "token_hex", slow_token_hex)
    start = threading.Barrier(4)
    keys = []

    def worker():
        start.wait()
        keys.append(instance_secret_key())

    workers = [threading.Thread(target=worker) for _ in range(4)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    assert len(keys) == 4 and len(set(keys)) == 1 and len(keys[0]) == 64
    assert [path.name for path in tmp_path.iterdir()] == ["secret_key"]


@pytest.mark.parametrize("path, keyed", [
    ("/api/v1/user/me", True), ("/api/v1/usage/stats", True), ("/api/v1/user/me", False), ("/api/v1/status", True),
])
def test_api_responses_are_never_cached_or_sniffed(client, api_key, path, keyed):
    response = client.get(path, headers={"X-API-Key": api_key} if keyed else {})
    assert response.headers["Cache-Control"] == "no-store"
    assert response.headers["X-Content-Type-Options"] == "nosniff"
