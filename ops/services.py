"""An app's background services (usage flusher, pruner, webhook sender, ticker), started and stopped in one place."""

import logging

log = logging.getLogger(__name__)


class Services:
    """Named services in the order they were registered. Each has close(), and start() unless it
    starts itself on first use (then it is only stopped here)."""

    def __init__(self):
        self.services = {}
        self.started = False

    def register(self, name, service):
        if name in self.services:
            raise ValueError(f"A service named {name!r} is already registered.")
        self.services[name] = service

    def start(self):
        """Start every service, in the order registered; a second call does nothing."""
        if self.started:
            return
        self.started = True
        for service in self.services.values():
            start = getattr(service, "start", None)
            if start is not None:
                start()

    def stop(self):
        """Close every service, started or not (a close also finishes work held for it, such as the
        pending usage counts), in reverse order; each is closed even when one before it raised.
        Raise the first error once all are closed; the others are logged."""
        first_error = None
        for name, service in reversed(self.services.items()):
            try:
                service.close()
            except Exception as error:
                if first_error is None:
                    first_error = error
                else:
                    log.exception("Could not stop the %s service.", name)
        if first_error is not None:
            raise first_error


def init_app(app):
    """Give the app its registry: first of all, so that every room's init_app can register."""
    app.extensions["services"] = Services()


def register(app, name, service):
    """Add a service of the app, to be started and stopped with the others."""
    app.extensions["services"].register(name, service)


def start(app):
    """Start the app's services once the process serves (idempotent)."""
    app.extensions["services"].start()


def stop(app):
    """Stop the app's services, in reverse order: no thread of theirs outlives this call."""
    app.extensions["services"].stop()
