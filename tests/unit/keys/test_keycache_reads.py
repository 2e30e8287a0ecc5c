"""The worker's cache of API keys under gevent: requests missing the same key at once share one
read, a failed shared read is tried again by each waiter, and a read begun before a rehash is never
shared with a request that saw the rehash (tests/unit/keys/test_keycache.py: the cache's signals)."""

import math

import gevent
import gevent.event
import pytest

import models
from keys import keycache


class FixedGeneration:
    confirmed_by_count = True

    def current(self, looks=None):
        return "g1"

    latest = current


@pytest.fixture
def slow_reads(monkeypatch):
    """Reads that take 10 ms under gevent, as PostgreSQL's would; the hashes read, in order."""
    monkeypatch.setattr(keycache, "greenlets_share_thread", lambda: True)
    read, failing = [], []

    def find(key_hash):
        read.append(key_hash)
        gevent.sleep(0.01)
        if failing:
            raise failing.pop()
        key = models.ApiKey(id=1, name="shared")
        key.usable_until = math.inf
        return key

    monkeypatch.setattr(keycache, "find_active_key", find)
    return read, failing


def test_requests_missing_the_same_key_at_once_share_one_read(slow_reads):
    read, _ = slow_reads
    cache = keycache.KeyCache(FixedGeneration(), first_use=None)
    finds = [gevent.spawn(cache.find, "h") for _ in range(50)]
    gevent.joinall(finds, raise_error=True)
    assert read == ["h"]
    assert {find.value[0].id for find in finds} == {1}
    assert {find.value[1] for find in finds} == {"g1"}
    assert cache.reading == {}


def test_a_failed_shared_read_is_tried_again_by_each_waiter(slow_reads):
    read, failing = slow_reads
    failing.append(models.OperationalError("the database went away"))
    cache = keycache.KeyCache(FixedGeneration(), first_use=None)
    finds = [gevent.spawn(cache.find, "h") for _ in range(5)]
    gevent.joinall(finds)
    assert isinstance(finds[0].exception, models.OperationalError)
    assert [find.value[0].id for find in finds[1:]] == [1] * 4
    assert len(read) == 5
    assert cache.reading == {}


class Admitting:
    settles = 0

    def admit(self, secret):
        return True


class RehashedWhileOpening:
    """A first use whose check ends with the key rehashed (by this worker or another): the rehash
    commits while `opening` is held, and reads begun before then find nothing."""

    def __init__(self):
        self.opening = gevent.event.Event()
        self.committed = False

    def opens(self, secret, forms, mark):
        self.opening.wait()
        self.committed = True
        return True


def test_a_request_that_saw_its_key_rehashed_shares_no_read_begun_before_the_rehash(monkeypatch):
    monkeypatch.setattr(keycache, "greenlets_share_thread", lambda: True)
    first_use = RehashedWhileOpening()
    reads = []

    def find(key_hash):
        committed, done = first_use.committed, gevent.event.Event()
        reads.append(done)
        done.wait()
        if not committed:
            return None
        key = models.ApiKey(id=1, name="rehashed")
        key.usable_until = math.inf
        return key

    monkeypatch.setattr(keycache, "find_active_key", find)
    cache = keycache.KeyCache(FixedGeneration(), first_use)
    cache.forms = Admitting()
    early = gevent.spawn(cache.find, "h", "secret")
    gevent.sleep(0)
    reads[0].set()  # the early request finds nothing and starts its check
    gevent.sleep(0)
    late = gevent.spawn(cache.find, "h", "secret")
    gevent.sleep(0)
    assert len(reads) == 2  # the late request's read is under way, begun before the rehash
    first_use.opening.set()
    while not (early.ready() and late.ready()):
        gevent.sleep(0)
        for done in reads:
            done.set()
    assert early.get()[0].id == 1 and late.get()[0].id == 1
    assert cache.reading == {}
