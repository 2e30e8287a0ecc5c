"""The one way bytes are written to a WebSocket client's socket (see ws/wsserver.py): in order,
without ever blocking the writer, and at most a limit of them held for a slow client."""

import collections
import functools

import gevent
import gevent.event
import gevent.socket

# What a queued entry costs besides its bytes (the bytes object's header and the deque's slot).
ENTRY_OVERHEAD = 64
# The queue while nothing waits: an empty deque takes 0.7 KiB, and nearly every socket's is empty.
NOTHING_PENDING = ()


class OutputFull(Exception):
    """The client is a limit of bytes behind: it has stopped reading."""


class Outbox:
    """The one way bytes are written to a client's socket, in order, without ever blocking."""

    # One per open socket, and a worker holds thousands: slots rather than a dict each.
    __slots__ = ("raw", "plain", "send_now", "limit", "stall_timeout", "on_stall", "pending", "pending_bytes",
                 "room", "flusher", "sealed", "closing", "closed", "ready")

    def __init__(self, raw, limit, stall_timeout, on_stall):
        self.raw = raw
        # The real, non-blocking socket's send, which gevent's own would call in the end: the
        # ticker writes to thousands of sockets a second. Not under TLS (gunicorn's
        # --certfile), where the bytes must go through the SSL object.
        self.plain = type(raw) is gevent.socket.socket
        if self.plain:
            self.send_now = raw._sock.send
        else:
            self.send_now = functools.partial(send_tls_now, raw)
        self.limit = limit
        self.stall_timeout = stall_timeout
        self.on_stall = on_stall
        self.pending = NOTHING_PENDING
        self.pending_bytes = 0
        self.room = gevent.event.Event()
        self.flusher = None
        self.sealed = False
        self.closing = False
        self.closed = False
        # Nothing queued and not sealed, closing or closed: a frame goes straight to the kernel.
        # One field for the four, read for each of a tick's 10,000 sockets.
        self.ready = True

    def send(self, data, limited=False):
        """Write data now if the kernel takes it, else queue it; never waits. A connection that
        has failed is closed and BrokenPipeError raised. limited (the ticker's way): raise
        OutputFull rather than queue data past the limit (alone, a frame goes out as
        wait_for_room lets it)."""
        # send_to_each writes as this does, to many outboxes in one loop: change both together.
        if not self.ready:
            self._send_later(data, limited)
            return
        try:
            sent = self.send_now(data)
        except BlockingIOError:
            sent = 0
        except OSError as error:
            self.abort()
            raise BrokenPipeError("The connection failed.") from error
        if sent < len(data):
            # A view marks the rest of a frame the kernel took only part of.
            self._queue(memoryview(data)[sent:] if sent else data)

    def _send_later(self, data, limited):
        if self.closed or self.closing or self.sealed:
            # Its close frame is queued or sent: nothing goes after it.
            raise BrokenPipeError("The socket is closed.")
        if limited and not self.fits(len(data)):
            raise OutputFull
        self._queue(data)

    def seal(self):
        """Take nothing more, as after a close frame; what is queued still goes out, and the
        socket stays open for the client's close reply."""
        self.sealed = True
        self.ready = False

    def fits(self, size):
        return self.pending_bytes + size + ENTRY_OVERHEAD <= self.limit

    def wait_for_room(self, size):
        """Wait until size more bytes fit under the limit (or nothing is pending); False once
        the socket is closed."""
        while self.pending and not self.fits(size) and not self.closed:
            self.room.clear()
            self.room.wait()
        return not self.closed

    def close(self):
        """Close the socket once what is queued has been written (or has stalled)."""
        self.closing = True
        self.ready = False
        if not self.pending:
            self.abort()

    def abort(self, last_words=b""):
        """Drop what is queued, try last_words without waiting, close the socket, free memory."""
        mid_frame = bool(self.pending) and isinstance(self.pending[0], memoryview)
        self.pending = NOTHING_PENDING
        self.pending_bytes = 0
        if last_words and not mid_frame and not self.closed:
            try:
                self.send_now(last_words)
            except OSError:
                pass
        self.closed = True
        self.ready = False
        self.room.set()
        self.raw.close()

    def _queue(self, data):
        if not self.pending:
            self.pending = collections.deque()
            self.ready = False
        self.pending.append(data)
        # Counted with what an entry costs besides its bytes, so that many tiny frames (pongs)
        # cannot hold many times the limit.
        self.pending_bytes += len(data) + ENTRY_OVERHEAD
        if self.flusher is None:
            self.flusher = gevent.spawn(self._flush)

    def _flush(self):
        try:
            while self.pending and not self.closed:
                with gevent.Timeout(self.stall_timeout):
                    sent = self.raw.send(self.pending[0])
                # gevent closes a socket in a callback of its loop: the send can still succeed
                # after abort() has dropped the queue, whose bytes are then gone.
                if self.closed:
                    break
                self._sent(sent)
        except gevent.Timeout:
            self.on_stall()
        except OSError:
            self.abort()
        finally:
            self.flusher = None
        if self.closing:
            self.abort()

    def _sent(self, count):
        head = self.pending[0]
        if count < len(head):
            self.pending[0] = memoryview(head)[count:]
            self.pending_bytes -= count
        else:
            self.pending.popleft()
            self.pending_bytes -= count + ENTRY_OVERHEAD
            if not self.pending:
                self.pending = NOTHING_PENDING
                self.ready = not (self.sealed or self.closing or self.closed)
        self.room.set()


def send_to_each(outboxes, data):
    """Send data to each outbox as `send(data, limited=True)` would; return the (outbox, error) of
    each that refused it. The ticker's way to write one frame to 10,000 sockets a second: written
    out here in one loop, because a call per socket was half the Python of a tick (callgrind: 1,400
    instructions a socket over a bare send, 530 in this loop; docs/bench/time-sockets.md)."""
    refused = []
    size = len(data)
    for outbox in outboxes:
        try:
            if not outbox.ready:
                outbox._send_later(data, True)
                continue
            try:
                sent = outbox.send_now(data)
            except BlockingIOError:
                sent = 0
            except OSError as error:
                outbox.abort()
                raise BrokenPipeError("The connection failed.") from error
            if sent != size:
                outbox._queue(memoryview(data)[sent:] if sent else data)
        except Exception as error:
            refused.append((outbox, error))
    return refused


def send_tls_now(raw, data):
    """Write data through a TLS socket if it takes it now; else 0 bytes. gevent's SSLSocket.send
    waits for the client whenever the socket's own timeout is not 0, whatever timeout it is given."""
    timeout = raw.gettimeout()
    raw.settimeout(0.0)
    try:
        return raw.send(data)
    finally:
        raw.settimeout(timeout)
