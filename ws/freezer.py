"""WebSockets frozen out of the garbage collector's full collections, in a serving process.

A socket lives for minutes or hours and holds ~100 objects the collector tracks: at 10,000 time
sockets a full collection walks a million of them, 380-480 ms on machines of this kind, and the
tick of the second it falls in waits for it (docs/bench/time-sockets.md). Instead, right after a
tick, once enough sockets opened since the last freeze (one in a hundred of those frozen), a full
collection walks only what is not yet frozen (milliseconds) and `gc.freeze()` moves what is left
out of the way, as the process's heap was before it served (serving/warmup.py).

A frozen object is never collected: the cycles of frozen sockets that close, and of the requests
in flight at a freeze, wait for a thaw, which collects everything (the start-up heap too) once,
right after a tick, and freezes again. It comes once the frozen sockets closed pass a quarter of
those frozen (CPython's own rule for a full collection) and LEAST_CLOSES_TO_THAW, which a client
churning sockets cannot reach every second; after MOST_FREEZES freezes; and at the latest
MOST_TICKS_FROZEN ticks after the last thaw: what waits is bounded in amount and in time.
"""

import gc

FREEZE_SHARE = 0.01
THAW_SHARE = 0.25
LEAST_CLOSES_TO_THAW = 1000
MOST_FREEZES = 60
MOST_TICKS_FROZEN = 600


class Freezer:
    """Counts the WebSockets opened and the frozen ones closed, and after each tick freezes or
    thaws the heap. It does nothing until enable(): only a serving process freezes its heap (a
    test's must not)."""

    def __init__(self, collector=gc):
        self.collector = collector
        self.enabled = False
        # Freezes and thaws so far: a socket opened before the latest one was frozen by it.
        self.epoch = 0
        self.opened = 0
        self.closed = 0
        self.freezes = 0
        self.ticks = 0
        self.frozen_sockets = 0

    def enable(self):
        self.enabled = True

    def socket_opened(self):
        """Count a socket opened; return the epoch to hand back to socket_closed."""
        self.opened += 1
        return self.epoch

    def socket_closed(self, opened_in):
        if opened_in < self.epoch:
            self.closed += 1

    def after_tick(self, open_sockets):
        """Called by the ticker once a tick is sent, with the number of WebSockets now open;
        return "freeze" or "thaw" for the full collection it ran, or None."""
        if not self.enabled:
            return None
        self.ticks += 1
        if (self.closed > max(self.frozen_sockets * THAW_SHARE, LEAST_CLOSES_TO_THAW)
                or self.freezes >= MOST_FREEZES or self.ticks >= MOST_TICKS_FROZEN):
            self.collector.unfreeze()
            self.closed = self.freezes = self.ticks = 0
            kind = "thaw"
        elif self.opened and self.opened >= self.frozen_sockets * FREEZE_SHARE:
            self.freezes += 1
            kind = "freeze"
        else:
            return None
        self.collector.collect()
        self.collector.freeze()
        self.epoch += 1
        self.opened = 0
        self.frozen_sockets = open_sockets
        return kind


FREEZER = Freezer()
