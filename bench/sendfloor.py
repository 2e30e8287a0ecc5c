"""The machine's floor for the time sockets' tick: a server that does nothing but what the tick
must. One process on the server core answers each WebSocket handshake and then, at each whole
second, builds the service's time_update frame and writes it to every socket in a bare loop of
`socket.send`: no framework, no greenlets, no other work. `python -m bench.timesockets --all`
reads it with the same client processes, on the same core, as it reads the service, just before
each run, so the tick's p99 is compared with the floor's p99 of the same minute
(docs/bench/time-sockets.md).

    python -m bench.sendfloor [--sockets N] [--seconds S]      # the floor alone, read as the bench reads it
    python -m bench.sendfloor --serve PORT                     # the server (what the bench starts)
"""

import argparse
import base64
import datetime
import hashlib
import json
import math
import selectors
import socket
import time

from bench import clients, servers

# RFC 6455's GUID, hashed with the client's key into Sec-WebSocket-Accept.
ACCEPT_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC11B65"
# What a handshake may hold before the server gives up on it.
MAX_REQUEST = 8192
# The path the bench's readers ask for: the floor answers any.
PATH = "/time"


def time_update_frame(second):
    """The service's time_update for a whole second (sockets.time_update), as one text frame."""
    now = datetime.datetime.now(datetime.UTC)
    message = json.dumps({
        "type": "time_update",
        "formatted": datetime.datetime.fromtimestamp(second, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "timestamp": now.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
    }).encode()
    return bytes([0x81, len(message)]) + message


def answer(request):
    """The response to one request: 101 for a WebSocket upgrade, else an empty 200 (the bench asks
    GET / to learn the server is up)."""
    for line in request.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"sec-websocket-key":
            accept = base64.b64encode(hashlib.sha1(value.strip() + ACCEPT_GUID).digest())
            return (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                    b"Sec-WebSocket-Accept: " + accept + b"\r\n\r\n"), True
    return b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", False


def serve(port):
    """Serve the floor on port until killed."""
    listener = socket.create_server(("127.0.0.1", port), backlog=4096)
    listener.setblocking(False)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    requests, upgraded = {}, []
    next_second = math.floor(time.time()) + 1
    while True:
        if time.time() >= next_second:
            frame = time_update_frame(next_second)
            for connection in upgraded:
                try:
                    connection.send(frame)
                except OSError:  # a reader gone or a full buffer: the next second tries again
                    pass
            next_second = max(next_second + 1, math.floor(time.time()) + 1)
            continue
        for key, _ in selector.select(next_second - time.time()):
            if key.fileobj is listener:
                accept_all(listener, selector, requests)
                continue
            connection = key.fileobj
            try:
                data = connection.recv(MAX_REQUEST)
            except OSError:
                data = b""
            if not data:
                selector.unregister(connection)
                requests.pop(connection, None)
                connection.close()
                continue
            requests[connection] += data
            if b"\r\n\r\n" in requests[connection] or len(requests[connection]) > MAX_REQUEST:
                response, is_upgrade = answer(requests.pop(connection))
                connection.send(response)
                selector.unregister(connection)
                if is_upgrade:
                    upgraded.append(connection)
                else:
                    connection.close()


def accept_all(listener, selector, requests):
    while True:
        try:
            connection, _ = listener.accept()
        except BlockingIOError:
            return
        connection.setblocking(False)
        requests[connection] = b""
        selector.register(connection, selectors.EVENT_READ)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--serve", type=int, metavar="PORT")
    parser.add_argument("--sockets", type=int, default=10_000)
    parser.add_argument("--seconds", type=int, default=10)
    options = parser.parse_args()
    if options.serve:
        serve(options.serve)
        return
    servers.use_client_core()
    floor = servers.Floor()
    try:
        row = clients.read_every_socket(floor.port, [PATH] * options.sockets, options.seconds)
    finally:
        floor.stop()
    arrived = row["arrived_ms"]
    print(f"{options.sockets:,} WebSockets on loopback, the time_update frame written to each once a second for "
          f"{options.seconds} s by one process on core {servers.SERVER_CORE} in a bare send loop, read by "
          f"{clients.READER_PROCESSES} processes on core {servers.CLIENT_CORE} (kernel-stamped): arrived p50 / p99 / "
          f"max {arrived['p50']} / {arrived['p99']} / {arrived['max']} ms, {row['handshake_failures']} failed "
          f"handshakes, {row['skipped_seconds']} skipped seconds")


if __name__ == "__main__":
    main()
