"""WebSockets frozen out of the garbage collector's full collections, in a serving process.

A socket lives for minutes or hours and holds ~100 objects the collector tracks: at 10,000 time
sockets a full collection walks a million of them, 380-480 ms on machines of this kind, and the
tick of the second it falls in waits for it (docs/bench/time-sockets.md). Instead, right after a
tick, once enough sockets opened since the last freeze (one in a hundred of those frozen), a full
collection walks only what is not yet frozen (milliseconds) and `gc.freeze()` moves what is left
out of the way, as the process's heap was before it served (serving/warmup.py).

A frozen object is never collected: the cycles of the sockets closed since, and of the requests
in flight at a freeze, wait for a thaw, which collects everything once, right after a tick, and
freezes again. It comes once the sockets closed pass a quarter of those frozen (CPython's own rule
for a full collection) and LEAST_CLOSES_TO_THAW, or after MOST_FREEZES freezes: a client that opens
and closes a socket every second cannot make the worker walk its whole heap every second, and what
waits stays bounded.
"""

import gc

FREEZE_SHARE = 0.01
THAW_SHARE = 0.25
LEAST_CLOSES_TO_THAW = 100
MOST_FREEZES = 60


class Freezer:
    """Counts the WebSockets opened and closed, and after each tick freezes or thaws the heap.
    It does nothing until enable(): only a serving process freezes its heap (a test's must not)."""

    def __init__(self, collector=gc):
        self.collector = collector
        self.enabled = False
        self.opened = 0
        self.closed = 0
        self.freezes = 0
        self.frozen_sockets = 0

    def enable(self):
        self.enabled = True

    def socket_opened(self):
        self.opened += 1

    def socket_closed(self):
        self.closed += 1

    def after_tick(self, open_sockets):
        """Called by the ticker once a tick is sent, with the number of WebSockets now open;
        return "freeze" or "thaw" for the full collection it ran, or None."""
        if not self.enabled:
            return None
        if (self.closed > max(self.frozen_sockets * THAW_SHARE, LEAST_CLOSES_TO_THAW)
                or self.freezes >= MOST_FREEZES):
            self.collector.unfreeze()
            self.closed = self.freezes = 0
            kind = "thaw"
        elif self.opened and self.opened >= self.frozen_sockets * FREEZE_SHARE:
            self.freezes += 1
            kind = "freeze"
        else:
            return None
        self.collector.collect()
        self.collector.freeze()
        self.opened = 0
        self.frozen_sockets = open_sockets
        return kind


FREEZER = Freezer()
