"""The Pinger's sweep (ws/pinger.py) on stand-in sockets: it pings what is due, puts off what is
held back, drops what it forgot, and reads no socket that is not due (its pings on real sockets:
test_wsserver.py)."""

import gc
import weakref

from ws import pinger


class Socket:
    """What the Pinger reads of a Server, counting the reads of next_ping."""

    def __init__(self, next_ping, interval=25):
        self._next_ping = next_ping
        self.interval = interval
        self.now = None
        self.held_back = False
        self.pings = 0
        self.reads = 0

    @property
    def next_ping(self):
        self.reads += 1
        return self._next_ping

    def ping_or_give_up(self):
        self.pings += 1
        self._next_ping = self.now + self.interval


def pinger_of(sockets, now):
    """A Pinger watching sockets, which take a ping as sent at now."""
    watching = pinger.Pinger()
    for socket in sockets:
        socket.now = now
        watching.servers.add(socket)
        watching._queue(socket)
    return watching


def test_a_sweep_pings_only_the_due_sockets_and_reads_no_other():
    due = [Socket(next_ping=99.0 + n / 10) for n in range(5)]
    waiting = [Socket(next_ping=100.5 + n) for n in range(1000)]
    watching = pinger_of(due + waiting, now=100.0)
    for socket in due + waiting:
        socket.reads = 0
    watching.ping_due(100.0)
    assert [socket.pings for socket in due] == [1] * 5
    assert all(socket.pings == 0 and socket.reads == 0 for socket in waiting)
    # Each pinged socket comes due again at its next ping, not before.
    watching.ping_due(124.0)
    assert [socket.pings for socket in due] == [1] * 5
    watching.ping_due(125.0)
    assert [socket.pings for socket in due] == [2] * 5


def test_a_socket_held_back_is_pinged_at_the_first_sweep_after_its_wait():
    socket = Socket(next_ping=10.0)
    watching = pinger_of([socket], now=11.0)
    socket.held_back = True
    watching.ping_due(11.0)
    watching.ping_due(12.0)
    assert socket.pings == 0
    # Its wait put the ping off (Server._hold_back adds the time waited).
    socket.held_back = False
    socket._next_ping = 12.5
    watching.ping_due(13.0)
    assert socket.pings == 1


def test_a_forgotten_socket_is_dropped_when_it_comes_due():
    kept, forgotten = Socket(next_ping=1.0), Socket(next_ping=1.0)
    watching = pinger_of([kept, forgotten], now=2.0)
    watching.servers.discard(forgotten)
    watching.ping_due(2.0)
    assert (kept.pings, forgotten.pings) == (1, 0)
    assert [entry[2]() for entry in watching.due] == [kept]


def test_the_heap_keeps_no_forgotten_socket_alive_until_it_comes_due():
    kept, forgotten = Socket(next_ping=1.0), Socket(next_ping=1.0)
    watching = pinger_of([kept, forgotten], now=2.0)
    watching.servers.discard(forgotten)
    gone = weakref.ref(forgotten)
    del forgotten
    gc.collect()
    assert gone() is None
    watching.ping_due(2.0)
    assert kept.pings == 1 and len(watching.due) == 1
