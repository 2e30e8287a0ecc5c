"""One greenlet per worker that pings the WebSockets: a socket's reader (ws/wsserver.py) has it
watch the socket while it reads, and the socket answers for itself (`next_ping`, `held_back`,
`ping_or_give_up`)."""

import heapq
import itertools
import time
import weakref

import gevent


class Pinger:
    """One greenlet per worker pings each socket whose ping_interval has passed, once a second
    between two ticks of the time sockets (at x.5 s), instead of a timer per socket. The sockets
    wait in a heap by their next ping, so a sweep reads only those due: a look at every socket
    cost a worker with 10,000 time sockets more of its time than the ticks."""

    def __init__(self):
        self.servers = set()
        self.due = []
        self.order = itertools.count()
        self.sweeper = None

    def watch(self, server):
        self.servers.add(server)
        self._queue(server)
        if self.sweeper is None:
            self.sweeper = gevent.spawn(self._sweep)

    def forget(self, server):
        # Its place in the heap is dropped when it comes due; the heap holds it weakly, so a
        # closed socket is freed at once rather than up to a ping interval later.
        self.servers.discard(server)
        if not self.servers and self.sweeper is not None:
            # It stops with the last socket, so no greenlet outlives a test's server.
            self.sweeper.kill(block=False)
            self.sweeper = None
            self.due.clear()

    def _queue(self, server):
        heapq.heappush(self.due, (server.next_ping, next(self.order), weakref.ref(server)))

    def _sweep(self):
        while True:
            gevent.sleep(1.5 - time.time() % 1.0)
            self.ping_due(time.monotonic())

    def ping_due(self, now):
        """Ping (or give up on) each watched socket whose next ping is due by now and not held back."""
        later = []
        while self.due and self.due[0][0] <= now:
            _, _, watched = heapq.heappop(self.due)
            server = watched()
            if server is None or server not in self.servers:
                continue
            # A socket held back (or whose ping was put off by its wait) comes back at its next ping,
            # or at the next sweep if that has passed.
            if server.next_ping <= now and not server.held_back:
                server.ping_or_give_up()
            later.append(server)
        for server in later:
            self._queue(server)


PINGER = Pinger()
