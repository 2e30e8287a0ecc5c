"""The WebSocket adapter's server (ws/wsserver.py) on real (gevent) socket pairs: its frames, pings and
close (the Outbox's own tests: test_outbox.py; the reader's: test_wsreader.py), and the library
internals the adapter relies on, so that a new simple-websocket, flask-sock or gevent that moves
them fails here loudly instead of quietly bringing back unbounded buffers."""

import dataclasses
import inspect

import flask_sock
import gevent
import gevent.event
import gevent.socket
import gevent.ssl
import pytest
import simple_websocket
import wsproto
import wsproto.connection
import wsproto.events
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, Request, TextMessage
from wsproto.frame_protocol import FrameProtocol, Opcode
from wsservers import Client, open_server, wait_until

import sockets
from ws import pinger, wsserver


def test_the_library_internals_the_adapter_relies_on():
    base = simple_websocket.ws.Base
    assert callable(base._thread) and callable(base._handle_events) and callable(base.handshake)
    init = inspect.getsource(base.__init__)
    for attribute in ("self.sock = sock", "self.input_buffer = []", "self.incoming_message_len = 0",
                      "self.event = event_class()", "self.ws = WSConnection", "self.handshake()",
                      "target=self._thread"):
        assert attribute in init, attribute
    # Every write of the library (handshake, pongs, close) goes through self.sock.send.
    for method in (base._handle_events, base.close):
        assert "self.sock.send(" in inspect.getsource(method)
    assert "environ.get('gunicorn.socket')" in inspect.getsource(simple_websocket.Server.__init__)
    assert "receive_data" in dir(wsproto.WSConnection)
    # flask-sock builds each connection's server from its module-level name.
    assert "Server(request.environ" in inspect.getsource(flask_sock.Sock.route)
    assert flask_sock.Server is wsserver.Server and sockets.flask_sock is flask_sock
    # A TLS socket's send gives up (returns 0) only while the socket's own timeout is 0.
    assert "if self.timeout == 0.0:" in inspect.getsource(gevent.ssl.SSLSocket.send)
    # The outbox writes through the real, non-blocking socket under gevent's.
    with gevent.socket.socket() as sock:
        assert sock._sock.gettimeout() == 0.0
        assert callable(sock._wait) and sock._read_event is not None
    with gevent.socket.socket() as sock:
        sock.close()
        assert sock._read_event is None  # so the reader does not wait on a closed socket's watcher
    # The reader waits for a plain socket's next bytes as gevent's recv does after an EAGAIN.
    assert "self._wait(self._read_event)" in inspect.getsource(gevent.socket.socket.recv)
    # The request id reaches the 101 as an extra header of the AcceptConnection the library sends.
    assert "self.ws.send(AcceptConnection(" in inspect.getsource(base._handle_events)
    assert "extra_headers" in {field.name for field in dataclasses.fields(wsproto.events.AcceptConnection)}
    assert "self.environ = environ" in inspect.getsource(simple_websocket.Server.__init__)
    # Once the connection is made, wsproto asks its handshake only for events (FinishedHandshake).
    for method in (WSConnection.send, WSConnection.receive_data, WSConnection.state.fget):
        assert "if self.connection is None:" in inspect.getsource(method)
    assert inspect.getsource(WSConnection.events).count("self.handshake") == 1
    # The reader hands a read to ws/frames.py only while wsproto holds no part of a frame or message
    # (Server._between_messages).
    assert "self._proto = FrameProtocol(" in inspect.getsource(wsproto.connection.Connection.__init__)
    protocol = FrameProtocol(client=False, extensions=[])
    assert protocol._frame_decoder.header is None and protocol._frame_decoder.buffer.buffer == bytearray()
    assert protocol._message_decoder.opcode is None


@pytest.mark.parametrize("length", [0, 1, 125, 126, 65535, 65536])
def test_text_frame_is_what_a_server_connection_sends(length):
    client, server = WSConnection(ConnectionType.CLIENT), WSConnection(ConnectionType.SERVER)
    server.receive_data(client.send(Request(host="example.com", target="/api/v1/ws/time")))
    list(server.events())
    client.receive_data(server.send(AcceptConnection()))
    list(client.events())
    text = "é" + "x" * max(0, length - 2) if length else ""
    assert wsserver.text_frame(text) == server.send(TextMessage(data=text))
    assert wsserver.text_frame(text) == server.send(TextMessage(data=text))  # no state carried over
    client.receive_data(wsserver.text_frame(text))
    assert [event.data for event in client.events()] == [text]


