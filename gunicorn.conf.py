"""gunicorn settings for both run modes. gunicorn reads this before the app exists, so it reads
its own environment (PORT, WEB_CONCURRENCY)."""

import logging
import os
import re

from gunicorn.glogging import Logger

bind = f"0.0.0.0:{os.environ.get('PORT') or 5000}"
workers = int(os.environ.get("WEB_CONCURRENCY") or 1)
worker_class = "gevent"
# The default of 1,000 would silently cap open connections (and sockets) per worker.
worker_connections = 10_000
# Never preload: it imports the app before gevent patches threading, and peewee's
# per-thread state would then be shared by every greenlet.
preload_app = False
# A second instance would take over the control socket's path.
control_socket_disable = True
# Below the 30 s most platforms wait between SIGTERM and SIGKILL.
graceful_timeout = 20
keepalive = 5
accesslog = "-"
# %(U)s is the path without the query string, which may carry the time socket's api_key.
access_log_format = '%(h)s "%(m)s %(U)s %(H)s" %(s)s %(b)s %(M)sms'

SECRET = re.compile(r"(api_key=)[^&\s']*|(sk_(?:live|test)_)[A-Za-z0-9]+")


class RedactSecrets(logging.Filter):
    """Replace API keys and api_key values in a log record's message with [redacted]."""

    def filter(self, record):
        record.msg = SECRET.sub(lambda match: (match[1] or match[2]) + "[redacted]", record.getMessage())
        record.args = ()
        return True


class RedactingLogger(Logger):
    """gunicorn's logger, minus secrets: for a request it cannot parse, gunicorn logs the whole
    request line, query string and all."""

    redact = RedactSecrets()

    def setup(self, cfg):
        super().setup(cfg)
        self.error_log.addFilter(self.redact)


logger_class = RedactingLogger


def post_worker_init(worker):
    """Make SIGTERM and SIGINT close every open WebSocket with 1001 before the worker stops;
    gunicorn on its own would cut them after graceful_timeout with no close frame."""
    import signal

    import gevent

    from sockets import close_all_sockets

    def chain(previous):
        def handler(signum, frame):
            # A signal handler may run in gevent's hub, which must not block: close in a greenlet.
            gevent.spawn(close_all_sockets)
            previous(signum, frame)

        return handler

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT):
        signal.signal(signum, chain(signal.getsignal(signum)))
    signal.siginterrupt(signal.SIGTERM, False)


def worker_exit(server, worker):
    """Write the usage counts still held in memory before the worker goes."""
    app = getattr(worker, "wsgi", None)
    if app is not None:
        app.extensions["usage"].close()
