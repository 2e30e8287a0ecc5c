"""The key generation in Redis (store/rediswindows.py): a count under the current generation counts,
one under another counts nothing and says the keys changed, another process's announcement reaches
the next count, and a generation lost with Redis's data comes back as a new one."""

import pytest
import redis
import services
from limits import RateLimitItemPerHour
from limits.storage import storage_from_string

import ratelimit
from store import rediswindows


@pytest.fixture
def windows():
    storage = storage_from_string(services.redis_url(), wrap_exceptions=True)
    return rediswindows.RedisWindows(storage)


def test_a_count_under_the_current_generation_counts(windows):
    windows.hit("w", 60)
    assert windows.hit("w", 60, windows.generation)[0] == 2


def test_a_count_under_another_generation_counts_nothing(windows):
    windows.hit("w", 60)
    stale = windows.generation
    windows.announce_key_change()
    with pytest.raises(rediswindows.KeysChanged):
        windows.hit("w", 60, stale)
    assert windows.hit("w", 60)[0] == 2  # only the first and this one were counted
    assert windows.generation != stale


def test_another_process_s_announcement_reaches_the_next_count(windows):
    windows.hit("w", 60)
    seen = windows.generation
    other = rediswindows.RedisWindows(storage_from_string(services.redis_database(), wrap_exceptions=True))
    other.announce_key_change()
    with pytest.raises(rediswindows.KeysChanged):
        windows.hit("w", 60, seen)
    assert windows.generation == other.generation


def test_a_generation_lost_with_redis_s_data_comes_back_as_a_new_one(windows):
    # A flushed or restarted Redis must not hand out a generation a process saw before.
    windows.hit("w", 60)
    first = windows.generation
    redis.Redis.from_url(services.redis_database()).flushdb()
    with pytest.raises(rediswindows.KeysChanged):
        windows.hit("w", 60, first)
    assert windows.generation not in ("", first)


def test_no_generation_is_assumed_before_the_first_reply(windows):
    with pytest.raises(rediswindows.KeysChanged):
        windows.hit("w", 60, windows.generation)


def test_windows_of_other_identities_count_whatever_the_generation(windows):
    limiter = ratelimit.Limiter(windows.storage, {}, None)
    limiter.windows.announce_key_change()
    assert limiter.hit(RateLimitItemPerHour(5), "ip:1.2.3.4", "public").remaining == 4
