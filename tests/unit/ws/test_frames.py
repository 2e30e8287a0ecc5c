"""ws/frames.py's reading of whole text frames, held to wsproto's answer for the same bytes: where it
returns messages, wsproto reads exactly those messages and nothing else, and ends between frames."""

from hypothesis import given, settings, strategies as st
from wsframes import frame, streams, texts
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, Request, TextMessage

from ws.frames import whole_texts

HANDSHAKE = (b"GET /echo HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
             b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")


def wsproto_reading(data):
    """What a fresh server connection of wsproto makes of data after the handshake: its events, and
    whether it then holds no part of a frame or message."""
    connection = WSConnection(ConnectionType.SERVER)
    connection.receive_data(HANDSHAKE)
    assert isinstance(next(connection.events()), Request)
    connection.send(AcceptConnection())
    connection.receive_data(data)
    events = list(connection.events())
    protocol = connection.connection._proto
    idle = (protocol._frame_decoder.header is None and not protocol._frame_decoder.buffer.buffer
            and protocol._message_decoder.opcode is None)
    return events, idle


@settings(max_examples=400, deadline=None)
@given(streams, st.sampled_from([None, 0, 5, 125, 300]))
def test_what_it_reads_wsproto_reads_alike(data, longest):
    read = whole_texts(data, 1 << 20 if longest is None else longest)
    if read is None:
        return
    events, idle = wsproto_reading(data)
    assert events == [TextMessage(data=text, frame_finished=True, message_finished=True) for text in read]
    assert idle


@settings(max_examples=200, deadline=None)
@given(st.lists(texts, max_size=8))
def test_whole_text_frames_within_the_bound_are_read_without_wsproto(messages):
    data = b"".join(frame(text.encode()) for text in messages)
    assert whole_texts(data, 1200) == messages


def test_each_frame_is_read_with_its_own_mask_and_length_form():
    long_text = "é" * 200  # 400 bytes: a 16-bit length
    assert whole_texts(frame(b"ping", mask=b"\x00\x00\x00\x00") + frame(long_text.encode()) + frame(b""), 400) == [
        "ping", long_text, ""]
    assert whole_texts(b"", 10) == []


def test_anything_else_is_left_to_wsproto():
    assert whole_texts(frame(b"x" * 11), 10) is None  # past the bound: wsproto's (and the library's) close
    assert whole_texts(frame(b"short", length_form="16"), 1000) is None  # wsproto refuses the long form
    assert whole_texts(frame(b"\xff"), 10) is None  # wsproto closes with 1007
    assert whole_texts(frame(b"ping") + frame(b"pi", first_byte=0x89), 10) is None  # a ping among them
    assert whole_texts(frame(b"ping")[:-1], 10) is None  # the rest comes in the next read
    assert whole_texts(frame(b"ping", masked=False), 10) is None
