"""The time sockets' seconds side by side: a run's p99 is the tail of its slowest seconds, and one
slow second of the machine's can decide it, so each second's p99 (bench/clients.py's tick_p99s) is
summed up here beside the floor's."""

import statistics


def median_tick_ratio(ticks, floor_ticks):
    """The service's median tick p99 ÷ the floor's: the typical second against the floor's, which
    one slow second of either (a run's p99 is the tail of its slowest ticks) does not decide."""
    ticks, floor_ticks = [t for t in ticks if t is not None], [t for t in floor_ticks if t is not None]
    if not ticks or not floor_ticks:
        return None
    return round(statistics.median(ticks) / statistics.median(floor_ticks), 2)


def seconds_of(ticks):
    """A run's seconds as printed: the median second's p99, then the three slowest."""
    ticks = [tick for tick in ticks if tick is not None]
    if not ticks:
        return "-"
    slowest = " / ".join(f"{tick:.1f}" for tick in sorted(ticks, reverse=True)[:3])
    return f"{statistics.median(ticks):.1f}, slowest {slowest}"
