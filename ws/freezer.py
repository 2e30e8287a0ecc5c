"""Time sockets frozen out of the garbage collector's full collections, in a serving process.

A time socket lives for minutes or hours and holds ~100 objects the collector tracks: at 10,000
sockets a full collection walks a million of them, 380-480 ms on machines of this kind, and the
tick of the second it falls in waits for it (docs/bench/time-sockets.md). Instead, right after a
tick, the objects of the sockets opened since are collected over (only what is not yet frozen:
milliseconds) and frozen, as the process's heap was before it served (serving/warmup.py). A frozen
object is never collected, so the cycles of closed sockets wait: once the sockets closed since the
last thaw pass a quarter of those frozen (CPython's own rule for a full collection), the next tick
is followed by one whole collection, then a freeze.
"""

import gc

THAW_SHARE = 0.25


class Freezer:
    """Counts the time sockets opened and closed, and after each tick freezes or thaws the heap.
    It does nothing until enable(): only a serving process freezes its heap (a test's must not)."""

    def __init__(self, collector=gc):
        self.collector = collector
        self.enabled = False
        self.opened = 0
        self.closed = 0
        self.frozen_sockets = 0

    def enable(self):
        self.enabled = True

    def socket_opened(self):
        self.opened += 1

    def socket_closed(self):
        self.closed += 1

    def after_tick(self, open_sockets):
        """Called by the ticker once a tick is sent, with the number of time sockets now open;
        return "freeze" or "thaw" for the full collection it ran, or None."""
        if not self.enabled:
            return None
        if self.closed > self.frozen_sockets * THAW_SHARE:
            self.collector.unfreeze()
            self.closed = 0
            kind = "thaw"
        elif self.opened:
            kind = "freeze"
        else:
            return None
        self.collector.collect()
        self.collector.freeze()
        self.opened = 0
        self.frozen_sockets = open_sockets
        return kind


FREEZER = Freezer()
