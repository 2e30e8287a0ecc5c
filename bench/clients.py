"""The WebSocket clients of the socket parts, each as cheap as its measurement allows: raw
handshakes, a reader stamped by the kernel, an asyncio echo client; and the figures made of
what they saw."""

import asyncio
import base64
import datetime
import json
import multiprocessing
import os
import select
import socket
import struct
import time

from bench.servers import use_client_core

# Linux's SO_TIMESTAMPNS (and SCM_TIMESTAMPNS): the kernel stamps each packet as it arrives, so a
# busy client cannot make the server look late. The socket module does not export them.
SO_TIMESTAMPNS = 35
# The processes that read every time socket (sockets --all, and the send floor's readers), all
# on the client core.
READER_PROCESSES = 2
# A masked (key 0) ping with 125 bytes: a stalled client sends these without ever reading the pongs.
PING_FRAME = bytes([0x89, 0x80 | 125, 0, 0, 0, 0]) + b"p" * 125


def handshake(path, host="bench"):
    """The bytes of a WebSocket upgrade request for path."""
    key = base64.b64encode(os.urandom(16)).decode()
    return (f"GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode()


def frames(buffer):
    """Split the complete server frames off buffer: return ([(opcode, payload)], the rest)."""
    found = []
    while len(buffer) >= 2:
        length, start = buffer[1] & 0x7F, 2
        if length == 126:
            length, start = int.from_bytes(buffer[2:4], "big"), 4
        if len(buffer) < start + length:
            break
        found.append((buffer[0] & 0x0F, buffer[start:start + length]))
        buffer = buffer[start + length:]
    return found, buffer


def epoch(text, layout):
    return datetime.datetime.strptime(text, layout).replace(tzinfo=datetime.UTC).timestamp()


def lateness(sockets, window, by_second=None):
    """Each tick's lateness after its whole second, for ticks of the seconds in window.

    sockets yields, for each socket, its (arrival time, raw message) pairs; return (arrived ms,
    built ms, skipped seconds), the seconds of window that a socket never received summed. by_second,
    if given, a {second: []} of window's seconds, gets each arrival's lateness under its second too."""
    parsed, arrived_ms, built_ms, skipped = {}, [], [], 0
    for arrivals in sockets:
        seen = set()
        for arrived, raw in arrivals:
            if raw not in parsed:  # every socket gets the same bytes each second: parse them once
                message = json.loads(raw)
                parsed[raw] = (epoch(message["formatted"], "%Y-%m-%d %H:%M:%S UTC"),
                               epoch(message["timestamp"], "%Y-%m-%dT%H:%M:%S.%fZ")
                               ) if message.get("type") == "time_update" else (None, None)
            second, built = parsed[raw]
            if second in window:
                seen.add(second)
                arrived_ms.append((arrived - second) * 1000)
                built_ms.append((built - second) * 1000)
                if by_second is not None:
                    by_second[second].append(arrived_ms[-1])
        skipped += len(window - seen)
    return arrived_ms, built_ms, skipped


def tick_p99s(by_second):
    """Each second's arrival p99 in ms, in the order of the seconds (None for a second nothing
    arrived in): a run's p99 over every arrival is the tail of its slowest ticks, and one slow
    second, the machine's or the server's, can decide it."""
    return [(percentiles(sorted(lates)) or {"p99": None})["p99"] for _, lates in sorted(by_second.items())]


def percentiles(values):
    """p50, p99 and max of sorted values, or None for none."""
    if not values:
        return None
    pick = lambda q: values[min(len(values) - 1, int(q * len(values)))]  # noqa: E731
    return {"p50": round(pick(0.5), 1), "p99": round(pick(0.99), 1), "max": round(values[-1], 1)}


async def hold_raw_socket(host, port, path, receive_buffer=None):
    """Open a WebSocket with a bare handshake and never read from it: holding thousands costs the
    client no CPU, so the measured sample sees the server's lateness, not the client's. With a
    small receive_buffer, the server soon finds the socket full: a stalled client."""
    sock = socket.socket()
    if receive_buffer:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (host, port))
    reader, writer = await asyncio.open_connection(sock=sock)
    writer.write(handshake(path, f"{host}:{port}"))
    head = await reader.readuntil(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 101"):
        raise ConnectionError(head.split(b"\r\n")[0].decode())
    writer.transport.pause_reading()
    return writer


async def flood_pings(writer):
    """Send pings flat out until cancelled or cut off."""
    try:
        while True:
            writer.write(PING_FRAME * 64)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass


class AnsweringSocket(asyncio.Protocol):
    """A time socket that reads every frame and answers each ping, as a live client does, and does
    nothing else: it stays open however long it is held (an unanswered ping ends a socket)."""

    def __init__(self, path, upgraded):
        self.path, self.upgraded = path, upgraded
        self.buffer = b""
        self.closed = False

    def connection_made(self, transport):
        self.transport = transport
        transport.write(handshake(self.path))

    def data_received(self, data):
        self.buffer += data
        if not self.upgraded.done():
            head, found, rest = self.buffer.partition(b"\r\n\r\n")
            if not found:
                return
            self.buffer = rest
            if head.startswith(b"HTTP/1.1 101"):
                self.upgraded.set_result(self)
            else:
                self.upgraded.set_exception(ConnectionError(head.split(b"\r\n")[0].decode(errors="replace")))
                self.transport.close()
                return
        complete, self.buffer = frames(self.buffer)
        for opcode, payload in complete:
            if opcode == 0x9:  # a ping: a masked (key 0) pong with its payload
                self.transport.write(bytes([0x8A, 0x80 | len(payload), 0, 0, 0, 0]) + payload)

    def connection_lost(self, error):
        self.closed = True
        if not self.upgraded.done():
            self.upgraded.set_exception(ConnectionError("closed before the handshake"))


async def open_answering_sockets(port, paths, at_once=100):
    """Open an AnsweringSocket for each path, at_once handshakes at a time; return (the open
    sockets, the count of failed handshakes)."""
    loop = asyncio.get_running_loop()
    gate = asyncio.Semaphore(at_once)
    opened, failures = [], 0

    async def open_one(path):
        nonlocal failures
        async with gate:
            upgraded = loop.create_future()
            try:
                await loop.create_connection(lambda: AnsweringSocket(path, upgraded), "127.0.0.1", port)
                opened.append(await asyncio.wait_for(upgraded, 120))
            except (OSError, asyncio.TimeoutError):
                failures += 1

    await asyncio.gather(*(open_one(path) for path in paths))
    return opened, failures


class TimeSocketReader:
    """One time socket of sockets --all: reads every frame and keeps each chunk with the time the
    kernel received it, answering the server's pings as a browser does (the service closes a
    socket that leaves one unanswered at its next, 25 to 50 s on); nothing else is parsed until
    the run is over."""

    def __init__(self, port, path):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=120)
        self.sock.sendall(handshake(path))
        self.sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        self.chunks = []
        self.unparsed = None  # the frames' bytes not yet looked through for pings, once upgraded

    def finish_handshake(self):
        """Wait for the 101 (raise ConnectionError for anything else), then stop blocking."""
        while b"\r\n\r\n" not in b"".join(data for _, data in self.chunks):
            if not self.read():
                raise ConnectionError("closed before the handshake")
        if not self.chunks[0][1].startswith(b"HTTP/1.1 101"):
            raise ConnectionError(self.chunks[0][1].split(b"\r\n")[0].decode(errors="replace"))
        self.unparsed = b""
        self.answer_pings(b"".join(data for _, data in self.chunks).partition(b"\r\n\r\n")[2])
        self.sock.setblocking(False)

    def read(self):
        """Read what is waiting; return False once the server has closed the socket."""
        data, ancillary, _, _ = self.sock.recvmsg(65536, 64)
        stamp = time.time()
        for level, kind, value in ancillary:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
                seconds, nanoseconds = struct.unpack("qq", value[:16])
                stamp = seconds + nanoseconds / 1e9
        self.chunks.append((stamp, data))
        if self.unparsed is not None:
            self.answer_pings(data)
        return bool(data)

    def answer_pings(self, data):
        complete, self.unparsed = frames(self.unparsed + data)
        for opcode, payload in complete:
            if opcode == 9:
                # A pong (FIN, opcode 10), masked with the key 0, which leaves the payload as it is.
                self.sock.send(bytes([0x8A, 0x80 | len(payload)]) + bytes(4) + payload)

    def messages(self):
        """Yield (arrival time, payload) for each text frame, stamped with the chunk that ended it."""
        buffer, upgraded = b"", False
        for arrived, data in self.chunks:
            buffer += data
            if not upgraded:
                head, found, rest = buffer.partition(b"\r\n\r\n")
                if not found:
                    continue
                buffer, upgraded = rest, True
            complete, buffer = frames(buffer)
            for opcode, payload in complete:
                if opcode == 1:
                    yield arrived, payload


