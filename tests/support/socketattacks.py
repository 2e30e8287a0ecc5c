"""Hostile WebSocket clients against the server in both run modes (the Procfile's gunicorn, and
`python app.py`'s fallback server), for tests/live/test_socket_attacks_echo.py (on the echo socket) and
tests/live/test_socket_attacks_time.py (on the time socket), two files so that two workers run them: the
server under attack, the attacks, and what each must not disturb. While each attack lasts, a
healthy time socket of another key gets every whole second, a revoked key's socket gets 4401
within 10 s, REST keeps answering, and the worker's memory stays within a stated bound, during
the attack and after it."""

import base64
import json
import os
import socket
import threading
import time

import pytest
import requests
import websocket
from liveserver import cli_session, make_key, service_env, start_server, wait_for

ATTACK_SECONDS = 12
SEND_TIMEOUT = 4
MIB = 1024 * 1024
FLOOD_BYTES = 512 * MIB


@pytest.fixture(scope="module")
def target(tmp_path_factory, run_mode):
    """(server, env, commands): the server whose stuck sockets are closed after SEND_TIMEOUT s, and
    the command line on its database (one process for the module's keys and revocations)."""
    tmp_path = tmp_path_factory.mktemp("attacks")
    env = service_env(tmp_path, WS_SEND_TIMEOUT=str(SEND_TIMEOUT))
    with cli_session(env) as commands:
        make_key(env, commands=commands)
        server = start_server(tmp_path, env, run_mode)
        try:
            yield server, env, commands
        finally:
            server.stop()


