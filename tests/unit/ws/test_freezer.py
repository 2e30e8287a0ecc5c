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
    """Open that many sockets and close that many frozen ones, then tick with open_now sockets open."""
    for _ in range(opened):
        heap.socket_opened()
    for _ in range(closed):
        heap.socket_closed(opened_in=heap.epoch - 1)
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
    heap = frozen(collector, 8000)
    after(heap, closed=2000, open_now=6000)
    assert collector.calls == []
    after(heap, closed=1, open_now=5999)
    assert collector.calls == ["unfreeze", "collect", "freeze"]
    # The count starts again, from the sockets open at the thaw.
    after(heap, closed=1499, open_now=4500)
    assert collector.calls == ["unfreeze", "collect", "freeze"]
    after(heap, closed=1, open_now=4499)
    assert collector.calls == ["unfreeze", "collect", "freeze"] * 2


def test_a_thaw_waits_for_the_least_number_of_closes():
    collector = Collector()
    heap = frozen(collector, 2000)
    after(heap, closed=freezer.LEAST_CLOSES_TO_THAW, open_now=1000)
    assert collector.calls == []
    after(heap, closed=1, open_now=999)
    assert collector.calls == ["unfreeze", "collect", "freeze"]


def test_sockets_closed_before_a_freeze_reached_them_never_bring_a_thaw():
    collector = Collector()
    heap = frozen(collector, 8000)
    for _ in range(3000):
        heap.socket_closed(heap.socket_opened())
    heap.after_tick(8000)
    assert collector.calls == ["collect", "freeze"]


def test_a_frozen_heap_is_thawed_at_the_latest_after_most_ticks():
    collector = Collector()
    heap = frozen(collector, 10)
    for _ in range(freezer.MOST_TICKS_FROZEN - 2):
        after(heap, open_now=10)
    assert collector.calls == []
    after(heap, open_now=10)
    assert collector.calls == ["unfreeze", "collect", "freeze"]


def test_a_socket_opened_and_closed_every_second_thaws_the_heap_once_in_most_freezes():
    collector = Collector()
    heap = freezer_with(collector)
    for _ in range(3 * freezer.MOST_FREEZES + 10):
        opened_in = heap.socket_opened()
        heap.after_tick(1)
        heap.socket_closed(opened_in)
        heap.after_tick(0)
    assert collector.calls.count("unfreeze") == 3
    assert collector.calls.count("freeze") == 3 * freezer.MOST_FREEZES + 10 + 3


def test_a_freezer_not_enabled_leaves_the_collector_alone():
    collector = Collector()
    heap = freezer.Freezer(collector)
    heap.socket_closed(heap.socket_opened())
    heap.after_tick(0)
    assert collector.calls == []


REAL_HEAP = """
import gc, weakref
from ws import freezer

class Socket:
    def __init__(self):
        self.itself = self  # a cycle, as a Server and its reader make

heap = freezer.Freezer()
heap.enable()
gc.collect()
gc.freeze()
frozen_at_start = gc.get_freeze_count()
sockets = [Socket() for _ in range(5000)]
opened_in = [heap.socket_opened() for _ in sockets]
heap.after_tick(len(sockets))
print(gc.get_freeze_count() - frozen_at_start >= 5000)
closed = [weakref.ref(socket) for socket in sockets[:1500]]
del sockets[:1500]
for epoch in opened_in[:1500]:
    heap.socket_closed(epoch)
gc.collect()
print(sum(socket() is not None for socket in closed))
heap.after_tick(len(sockets))
print(sum(socket() is not None for socket in closed), gc.get_freeze_count() - frozen_at_start >= 3500)
"""


def test_frozen_sockets_stay_out_of_full_collections_until_a_thaw_frees_the_closed_ones():
    result = subprocess.run([sys.executable, "-c", REAL_HEAP], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.stdout.split() == ["True", "1500", "0", "True"], result.stderr
