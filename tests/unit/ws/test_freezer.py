"""The WebSockets' freezer (ws/freezer.py): when it freezes and thaws, on a recording collector,
and what that does to a real collector's heap, in a process of its own (a freeze is process-wide)."""

import subprocess
import sys

from liveserver import ROOT

from ws import freezer


class Collector:
    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        return lambda: self.calls.append(name)


def freezer_with(collector):
    heap = freezer.Freezer(collector)
    heap.enable()
    return heap


def after(heap, opened=0, closed=0, open_now=0):
    """Open and close that many sockets, then tick, with open_now sockets open."""
    for _ in range(opened):
        heap.socket_opened()
    for _ in range(closed):
        heap.socket_closed()
    heap.after_tick(open_now)


def frozen(collector, sockets):
    """A freezer that has just frozen this many open sockets, and the collector's calls cleared."""
    heap = freezer_with(collector)
    after(heap, opened=sockets, open_now=sockets)
    collector.calls.clear()
    return heap


def test_a_tick_after_sockets_opened_collects_then_freezes_once():
    collector = Collector()
    heap = freezer_with(collector)
    after(heap)
    after(heap, opened=8, open_now=8)
    after(heap, open_now=8)
    assert collector.calls == ["collect", "freeze"]


def test_a_freeze_waits_for_one_socket_in_a_hundred_of_those_frozen():
    collector = Collector()
    heap = frozen(collector, 1000)
    after(heap, opened=9, open_now=1009)
    assert collector.calls == []
    after(heap, opened=1, open_now=1010)
    assert collector.calls == ["collect", "freeze"]


def test_closes_past_a_quarter_of_the_frozen_sockets_thaw_collect_and_freeze_again():
    collector = Collector()
    heap = frozen(collector, 800)
    after(heap, closed=200, open_now=600)
    assert collector.calls == []
    after(heap, closed=1, open_now=599)
    assert collector.calls == ["unfreeze", "collect", "freeze"]
    # The count starts again from the sockets open at the thaw.
    after(heap, closed=149, open_now=450)
    assert collector.calls == ["unfreeze", "collect", "freeze"]


def test_a_thaw_waits_for_the_least_number_of_closes():
    collector = Collector()
    heap = frozen(collector, 200)
    after(heap, closed=freezer.LEAST_CLOSES_TO_THAW, open_now=100)
    assert collector.calls == []
    after(heap, closed=1, open_now=99)
    assert collector.calls == ["unfreeze", "collect", "freeze"]


def test_a_socket_opened_and_closed_every_second_thaws_the_heap_once_in_most_freezes():
    collector = Collector()
    heap = freezer_with(collector)
    for _ in range(3 * freezer.MOST_FREEZES + 10):
        heap.socket_opened()
        heap.after_tick(1)
        heap.socket_closed()
        heap.after_tick(0)
    assert collector.calls.count("unfreeze") == 3
    assert collector.calls.count("freeze") == 3 * freezer.MOST_FREEZES + 10 + 3


def test_a_freezer_not_enabled_leaves_the_collector_alone():
    collector = Collector()
    heap = freezer.Freezer(collector)
    heap.socket_opened()
    heap.socket_closed()
    heap.after_tick(0)
    assert collector.calls == []


REAL_HEAP = """
import gc, weakref
from ws import freezer

class Socket:
    def __init__(self):
        self.itself = self  # a cycle, as a Server and its outbox make

heap = freezer.Freezer()
heap.enable()
gc.collect()
gc.freeze()
frozen_at_start = gc.get_freeze_count()
sockets = [Socket() for _ in range(1000)]
for _ in sockets:
    heap.socket_opened()
heap.after_tick(len(sockets))
print(gc.get_freeze_count() - frozen_at_start >= 1000)
closed = [weakref.ref(socket) for socket in sockets[:300]]
del sockets[:300]
for _ in closed:
    heap.socket_closed()
gc.collect()
print(sum(socket() is not None for socket in closed))
heap.after_tick(len(sockets))
print(sum(socket() is not None for socket in closed), gc.get_freeze_count() - frozen_at_start >= 700)
"""


def test_frozen_sockets_stay_out_of_full_collections_until_a_thaw_frees_the_closed_ones():
    result = subprocess.run([sys.executable, "-c", REAL_HEAP], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.stdout.split() == ["True", "300", "0", "True"], result.stderr