def read_every_socket(port, paths, tick_seconds, rss_kib=None):
    """Open paths on port with READER_PROCESSES processes on the client core between them, and read
    every tick of tick_seconds whole seconds, each arrival stamped by the kernel. rss_kib, if given,
    is asked for the server's memory once every socket is open."""
    context = multiprocessing.get_context("spawn")
    pipes, processes = [], []
    for share in range(READER_PROCESSES):
        ours, theirs = context.Pipe()
        process = context.Process(target=read_time_sockets,
                                  args=(port, paths[share::READER_PROCESSES], tick_seconds, theirs))
        process.start()
        pipes.append(ours)
        processes.append(process)
    failures = sum(pipe.recv() for pipe in pipes)
    time.sleep(2)
    rss_open = rss_kib and rss_kib()
    first_second = int(time.time()) + 2
    for pipe in pipes:
        pipe.send(first_second)
    reports = [pipe.recv() for pipe in pipes]
    for process in processes:
        process.join()
    by_second = {second: [] for second in range(first_second, first_second + tick_seconds)}
    for report in reports:
        for second, lates in report["by_second"].items():
            by_second[second].extend(lates)
    arrived = sorted(late for report in reports for late in report["arrived_ms"])
    built = sorted(late for report in reports for late in report["built_ms"])
    # The processes share the client core: their CPU seconds over the window is a share of it.
    cpu = sum(report["cpu_seconds"] for report in reports) / max(report["wall_seconds"] for report in reports)
    return {"sockets": len(paths), "handshake_failures": failures,
            "skipped_seconds": sum(report["skipped"] for report in reports),
            "built_ms": percentiles(built), "arrived_ms": percentiles(arrived), "tick_p99_ms": tick_p99s(by_second),
            "client_cpu_percent": round(100 * cpu), "rss_open_kib": rss_open}


