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


def test_a_tick_after_sockets_opened_collects_then_freezes_once():
    collector = Collector()
    heap = freezer_with(collector)
    heap.after_tick(0)
    for _ in range(8):
        heap.socket_opened()
    heap.after_tick(8)
    heap.after_tick(8)
    assert collector.calls == ["collect", "freeze"]


def test_a_freeze_waits_for_one_socket_in_a_hundred_of_those_frozen():
    collector = Collector()
    heap = freezer_with(collector)
    for _ in range(1000):
        heap.socket_opened()
    heap.after_tick(1000)
    collector.calls.clear()
    for _ in range(9):
        heap.socket_opened()
    heap.after_tick(1009)
    assert collector.calls == []
    heap.socket_opened()
    heap.after_tick(1010)
    assert collector.calls == ["collect", "freeze"]


def test_closes_past_a_quarter_of_the_frozen_sockets_thaw_collect_and_freeze_again():
    collector = Collector()
    heap = freezer_with(collector)
    for _ in range(800):
        heap.socket_opened()
    heap.after_tick(800)
    collector.calls.clear()
    for _ in range(200):
        heap.socket_closed()
    heap.after_tick(600)
    assert collector.calls == []
    heap.socket_closed()
    heap.after_tick(599)
    assert collector.calls == ["unfreeze", "collect", "freeze"]
    # The count starts again from the sockets open at the thaw.
    for _ in range(149):
        heap.socket_closed()
    heap.after_tick(450)
    assert collector.calls == ["unfreeze", "collect", "freeze"]


def test_a_thaw_waits_for_the_least_number_of_closes():
    collector = Collector()
    heap = freezer_with(collector)
    for _ in range(200):
        heap.socket_opened()
    heap.after_tick(200)
    for _ in range(freezer.LEAST_CLOSES_TO_THAW):
        heap.socket_closed()
    heap.after_tick(100)
    assert "unfreeze" not in collector.calls
    heap.socket_closed()
    heap.after_tick(99)
    assert collector.calls[-3:] == ["unfreeze", "collect", "freeze"]


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
