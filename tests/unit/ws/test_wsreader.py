"""The WebSocket server's reader (ws/wsserver.py) on real (gevent) socket pairs: it waits for the
client's next bytes rather than reading an empty socket, and ends when another greenlet closes the
socket while it yields."""

import contextlib
import itertools
import select
import socket

import gevent
import gevent.socket
from hypothesis import example, given, settings, strategies as st
from wsframes import frame, reads
from wsproto.frame_protocol import FrameProtocol, Opcode
from wsservers import Client, open_server, socket_pair

from ws import wsserver


def test_the_reader_waits_for_the_clients_next_bytes_instead_of_reading_an_empty_socket(pair, monkeypatch):
    server_sock, client_sock = pair
    empty_reads = []
    recv = gevent.socket.socket.recv

    def noting_empty_reads(sock, *args):
        if sock is server_sock and not select.select([sock.fileno()], [], [], 0)[0]:
            empty_reads.append(1)
        return recv(sock, *args)

    monkeypatch.setattr(gevent.socket.socket, "recv", noting_empty_reads)
    server = open_server(server_sock, ping_interval=None)
    server.thread.start_now()
    client_frames = FrameProtocol(client=True, extensions=[])
    for index in range(5):
        client_sock.sendall(client_frames.send_data(f"message {index}", fin=True))
        assert server.receive(timeout=30) == f"message {index}"
        gevent.sleep(0.05)
    # At most the first read, before any message: each read after a message waited for the next.
    assert len(empty_reads) <= 1
    server.close()
    server.thread.join(timeout=wsserver.LINGER_SECONDS + 30)


def test_a_socket_closed_by_another_greenlet_while_the_reader_yields_ends_the_reader(pair):
    # The reader yields after every YIELD_EVERY_READS reads; a failed write elsewhere (the echo's
    # send, the ticker, the pinger) closes the socket meanwhile. The reader must end, not wait
    # for ever on the closed socket's watcher.
    server_sock, client_sock = pair
    server = open_server(server_sock, ping_interval=None)

    def handler():
        for _ in range(wsserver.YIELD_EVERY_READS):
            server.receive()
        server.outbox.abort()

    handling = gevent.spawn(handler)
    server.thread.start_now()
    client_frames = FrameProtocol(client=True, extensions=[])
    for index in range(wsserver.YIELD_EVERY_READS):
        client_sock.sendall(client_frames.send_data(f"message {index}", fin=True))
        gevent.sleep(0.01)  # one short read a message
    handling.join(timeout=30)
    server.thread.join(timeout=30)
    assert handling.dead and server.thread.thread.dead


def test_reads_of_whole_text_frames_skip_wsproto_and_every_other_read_goes_through_it(pair, monkeypatch):
    server_sock, client_sock = pair
    server = open_server(server_sock, ping_interval=None, max_message_size=100)
    parsed_by_wsproto = []
    receive_data = server.ws.receive_data
    monkeypatch.setattr(server.ws, "receive_data", lambda data: parsed_by_wsproto.append(data) or receive_data(data))
    server.thread.start_now()
    client = FrameProtocol(client=True, extensions=[])
    split = client.send_data("split across reads", fin=True)
    # Each read and the messages it completes; the reader reads on once the handler has taken them.
    reads = [(client.send_data("one", fin=True) + client.send_data("two", fin=True), ["one", "two"]),
             (split[:5], []), (split[5:] + client.send_data("after the split", fin=True),
                               ["split across reads", "after the split"]),
             (client.send_data("frag", fin=False), []), (client.send_data("mented", fin=True), ["fragmented"]),
             (client.send_data("x" * 101, fin=True), [])]  # past max_message_size: the library's 1009
    for data, messages in reads:
        client_sock.sendall(data)
        gevent.sleep(0.05)  # read alone
        assert [server.receive(timeout=30) for _ in messages] == messages
    assert parsed_by_wsproto == [data for data, _ in reads[1:]]
    # The client answers no close: the reader ends LINGER_SECONDS after the 1009.
    server.thread.join(timeout=wsserver.LINGER_SECONDS + 30)
    assert not server.connected and server.thread.thread.dead
    assert [(frame.opcode, frame.payload) for frame in Client(client_sock).receive(30)] == [
        (Opcode.CLOSE, (1009, "Message is too big"))]


def written(sock):
    """What the server has written to the client's end so far, without waiting."""
    data = b""
    with contextlib.suppress(BlockingIOError):
        while chunk := sock._sock.recv(65536, socket.MSG_DONTWAIT):
            data += chunk
    return data


def library_reading(server, data):
    """The library's own reading of data (simple-websocket's reader loop, all wsproto)."""
    server.ws.receive_data(data)
    server.connected = server._handle_events() and server.connected


def failure(call, *args):
    """The exception call(*args) raises, or None."""
    try:
        call(*args)
    except Exception as error:
        return error
    return None


@settings(max_examples=150, deadline=None)
@given(reads(), st.sampled_from([None, 5, 125, 300]))
# Whole text frames read while a message in parts waits for its continuation: wsproto's 1002.
@example([frame(b"first part", 0x01), frame(b"whole")], None)
@example([frame(b"first part", 0x02), frame(b"whole") + frame(b"whole")], 125)
# Whole text frames after the client's close, which wsproto ignores.
@example([frame(b"\x03\xe8", 0x88), frame(b"whole")], None)
def test_a_stream_cut_into_reads_anywhere_is_read_as_wsproto_and_the_library_read_it(cut_stream, limit):
    pairs = [socket_pair(), socket_pair()]
    try:
        server, reference = (open_server(server_sock, ping_interval=None, max_message_size=limit)
                             for server_sock, _ in pairs)
        # Read on past a close too, as a reader that was waiting in recv when its handler closed does.
        for data in cut_stream:
            server_failed = failure(server._take_read, data)
            reference_failed = failure(library_reading, reference, data)
            assert repr(server_failed) == repr(reference_failed)
            assert (server.input_buffer, server.connected, server.close_reason, server.close_message) == (
                reference.input_buffer, reference.connected, reference.close_reason, reference.close_message)
            assert server.ws.state is reference.ws.state
        assert written(pairs[0][1]) == written(pairs[1][1])
    finally:
        for sock in itertools.chain.from_iterable(pairs):
            sock.close()
