"""An attempt's deadline that holds with gevent or without: sockets whose every operation waits at
most the time left until it. gevent.Timeout cuts an attempt only where gevent has patched the
process; the CLI's `webhooks test` is not patched, and a per-operation timeout alone lets a
receiver that sends a byte every few seconds keep an attempt going for hours."""

import functools
import ssl
import time


class DeadlinePassed(TimeoutError):
    """The attempt's deadline has passed."""


class Deadline:
    """The moment by which an attempt is over, seconds from now."""

    def __init__(self, seconds):
        self.seconds = seconds
        self.at = time.monotonic() + seconds

    def left(self):
        """The seconds left; DeadlinePassed once there are none."""
        left = self.at - time.monotonic()
        if left <= 0:
            raise DeadlinePassed(f"No answer within {self.seconds} s.")
        return left

    def socket(self, base, *args):
        """A socket of class base (the standard library's or gevent's) bound by this deadline."""
        sock = bounded(base)(*args)
        sock.deadline = self
        return sock

    def ssl_context(self):
        """ssl.create_default_context(), its sockets bound by this deadline (the TLS handshake included)."""
        context = ssl.create_default_context()
        context.sslsocket_class = bounded(context.sslsocket_class)
        context.deadline = self
        return context


class BoundOperations:
    """Each blocking operation first sets the socket's timeout to the time left. A plain socket
    carries its deadline; a TLS socket, made inside wrap_socket (which also shakes hands), finds it
    on its context."""

    def wait_at_most_the_time_left(self):
        deadline = getattr(self, "deadline", None) or getattr(getattr(self, "context", None), "deadline", None)
        if deadline is not None:
            self.settimeout(deadline.left())

    def connect(self, *args):
        self.wait_at_most_the_time_left()
        return super().connect(*args)

    def do_handshake(self, *args):
        self.wait_at_most_the_time_left()
        return super().do_handshake(*args)

    def send(self, *args, **kwargs):
        self.wait_at_most_the_time_left()
        return super().send(*args, **kwargs)

    def sendall(self, *args, **kwargs):
        self.wait_at_most_the_time_left()
        return super().sendall(*args, **kwargs)

    def recv(self, *args, **kwargs):
        self.wait_at_most_the_time_left()
        return super().recv(*args, **kwargs)

    def recv_into(self, *args, **kwargs):
        self.wait_at_most_the_time_left()
        return super().recv_into(*args, **kwargs)


@functools.cache
def bounded(base):
    """base with BoundOperations: made on first use, since the socket classes differ once gevent
    has patched the process."""
    return type(f"Bounded{base.__name__}", (BoundOperations, base), {})
