"""The machine's floor for the time sockets' tick: N loopback TCP connections, read on the client
core as `python -m bench.timesockets --all` reads them (two processes, the kernel stamping each
arrival), and one process on the server core writing a time_update frame to each in a bare loop
of `socket.send` once a second, as the worker's ticker does, with nothing else around it. How
long that loop takes to reach the last socket is about the least a tick's p99 of arrival can be
on this machine, whatever the server (docs/performance.md, "Time sockets"). On loopback the
sending core also does each reader's receiving work, so the readers are set up as the bench's;
`--readers 1 --no-stamps` reads with one process and no stamps.

    python -m bench.sendfloor [--sockets N] [--seconds S] [--readers R] [--no-stamps]
"""

import argparse
import json
import multiprocessing
import os
import resource
import selectors
import socket
import statistics
import time

from bench import clients, servers

# The size of the ticker's frame: a 2-byte head and the time_update message.
MESSAGE = json.dumps({"type": "time_update", "formatted": "2026-11-26 12:00:00 UTC",
                      "timestamp": "2026-11-26T12:00:00.000000+00:00"}).encode()
FRAME = bytes([0x81, len(MESSAGE)]) + MESSAGE


def read_all(port, count, stamps, ready):
    """Open count connections to port and read them until the other side closes them."""
    os.sched_setaffinity(0, {int(servers.CLIENT_CORE)})
    selector = selectors.DefaultSelector()
    for _ in range(count):
        connection = socket.create_connection(("127.0.0.1", port))
        if stamps:
            connection.setsockopt(socket.SOL_SOCKET, clients.SO_TIMESTAMPNS, 1)
        connection.setblocking(False)
        selector.register(connection, selectors.EVENT_READ)
    ready.set()
    open_count = count
    while open_count:
        for key, _ in selector.select():
            if not key.fileobj.recv(65536):
                selector.unregister(key.fileobj)
                key.fileobj.close()
                open_count -= 1


def loop_seconds(count, seconds, readers=clients.READER_PROCESSES, stamps=True):
    """Open count loopback connections, read by `readers` processes on the client core, and for
    `seconds` seconds write FRAME to each at every whole second from the server core; return how
    long each loop took, in seconds."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 65536)), hard))
    listener = socket.create_server(("127.0.0.1", 0), backlog=4096)
    shares = [len(range(share, count, readers)) for share in range(readers)]
    readies = [multiprocessing.Event() for _ in shares]
    processes = [multiprocessing.Process(target=read_all, args=(listener.getsockname()[1], share, stamps, ready))
                 for share, ready in zip(shares, readies)]
    for process in processes:
        process.start()
    affinity = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {int(servers.SERVER_CORE)})
    connections = []
    loops = []
    try:
        # Accepted as they come: the readers connect at once, so their sockets interleave in the
        # loop as the sockets bench's clients' do in the ticker's.
        for _ in range(count):
            connection, _ = listener.accept()
            connection.setblocking(False)
            connections.append(connection)
        for ready in readies:
            ready.wait()
        for _ in range(seconds):
            time.sleep(1 - time.time() % 1)
            started = time.perf_counter()
            for connection in connections:
                connection.send(FRAME)
            loops.append(time.perf_counter() - started)
    finally:
        for connection in connections:
            connection.close()
        listener.close()
        for process in processes:
            process.join()
        os.sched_setaffinity(0, affinity)
    return loops


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sockets", type=int, default=10_000)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--readers", type=int, default=clients.READER_PROCESSES)
    parser.add_argument("--no-stamps", dest="stamps", action="store_false")
    options = parser.parse_args()
    loops = loop_seconds(options.sockets, options.seconds, options.readers, options.stamps)
    median = statistics.median(loops)
    print(f"{options.sockets:,} loopback sockets, a {len(FRAME)}-byte frame to each once a second for "
          f"{options.seconds} s, sent from core {servers.SERVER_CORE}, read on core {servers.CLIENT_CORE} by "
          f"{options.readers} process{'es' if options.readers > 1 else ''}{', stamped' if options.stamps else ''}: "
          f"the loop took {median * 1000:.1f} ms (median; {min(loops) * 1000:.1f}-{max(loops) * 1000:.1f}), "
          f"{median / options.sockets * 1e6:.2f} µs a send")


if __name__ == "__main__":
    main()
