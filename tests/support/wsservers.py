"""A wsserver.Server on one end of a socket pair, as flask-sock makes one under gevent's worker,
the client's end of it, and the waits the WebSocket adapter's tests share."""

import gevent
import gevent.event
import gevent.socket
from wsproto.frame_protocol import FrameProtocol

from ws import wsserver


def socket_pair():
    """A connected (server, client) pair of gevent sockets with 64 KiB buffers, so that a test
    fills them quickly."""
    server, client = gevent.socket.socketpair()
    server.setsockopt(gevent.socket.SOL_SOCKET, gevent.socket.SO_SNDBUF, 65536)
    client.setsockopt(gevent.socket.SOL_SOCKET, gevent.socket.SO_RCVBUF, 65536)
    return server, client


class Reader(gevent.Greenlet):
    """The library's thread_class, as gevent's worker makes it: a greenlet."""

    def __init__(self, target):
        super().__init__(target)


def open_server(sock, ping_interval, **options):
    """A Server on sock as flask-sock makes one, its reader a greenlet as under gevent's worker."""
    environ = {"gunicorn.socket": sock, "HTTP_HOST": "test", "HTTP_UPGRADE": "websocket",
               "HTTP_CONNECTION": "Upgrade", "HTTP_SEC_WEBSOCKET_KEY": "dGhlIHNhbXBsZSBub25jZQ==",
               "HTTP_SEC_WEBSOCKET_VERSION": "13"}
    return wsserver.Server(environ, ping_interval=ping_interval, thread_class=Reader,
                           event_class=gevent.event.Event, **options)


class Client:
    """The client's end of a Server: the 101, then frames (wsproto's framing, as a client)."""

    def __init__(self, sock):
        self.sock = sock
        self.frames = FrameProtocol(client=True, extensions=[])
        self.head = b""

    def receive(self, seconds):
        """Yield each frame until the server closes the socket or seconds pass."""
        with gevent.Timeout(seconds, False):
            while data := self.sock.recv(65536):
                if b"\r\n\r\n" not in self.head:
                    self.head += data
                    head, _, data = self.head.partition(b"\r\n\r\n")
                    if not _:
                        continue
                    assert head.startswith(b"HTTP/1.1 101")
                self.frames.receive_bytes(data)
                yield from self.frames.received_frames()


def read_exactly(sock, count):
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        assert chunk, "closed early"
        data += chunk
    return data


def wait_until(condition, seconds=30):
    """Let the loop run until condition() holds; fail after `seconds` (generous, for a loaded machine)."""
    with gevent.Timeout(seconds, AssertionError("condition not met in time")):
        while not condition():
            gevent.sleep(0.01)
