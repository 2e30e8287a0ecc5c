"""What a server does with a request body the app did not read before it closes the connection."""

import gevent

LINGER_SECONDS = 1.0
LINGER_BYTES = 1 << 20


def linger(body):
    """Read and drop what the client still sends, for a moment and up to a bound: closing on unread
    data makes the kernel answer with a reset, which can destroy the response (a 413) before the
    client reads it. nginx's lingering close. Both servers call it: gunicorn.conf.py and serving/devserver.py."""
    drained = 0
    with gevent.Timeout(LINGER_SECONDS, False):
        try:
            while drained < LINGER_BYTES and (data := body.read(8192)):
                drained += len(data)
        except Exception:
            pass  # a body that cannot be parsed ends the lingering: the connection closes anyway
