"""simple-websocket's server made safe against hostile clients, under gunicorn's gevent worker.

simple-websocket 1.1 reads a client's frames into an unbounded list whether or not the handler
takes them, and writes to the socket from whichever greenlet has something to say (the handler,
the ticker, its reader answering pings). One client that sends without reading could fill the
worker's memory, and two greenlets waiting to write on one gevent socket raise
ConcurrentObjectUseError. This adapter reaches into the library (its reader loop `_thread`,
`_handle_events`, `input_buffer`, `sock`, `ws`, `environ`), into wsproto (the `WSConnection`'s
`handshake`, let go once the connection is made; its frame and message decoders' state, read to
hand whole text frames to ws/frames.py) and into gevent (the real socket `_sock`, a
TLS socket's send returning 0 rather than waiting only while its own timeout is 0, the wait for
readable bytes `_wait(_read_event)`);
tests/unit/ws/test_wsserver.py fails if a new version moves any of it.

- Every write goes through one Outbox per socket (ws/outbox.py): written at once when the kernel
  takes it, else queued and written by that socket's own flusher greenlet. Nothing waits on a
  client but the handler that talks to it.
- At most OUTPUT_LIMIT bytes wait to be sent; a client that takes nothing for `send_timeout`
  seconds is cut off (a 1008 close frame if the kernel still takes one) and its memory freed.
- The reader reads the next bytes only while the handler has at most one message it has not
  taken (else it waits until the handler has taken them all), and only while less than half of
  OUTPUT_LIMIT waits to go out (pongs): a client that sends faster than it reads is slowed down
  by TCP itself.
"""

import functools
import random
import threading
import time

import gevent
import gevent.event
import simple_websocket
from wsproto import ConnectionState
from wsproto.events import AcceptConnection, CloseConnection, Message, Ping
from wsproto.frame_protocol import FrameProtocol
from wsproto.utilities import LocalProtocolError

from ops import logs, note as request_note
from ws.frames import whole_texts
from ws.outbox import Outbox
from ws.pinger import PINGER

OUTPUT_LIMIT = 1024 * 1024
LINGER_SECONDS = 1.0
LINGER_PARSE_BYTES = 256 * 1024
POLICY_VIOLATION = 1008
YIELD_EVERY_READS = 16


# Frames a server sends are the same bytes on every connection, as no extension is ever agreed
# (see Server): the ticker frames each second's message once instead of once per socket, which
# was 38 % of its time. wsproto frames it, as it would on each connection.
_FRAMER = FrameProtocol(client=False, extensions=[])


def text_frame(text):
    """Return a whole text message framed as this server sends it on any of its connections."""
    return _FRAMER.send_data(text, fin=True)


class FinishedHandshake:
    """What wsproto's WSConnection asks of its handshake once the connection is made: its events,
    of which there are no more."""

    def events(self):
        return iter(())


FINISHED_HANDSHAKE = FinishedHandshake()


class Reader:
    """The library's reader thread, started only by the handler's first receive() (or once the
    handler has returned, to read the client's close reply). A handler that never receives reads
    in its own greenlet instead (read_until_closed), which saves a greenlet, ~10 KiB a socket."""

    def __init__(self, thread_class, target):
        self.thread_class = thread_class
        self.target = target
        self.name = "simple_websocket.Base._thread"
        self.started = False
        self.thread = None

    def start(self):
        """The library's call at the end of its __init__: deferred to start_now."""

    def start_now(self):
        if not self.started:
            self.started = True
            self.thread = self.thread_class(target=self.target)
            self.thread.start()

    def run_here(self):
        self.started = True
        self.target()

    def join(self, timeout=None):
        self.start_now()
        if self.thread is not None:
            self.thread.join(timeout)


