"""A stand-in for the `time` module that one module under test sees, with a clock the test moves.
It replaces that module's own name `time`, never the standard module's attributes: a thread that
outlives its test (limits' sweep timer, the usage flusher) keeps the real clock and the real sleep."""

import time


class FakeTime:
    """time() reads the test's clock; everything else is the real time module's."""

    def __init__(self, start=1_000_000.0):
        self.now = start

    def time(self):
        return self.now

    def __getattr__(self, name):
        return getattr(time, name)


def fake_time(monkeypatch, *modules, start=1_000_000.0):
    """Give each module (a dotted name) one FakeTime under its name `time`; return it."""
    clock = FakeTime(start)
    for module in modules:
        monkeypatch.setattr(f"{module}.time", clock)
    return clock


def clear_of_the_hour(seconds):
    """Return once the next `seconds` all fall within one UTC hour, sleeping past the turn of the hour
    when it is nearer: for a live test whose requests must land in the hour (and day) it then reads,
    as a server's clock cannot be faked."""
    left = 3600 - time.time() % 3600
    if left < seconds:
        time.sleep(left + 0.5)
