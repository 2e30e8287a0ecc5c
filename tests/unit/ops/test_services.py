"""The registry of background services: started once, stopped in reverse order, every one of them."""

import logging

import pytest

from app import close_app
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


@pytest.fixture
def sqlite_app(make_app, tmp_path):
    return make_app({"DATABASE_URL": f"sqlite:///{tmp_path}/services.db", "RATELIMIT_STORAGE_URL": "memory://"})


def test_create_app_registers_every_background_service_in_order(sqlite_app):
    """Stopped in reverse: the mail sender first, the limit storage last."""
    registered = sqlite_app.extensions["services"].services
    assert list(registered) == ["ratelimit", "usage", "lifecycle", "ticker", "webhooks", "mail"]
    assert [registered[name] for name in registered] == [sqlite_app.extensions[name] for name in registered]


def test_services_start_only_when_asked_and_stop_with_the_app(sqlite_app):
    """In-process (no server) nothing runs in the background; a started app's threads end with close_app."""
    app = sqlite_app
    assert app.extensions["usage"].flusher is None and app.extensions["lifecycle"].thread is None
    services.start(app)
    flusher, pruner = app.extensions["usage"].flusher, app.extensions["lifecycle"].thread
    assert flusher.is_alive() and pruner.is_alive()
    close_app(app)
    flusher.join(timeout=5)
    pruner.join(timeout=5)
    assert not flusher.is_alive() and not pruner.is_alive()
