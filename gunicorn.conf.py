"""gunicorn settings for both run modes. gunicorn reads this before the app exists, so it reads
its own environment (PORT, WEB_CONCURRENCY)."""

import os

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