def read_time_sockets(port, paths, tick_seconds, pipe):
    """A client process of sockets --all: open paths (100 handshakes at a time), report the
    failures, wait for the first second of the window, read every socket through epoll until it
    ends, then report every tick's lateness and this process's CPU time (user + system) and the
    wall time it was measured over."""
    use_client_core()
    readers, failures = {}, 0
    for start in range(0, len(paths), 100):
        opening = []
        for path in paths[start:start + 100]:
            try:
                opening.append(TimeSocketReader(port, path))
            except OSError:
                failures += 1
        for reader in opening:
            try:
                reader.finish_handshake()
                readers[reader.sock.fileno()] = reader
            except OSError:
                failures += 1
    poller = select.epoll()
    for fileno in readers:
        poller.register(fileno, select.EPOLLIN)
    pipe.send(failures)
    first_second = pipe.recv()
    started, cpu_started = time.time(), time.process_time()
    ends_at = first_second + tick_seconds + 1.5
    while (left := ends_at - time.time()) > 0:
        for fileno, _ in poller.poll(min(left, 0.5)):
            try:
                if not readers[fileno].read():
                    poller.unregister(fileno)
            except BlockingIOError:
                pass
    cpu_seconds, wall_seconds = time.process_time() - cpu_started, time.time() - started
    window = set(range(first_second, first_second + tick_seconds))
    by_second = {second: [] for second in window}
    arrived_ms, built_ms, skipped = lateness((reader.messages() for reader in readers.values()), window, by_second)
    for reader in readers.values():
        reader.sock.close()
    pipe.send({"by_second": by_second, "arrived_ms": arrived_ms, "built_ms": built_ms, "skipped": skipped,
               "cpu_seconds": cpu_seconds, "wall_seconds": wall_seconds})


class EchoClient(asyncio.Protocol):
    """One echo connection that sends the same pre-masked frame and reads each reply only for its
    length: so little work per round trip that one client core can keep the server busy."""

    FRAME = bytes([0x81, 0x80 | 4, 0, 0, 0, 0]) + b"ping"  # a text frame masked with key 0

    def __init__(self, path, stop_at, latencies, first_replies, done):
        self.path, self.stop_at, self.latencies = path, stop_at, latencies
        self.first_replies, self.done = first_replies, done
        self.buffer = b""
        self.upgraded = False

    def connection_made(self, transport):
        self.transport = transport
        transport.write(handshake(self.path))

    def send(self):
        self.sent_at = time.perf_counter()
        self.transport.write(self.FRAME)

    def data_received(self, data):
        self.buffer += data
        if not self.upgraded:
            head, upgraded, self.buffer = self.buffer.partition(b"\r\n\r\n")
            if not upgraded:
                self.buffer = head
                return
            assert head.startswith(b"HTTP/1.1 101"), head
            self.upgraded = True
            self.send()
        complete, self.buffer = frames(self.buffer)
        for opcode, payload in complete:
            if opcode != 1:
                continue  # a ping from the server
            self.latencies.append(time.perf_counter() - self.sent_at)
            if len(self.first_replies) < 1:
                self.first_replies.append(payload.decode())
            if time.time() < self.stop_at:
                self.send()
            else:
                self.transport.close()

    def connection_lost(self, error):
        self.done.set_result(None)


def echo_round_trips(base, path, clients, seconds):
    """Run `clients` echo connections for `seconds`; return (sorted latencies in s, one reply)."""
    latencies, first_replies = [], []

    async def run():
        loop = asyncio.get_running_loop()
        host, port = base.removeprefix("http://").split(":")
        stop_at = time.time() + seconds
        finished = []
        for _ in range(clients):
            done = loop.create_future()
            await loop.create_connection(
                lambda: EchoClient(path, stop_at, latencies, first_replies, done), host, int(port))
            finished.append(done)
        await asyncio.gather(*finished)

    asyncio.run(run())
    latencies.sort()
    return latencies, first_replies[0]
