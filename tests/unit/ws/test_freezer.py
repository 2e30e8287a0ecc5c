"""The time sockets' freezer (ws/freezer.py): when it freezes and thaws, on a recording collector,
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


def test_closes_past_a_quarter_of_the_frozen_sockets_thaw_collect_and_freeze_again():
    collector = Collector()
    heap = freezer_with(collector)
    for _ in range(8):
        heap.socket_opened()
    heap.after_tick(8)
    collector.calls.clear()
    heap.socket_closed()
    heap.socket_closed()
    heap.after_tick(6)
    assert collector.calls == []
    heap.socket_closed()
    heap.after_tick(5)
    assert collector.calls == ["unfreeze", "collect", "freeze"]
    # The count starts again from the sockets open at the thaw.
    heap.socket_closed()
    heap.after_tick(4)
    assert collector.calls == ["unfreeze", "collect", "freeze"]


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
sockets = [Socket() for _ in range(100)]
for _ in sockets:
    heap.socket_opened()
heap.after_tick(len(sockets))
print(gc.get_freeze_count() - frozen_at_start >= 100)
closed = [weakref.ref(socket) for socket in sockets[:30]]
del sockets[:30]
for _ in closed:
    heap.socket_closed()
gc.collect()
print(sum(socket() is not None for socket in closed))
heap.after_tick(len(sockets))
print(sum(socket() is not None for socket in closed), gc.get_freeze_count() - frozen_at_start >= 70)
"""


def test_frozen_sockets_stay_out_of_full_collections_until_a_thaw_frees_the_closed_ones():
    result = subprocess.run([sys.executable, "-c", REAL_HEAP], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.stdout.split() == ["True", "30", "0", "True"], result.stderr
