"""Fixtures of the key tests: the key cache's reads from the database, counted."""

import pytest

from keys import keycache


@pytest.fixture
def lookups(monkeypatch):
    """The hashes the key cache reads from the database, in order."""
    read = []
    find = keycache.find_active_key

    def counting_find(key_hash):
        read.append(key_hash)
        return find(key_hash)

    monkeypatch.setattr(keycache, "find_active_key", counting_find)
    return read