def test_a_client_that_answers_pings_is_pinged_every_interval_and_kept(pair):
    server_sock, client_sock = pair
    server = open_server(server_sock, ping_interval=0.3)
    server.thread.start_now()  # as the handler's first receive() does
    client = Client(client_sock)
    pings = 0
    for frame in client.receive(30):
        assert frame.opcode is Opcode.PING
        pings += 1
        client_sock.sendall(client.frames.pong(frame.payload))
        if pings == 3:
            break
    # About one a second: the pinger sweeps once a second.
    assert pings >= 3 and server.connected
    server.close()
    client_sock.close()
    server.thread.join(timeout=wsserver.LINGER_SECONDS + 30)
    assert server.thread.thread.dead
    assert pinger.PINGER.sweeper is None


def test_a_client_that_answers_no_ping_is_closed_with_1008(pair):
    server_sock, client_sock = pair
    server = open_server(server_sock, ping_interval=0.3)
    server.thread.start_now()  # as the handler's first receive() does
    frames = list(Client(client_sock).receive(30))
    assert [frame.opcode for frame in frames] == [Opcode.PING, Opcode.CLOSE]
    assert frames[1].payload == (1008, "Ping/Pong timeout")
    # The client never answers the close either: the server stops waiting for it.
    server.thread.join(timeout=wsserver.LINGER_SECONDS + 30)
    assert server.thread.thread.dead and server.outbox.closed and pinger.PINGER.sweeper is None


def test_a_server_read_in_the_handlers_greenlet_drops_messages_and_ends_when_closed(pair):
    server_sock, client_sock = pair
    server = open_server(server_sock, ping_interval=None)
    reading = gevent.spawn(server.read_until_closed)
    client_sock.sendall(FrameProtocol(client=True, extensions=[]).send_data("ignored", fin=True) * 3)
    gevent.sleep(0.2)
    assert server.input_buffer == [] and server.thread.thread is None
    server.close(4401, "The API key was revoked.")
    # The client answers nothing: the server stops reading LINGER_SECONDS later.
    reading.join(timeout=wsserver.LINGER_SECONDS + 30)
    assert reading.dead and server.outbox.closed and server.close_timer.dead
    frames = list(Client(client_sock).receive(30))
    assert [frame.opcode for frame in frames] == [Opcode.CLOSE]
    assert frames[0].payload == (4401, "The API key was revoked.")


def test_a_server_lets_go_of_the_finished_handshake_and_goes_on_talking(pair):
    server_sock, client_sock = pair
    server = open_server(server_sock, ping_interval=None)
    assert server.ws.handshake is wsserver.FINISHED_HANDSHAKE and server.ws.connection is not None
    client = Client(client_sock)
    client_sock.sendall(client.frames.send_data("hello", fin=True) + client.frames.ping(b"?"))
    assert server.receive(timeout=30) == "hello"
    server.send("hi")
    server.close(1000, "done")
    frames = list(client.receive(30))
    assert [(frame.opcode, frame.payload) for frame in frames] == [
        (Opcode.PONG, b"?"), (Opcode.TEXT, "hi"), (Opcode.CLOSE, (1000, "done"))]


@pytest.mark.parametrize("closing", ["the server closes", "the client's message is too big"])
def test_nothing_written_to_the_outbox_follows_the_server_s_close_frame(pair, closing):
    # The ticker writes frames straight to the outbox, past the Server's `connected`: while the
    # reader lingers for the client's close reply, the outbox is open, and must refuse them.
    server_sock, client_sock = pair
    server = open_server(server_sock, ping_interval=None, max_message_size=16)
    server.thread.start_now()
    client = Client(client_sock)
    if closing == "the server closes":
        server.close(4401, "The API key was revoked.")
    else:
        client_sock.sendall(client.frames.send_data("x" * 17, fin=True))
        wait_until(lambda: not server.connected)
    assert not server.outbox.closing and not server.outbox.closed
    with pytest.raises(BrokenPipeError):
        server.outbox.send(wsserver.text_frame("a tick"), limited=True)
    assert [frame.opcode for frame in client.receive(30)] == [Opcode.CLOSE]
    server.thread.join(timeout=wsserver.LINGER_SECONDS + 30)
    assert server.thread.thread.dead and server.outbox.closed
