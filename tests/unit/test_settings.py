"""settings/'s webhook settings: the retry schedule's durations, a bad one refused in one
sentence, and WEBHOOK_ALLOW_PRIVATE a switch."""


import pytest

import settings


def test_the_retry_schedule_parses_durations():
    assert settings.retry_schedule(settings.DEFAULT_RETRY_SCHEDULE) == [5, 300, 1800, 7200, 18000, 36000, 36000]
    assert settings.retry_schedule(" 1s, 2m,3h ,1d") == [1, 120, 10800, 86400]


@pytest.mark.parametrize("text", ["", "5", "0s", "1x", "1s,,2s", "-1s", ",".join(["1s"] * 21)])
def test_a_bad_retry_schedule_is_one_sentence(text):
    with pytest.raises(settings.ConfigError, match="WEBHOOK_RETRY_SCHEDULE must be"):
        settings.retry_schedule(text)


def test_allow_private_is_a_switch():
    assert settings.switch({"WEBHOOK_ALLOW_PRIVATE": "1"}, "WEBHOOK_ALLOW_PRIVATE") is True
    assert settings.switch({}, "WEBHOOK_ALLOW_PRIVATE") is False
    with pytest.raises(settings.ConfigError, match="WEBHOOK_ALLOW_PRIVATE must be 1 or 0"):
        settings.switch({"WEBHOOK_ALLOW_PRIVATE": "maybe"}, "WEBHOOK_ALLOW_PRIVATE")