class Server(simple_websocket.Server):
    """simple-websocket's server with bounded input and output, one writer per socket, no
    permessage-deflate, and close codes that reach the client."""

    def __init__(self, environ, send_timeout=30, **options):
        # The handshake is answered from these environ keys: without the client's offer no
        # extension is agreed, which saves ~100 KiB of compression state per socket.
        environ.pop("HTTP_SEC_WEBSOCKET_EXTENSIONS", None)
        self.send_timeout = send_timeout
        self.input_taken = gevent.event.Event()
        self.closed_by_server = False
        self.dropping_input = False
        self.close_timer = None
        options["thread_class"] = functools.partial(Reader, options.get("thread_class") or threading.Thread)
        super().__init__(environ, **options)

    def handshake(self):
        self.raw = self.sock
        self.raw.settimeout(None)
        self.sock = self.outbox = Outbox(self.raw, OUTPUT_LIMIT, self.send_timeout, self.give_up)
        self._accept()
        if self.ws.connection is not None:
            # wsproto keeps the handshake (its HTTP parser and an empty event queue, ~2.5 KiB)
            # for the socket's life, only to ask it for events it no longer makes.
            self.ws.handshake = FINISHED_HANDSHAKE

    def _accept(self):
        note = request_note.of(self.environ)
        if note is None:
            super().handshake()
            return
        # The library's _handle_events answers with wsproto's AcceptConnection and no headers of
        # ours: add the request id to that one event on its way out.
        send = self.ws.send

        def send_with_request_id(event):
            if isinstance(event, AcceptConnection):
                event.extra_headers.append((logs.REQUEST_ID_HEADER.encode(), note.request_id.encode()))
            return send(event)

        self.ws.send = send_with_request_id
        try:
            super().handshake()
        finally:
            del self.ws.send

    def send(self, data):
        """Send a message, waiting while the client is OUTPUT_LIMIT behind (the handlers' way)."""
        frame = self._frame(data)
        self.outbox.wait_for_room(len(frame))
        if not self.connected:
            # A close went out while this waited; nothing may follow it.
            raise simple_websocket.ConnectionClosed(self.close_reason, self.close_message)
        self.outbox.send(frame)

    def _frame(self, data):
        if not self.connected:
            raise simple_websocket.ConnectionClosed(self.close_reason, self.close_message)
        if isinstance(data, bytes):
            return self.ws.send(Message(data=data))
        # As wsproto's connection would frame it, without its per-message event dispatch.
        return _FRAMER.send_data(str(data), fin=True)

    def receive(self, timeout=None):
        if not self.thread.started:
            self.thread.start_now()
        message = super().receive(timeout)
        if not self.input_buffer:
            self.input_taken.set()
        return message

    def close(self, reason=None, message=None):
        # flask-sock calls this when the handler returns, even after a failed close: either
        # way the reader stops waiting for the handler and reads only the close reply.
        self.closed_by_server = True
        try:
            super().close(reason, message)
        finally:
            # Frames the ticker wrote straight to the outbox would follow the close frame.
            self.outbox.seal()
            self.input_taken.set()
        # Our close frame is out: a client that never answers it is not waited on for longer.
        self.close_timer = gevent.spawn_later(LINGER_SECONDS, self.outbox.close)

    def read_until_closed(self):
        """Read in the calling greenlet until the socket closes, dropping every message the client
        sends: a handler that only sends needs no reader greenlet of its own."""
        self.dropping_input = True
        self.thread.run_here()

    def give_up(self):
        """Cut off a client that has taken nothing for send_timeout seconds."""
        if not self.outbox.closed:
            try:
                last_words = self.ws.send(CloseConnection(POLICY_VIOLATION, "The client stopped reading."))
            except LocalProtocolError:
                last_words = b""
            self.outbox.abort(last_words)
        self.connected = False
        self.event.set()
        self.input_taken.set()

    def _thread(self):
        # Pings are the Pinger's: a timer armed on every read cost the echo a tenth of its time.
        # The first comes at a random point of the second half of the interval, so that sockets
        # opened together (clients reconnecting after a restart) are not all pinged in one sweep,
        # whose pongs would wake all their readers at once.
        self.next_ping = None
        if self.ping_interval:
            self.next_ping = time.monotonic() + self.ping_interval * random.uniform(0.5, 1.0)
        self.held_back = False
        reads = 0
        drained = False
        # After a read shorter than asked for, which emptied the kernel's buffer, gevent's recv
        # would first fail (EAGAIN: a system call and an exception a message, as many as the
        # reads) and only then wait: wait for the client's next bytes first. Not under TLS,
        # whose object may hold bytes it has already read.
        plain = self.outbox.plain
        if self.next_ping is not None:
            PINGER.watch(self)
        try:
            while self.connected:
                # Backpressure: nothing more is read while the handler has messages to take or
                # the client has not taken our answers, so TCP slows the client down. One message
                # may wait: the reader goes on to its next read while the handler takes it, where
                # waiting for that cost the echo a greenlet switch a message.
                if ((len(self.input_buffer) > 1 and not self.closed_by_server)
                        or not self.outbox.fits(self.outbox.limit // 2)):
                    if not self._hold_back() or not self.connected:
                        break
                # Read afresh: another greenlet may have closed the socket meanwhile (which drops
                # the watcher; a wait on it would never end), and recv then raises.
                if drained and plain and self.raw._read_event is not None:
                    self.raw._wait(self.raw._read_event)
                data = self.raw.recv(self.receive_bytes)
                if not data:
                    break
                drained = len(data) < self.receive_bytes
                self._take_read(data)
                if not self.connected:
                    # A close frame has gone out (the answer to the client's, or ours to a message
                    # too big): nothing may follow it.
                    self.outbox.seal()
                if self.dropping_input:
                    self.input_buffer.clear()
                # gevent's recv returns without yielding while data waits, so a flooding client
                # could hold the worker's only thread. A full read means more is likely waiting;
                # a yield on every read would cost the echo a quarter of its round trips.
                reads += 1
                if len(data) == self.receive_bytes or reads % YIELD_EVERY_READS == 0:
                    gevent.sleep(0)
            self._linger()
        except (OSError, LocalProtocolError, simple_websocket.ConnectionClosed):
            pass
        finally:
            PINGER.forget(self)
            self.connected = False
            self.event.set()
            self.outbox.close()
            if self.close_timer is not None:
                self.close_timer.kill(block=False)

    def _take_read(self, data):
        """Parse a read into input_buffer: by ws/frames.py when it is whole text frames read between
        frames, else by wsproto and the library, which also answer pings and closes."""
        texts = whole_texts(data, self.max_message_size or OUTPUT_LIMIT) if self._between_messages() else None
        if texts is None:
            self.ws.receive_data(data)
            self.connected = self._handle_events() and self.connected
        else:
            self.input_buffer += texts
            self.event.set()

    def _between_messages(self):
        """Whether wsproto holds nothing of a frame or message not yet whole (nor then does the
        library, which assembles the messages wsproto gives it), and the connection is open: a read
        of whole text frames then changes nothing in wsproto, and ws/frames.py may parse it instead."""
        protocol = self.ws.connection._proto
        frames = protocol._frame_decoder
        return (frames.header is None and not frames.buffer.buffer and protocol._message_decoder.opcode is None
                and self.ws.connection.state is ConnectionState.OPEN)

    def _hold_back(self):
        """Wait until the handler has taken every message and the client our answers; False
        once the socket is closed."""
        self.held_back = True
        waited_since = time.monotonic()
        try:
            while self.input_buffer and self.connected and not self.closed_by_server:
                self.input_taken.clear()
                self.input_taken.wait()
            return self.outbox.wait_for_room(self.outbox.limit // 2)
        finally:
            self.held_back = False
            if self.next_ping is not None:
                # Time spent holding the client back is not time it failed to answer a ping.
                self.next_ping += time.monotonic() - waited_since

    def ping_or_give_up(self):
        """The Pinger's call once ping_interval has passed: ping, or close with 1008 a client
        that has not answered the last ping."""
        if not self.connected:
            return
        if not self.pong_received:
            try:
                self.close(POLICY_VIOLATION, "Ping/Pong timeout")
            except (OSError, LocalProtocolError, simple_websocket.ConnectionClosed):
                pass
            return
        self.pong_received = False
        self.next_ping = time.monotonic() + self.ping_interval
        try:
            self.outbox.send(self.ws.send(Ping()))
        except (OSError, LocalProtocolError):
            pass

    def _linger(self):
        """After our close frame, read and drop what the client still sends until its close
        reply, for at most LINGER_SECONDS: closing with its data unread would reset the
        connection, and the client could lose our close code."""
        deadline = time.monotonic() + LINGER_SECONDS
        parsed = 0
        while self.ws.state is ConnectionState.LOCAL_CLOSING and not self.outbox.closed:
            data = self._recv_until(deadline)
            if not data:
                return
            # After a frame it could not parse (our 1002 or 1007), wsproto keeps every byte it
            # is given: past a bound the bytes are only dropped, or a client could make one
            # socket hold hundreds of megabytes within the second.
            if parsed < LINGER_PARSE_BYTES:
                parsed += len(data)
                self.ws.receive_data(data)
                self._handle_events()
                self.input_buffer.clear()
            gevent.sleep(0)

    def _recv_until(self, deadline):
        """The next bytes from the client, or None once the deadline (monotonic) has passed."""
        if deadline is None:
            return self.raw.recv(self.receive_bytes)
        left = deadline - time.monotonic()
        if left > 0:
            with gevent.Timeout(left, False):
                return self.raw.recv(self.receive_bytes)
        return None
