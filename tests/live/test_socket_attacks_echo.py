"""Hostile clients of the echo WebSocket against the server in both run modes (the Procfile's
gunicorn, and `python app.py`'s fallback server): floods without reading, a flood that reads a byte
a second, 50 hostile echo sockets from one address, and what follows a frame that cannot be parsed.
The attacks on the time socket are in tests/live/test_socket_attacks_time.py; what an attack must not disturb
is in socketattacks.py."""

import threading
import time

import pytest
import websocket
from socketattacks import (
    MIB,
    an_attack_hurts_only_its_own_sockets,
    flood,
    frame,
    handshake,
    target,  # noqa: F401 (the module's server, a fixture)
    worker_rss,
)


@pytest.mark.parametrize("name", ["echo flood", "echo flood, reads a byte a second", "50 echo floods from one address"])
def test_an_attack_hurts_only_its_own_sockets(target, name):
    an_attack_hurts_only_its_own_sockets(target, name)


def test_what_follows_a_frame_that_cannot_be_parsed_is_dropped_not_kept(target):
    # After a text frame that is not UTF-8 the server closes with 1007 and lingers a second for the
    # reply; wsproto, its parser failed, would keep every byte given to it meanwhile.
    server, _, _ = target
    baseline = worker_rss(server)
    connection = handshake(server, "/api/v1/ws/echo")
    connection.sendall(frame(websocket.ABNF.OPCODE_TEXT, b"\xff"))
    stop = threading.Event()
    flooder = threading.Thread(target=flood, args=([connection], b"\0" * 65536, stop), daemon=True)
    flooder.start()
    peak, deadline = baseline, time.monotonic() + 2
    try:
        while time.monotonic() < deadline:
            peak = max(peak, worker_rss(server))
            time.sleep(0.02)
    finally:
        stop.set()
        flooder.join(timeout=10)
        connection.close()
    assert peak - baseline < 24 * MIB