def worker_rss(server):
    """The resident memory of the process that serves (gunicorn's one worker), in bytes."""
    serving = server.process.pid
    if server.mode == "gunicorn":
        children = open(f"/proc/{serving}/task/{serving}/children").read().split()
        assert len(children) == 1, children
        serving = children[0]
    for line in open(f"/proc/{serving}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def handshake(server, path, receive_buffer=None):
    """A raw TCP connection upgraded to a WebSocket at path, with nothing read past the handshake."""
    port = int(server.base.rsplit(":", 1)[1])
    connection = socket.socket()
    if receive_buffer:
        connection.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    connection.connect(("127.0.0.1", port))
    key = base64.b64encode(os.urandom(16)).decode()
    connection.sendall((f"GET {path} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += connection.recv(1)
    assert head.startswith(b"HTTP/1.1 101"), head
    return connection


def frame(opcode, payload):
    return websocket.ABNF.create_frame(payload, opcode).format()


def flood(connections, data, stop, read_a_byte_a_second=False):
    """Send data over and over on every connection as fast as the server takes it, never reading
    (or one byte a second), until stop is set, the server closes the connection, or FLOOD_BYTES
    are sent: a server that took that much without pushing back has no backpressure."""
    for connection in connections:
        connection.setblocking(False)
    offsets = dict.fromkeys(connections, 0)
    next_read = time.monotonic()
    total = 0
    while offsets and not stop.is_set() and total < FLOOD_BYTES:
        progress = False
        for connection, offset in list(offsets.items()):
            try:
                sent = connection.send(data[offset:])
            except BlockingIOError:
                continue
            except OSError:
                del offsets[connection]
                continue
            offsets[connection] = (offset + sent) % len(data)
            total += sent
            progress = True
        if read_a_byte_a_second and time.monotonic() >= next_read:
            next_read += 1
            for connection in offsets:
                try:
                    connection.recv(1)
                except OSError:
                    pass
        if not progress:
            time.sleep(0.01)


def hold(connections, stop):
    stop.wait()


class Bystanders:
    """What an attack must not disturb, watched from threads while it runs."""

    def __init__(self, server, env, commands):
        self.server = server
        self.errors = []
        self.ticks = []
        self.rest_latencies = []
        self.peak_rss = 0
        self.doomed_close = None
        self.healthy = websocket.create_connection(self.url(make_key(env, commands=commands)), timeout=10)
        assert json.loads(self.healthy.recv())["type"] == "auth_success"
        doomed_key = make_key(env, commands=commands)
        self.doomed = websocket.create_connection(self.url(doomed_key), timeout=10)
        assert json.loads(self.doomed.recv())["type"] == "auth_success"
        self.doomed_key_id = next(line.split("\t")[0] for line in commands("keys", "list", "carol").splitlines()
                                  if f"\t{doomed_key[:12]}...\t" in line)
        self.commands = commands

    def url(self, key):
        return self.server.base.replace("http://", "ws://") + f"/api/v1/ws/time?api_key={key}"

    def watch(self, seconds):
        stop = threading.Event()
        threads = [threading.Thread(target=target, args=(stop,), daemon=True)
                   for target in (self.read_ticks, self.call_rest, self.sample_rss)]
        for thread in threads:
            thread.start()
        revoked_at = time.monotonic()
        self.commands("keys", "revoke", self.doomed_key_id)
        self.doomed_close = (wait_for_close(self.doomed, 15), time.monotonic() - revoked_at)
        time.sleep(max(0.0, seconds - (time.monotonic() - revoked_at)))
        stop.set()
        for thread in threads:
            thread.join(timeout=15)
        self.healthy.close()

    def read_ticks(self, stop):
        self.healthy.settimeout(10)  # a wait; a tick that came late but in its second still counts
        while not stop.is_set():
            try:
                tick = json.loads(self.healthy.recv())
            except Exception as error:
                self.errors.append(f"healthy time socket: {error!r}")
                return
            self.ticks.append((tick["formatted"], time.time()))

    def call_rest(self, stop):
        while not stop.wait(0.5):
            started = time.monotonic()
            try:
                status = requests.get(self.server.base + "/api/v1/status", timeout=3).status_code
            except requests.RequestException as error:
                self.errors.append(f"REST: {error!r}")
                continue
            self.rest_latencies.append(time.monotonic() - started)
            if status != 200:
                self.errors.append(f"REST: {status}")

    def sample_rss(self, stop):
        while not stop.wait(0.2):
            self.peak_rss = max(self.peak_rss, worker_rss(self.server))

    def assert_undisturbed(self, seconds):
        assert self.errors == []
        seconds_seen = [time.mktime(time.strptime(formatted, "%Y-%m-%d %H:%M:%S UTC")) for formatted, _ in self.ticks]
        assert len(seconds_seen) >= seconds - 2
        assert [b - a for a, b in zip(seconds_seen, seconds_seen[1:])] == [1] * (len(seconds_seen) - 1)
        assert self.doomed_close[0] == 4401
        assert self.doomed_close[1] <= 10
        assert self.rest_latencies and max(self.rest_latencies) < 2


def wait_for_close(ws, seconds):
    """The close code the server sends within seconds, else None."""
    deadline = time.monotonic() + seconds
    try:
        while (left := deadline - time.monotonic()) > 0:
            ws.settimeout(left)
            opcode, data = ws.recv_data(control_frame=True)
            if opcode == websocket.ABNF.OPCODE_CLOSE:
                return int.from_bytes(data[:2], "big")
    except (websocket.WebSocketException, OSError):
        pass
    return None


def closed_by_server(connection, seconds):
    """Read (and drop) what the server still sends until it closes; True if it did within seconds."""
    connection.setblocking(True)
    connection.settimeout(seconds)
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            if not connection.recv(1 << 20):
                return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False
    return False


def closed_by_peer(connection):
    """True once the server has closed the connection (its FIN, or a reset), as the kernel's table
    shows it: without reading, since a read would take from the server's queue and so keep the
    server from ever finding the client stuck."""
    try:
        local, remote = connection.getsockname()[1], connection.getpeername()[1]
    except OSError:  # reset: no longer connected
        return True
    with open("/proc/net/tcp") as table:
        for row in table.readlines()[1:]:
            fields = row.split()
            if (int(fields[1].rsplit(":", 1)[1], 16), int(fields[2].rsplit(":", 1)[1], 16)) == (local, remote):
                return fields[3] != "01"  # anything but ESTABLISHED
    return True


def attack(name, server, env, commands):
    """Open the attack's connections; return (connections, worker function, its arguments)."""
    echo = "/api/v1/ws/echo"
    if name in ("echo flood", "echo flood, reads a byte a second"):
        connections = [handshake(server, echo)]
        return connections, flood, (frame(websocket.ABNF.OPCODE_TEXT, "x" * 60_000), )
    if name == "50 echo floods from one address":
        connections = [handshake(server, echo) for _ in range(50)]
        return connections, flood, (frame(websocket.ABNF.OPCODE_TEXT, "y" * 60_000), )
    time_path = f"/api/v1/ws/time?api_key={make_key(env, commands=commands)}"
    if name == "ping flood":
        return [handshake(server, time_path)], flood, (frame(websocket.ABNF.OPCODE_PING, "p" * 125) * 32, )
    if name == "pong flood":
        return [handshake(server, time_path)], flood, (frame(websocket.ABNF.OPCODE_PONG, "q" * 125) * 32, )
    if name == "ten time sockets that never read":
        return [handshake(server, time_path, receive_buffer=1024) for _ in range(10)], hold, ()
    raise ValueError(name)


ATTACKS = {
    # name: (bound on the worker's RSS growth while it lasts and after it, closed within the test)
    "echo flood": (24 * MIB, True),
    "echo flood, reads a byte a second": (24 * MIB, True),
    "50 echo floods from one address": (160 * MIB, True),
    "ping flood": (24 * MIB, True),
    "pong flood": (24 * MIB, False),
    "ten time sockets that never read": (24 * MIB, False),
}


def an_attack_hurts_only_its_own_sockets(target, name):
    """The attack `name` of ATTACKS on the target, with its bystanders watching."""
    server, env, commands = target
    bound, closed_for_good = ATTACKS[name]
    baseline = worker_rss(server)
    bystanders = Bystanders(server, env, commands)
    connections, run, args = attack(name, server, env, commands)
    stop = threading.Event()
    worker = threading.Thread(target=run, args=(connections, *args, stop),
                              kwargs={"read_a_byte_a_second": True} if "byte a second" in name else {}, daemon=True)
    worker.start()
    try:
        bystanders.watch(ATTACK_SECONDS)
    finally:
        stop.set()
        worker.join(timeout=10)
    bystanders.assert_undisturbed(ATTACK_SECONDS)
    assert bystanders.peak_rss - baseline < bound
    if closed_for_good:
        # The server gives up on a client that has taken nothing for SEND_TIMEOUT seconds: by now on
        # an idle machine; a loaded one may still be working through the 50 floods' input first.
        wait_for(lambda: all(closed_by_peer(connection) for connection in connections))
        deadline = time.monotonic() + SEND_TIMEOUT + 2
        assert all(closed_by_server(connection, max(0.5, deadline - time.monotonic())) for connection in connections)
    for connection in connections:
        connection.close()
    time.sleep(1)
    assert worker_rss(server) - baseline < bound
    output = server.output()
    assert "Traceback" not in output and "ConcurrentObjectUseError" not in output
