"""The registry of background services: started once, stopped in reverse order, every one of them."""

import logging

import pytest

from ops import services


class Service:
    """A service that notes its starts and closes in a shared journal."""

    def __init__(self, name, journal, fails_to_close=False):
        self.name = name
        self.journal = journal
        self.fails_to_close = fails_to_close

    def start(self):
        self.journal.append(("start", self.name))

    def close(self):
        self.journal.append(("close", self.name))
        if self.fails_to_close:
            raise RuntimeError(f"{self.name} would not close")


class StartsItself:
    """A service without start(): it starts on first use and is only stopped by the registry."""

    def __init__(self, journal):
        self.journal = journal

    def close(self):
        self.journal.append(("close", "lazy"))


def registry(journal, *names, failing=()):
    made = services.Services()
    for name in names:
        made.register(name, Service(name, journal, fails_to_close=name in failing))
    return made


def test_start_starts_each_service_once_in_the_order_registered():
    journal = []
    made = registry(journal, "usage", "lifecycle", "webhooks")
    made.start()
    made.start()
    assert journal == [("start", "usage"), ("start", "lifecycle"), ("start", "webhooks")]


def test_stop_closes_in_reverse_order():
    journal = []
    made = registry(journal, "usage", "lifecycle", "webhooks")
    made.start()
    journal.clear()
    made.stop()
    assert journal == [("close", "webhooks"), ("close", "lifecycle"), ("close", "usage")]


def test_stop_without_start_closes_every_service():
    """A process that never served (a command, an in-process test) still writes what its services hold."""
    journal = []
    made = registry(journal, "usage", "webhooks")
    made.stop()
    assert journal == [("close", "webhooks"), ("close", "usage")]


def test_a_failing_close_does_not_keep_the_others_open(caplog):
    journal = []
    made = registry(journal, "ratelimit", "usage", "lifecycle", "webhooks", failing={"webhooks", "usage"})
    with caplog.at_level(logging.ERROR, logger="ops.services"), pytest.raises(RuntimeError, match="webhooks"):
        made.stop()
    assert journal == [("close", "webhooks"), ("close", "lifecycle"), ("close", "usage"), ("close", "ratelimit")]
    # The first error is raised to the caller; a later one is logged, with its service's name.
    assert [record.getMessage() for record in caplog.records] == ["Could not stop the usage service."]
    assert "usage would not close" in caplog.text


def test_a_service_that_starts_itself_is_only_stopped():
    journal = []
    made = services.Services()
    made.register("usage", Service("usage", journal))
    made.register("ticker", StartsItself(journal))
    made.start()
    made.stop()
    assert journal == [("start", "usage"), ("close", "lazy"), ("close", "usage")]


def test_a_name_is_registered_once():
    made = services.Services()
    made.register("usage", StartsItself([]))
    with pytest.raises(ValueError, match="usage"):
        made.register("usage", StartsItself([]))
