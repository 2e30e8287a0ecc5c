"""The time sockets' figures second by second (bench/clients.py, bench/ticks.py): a run's p99
is the tail of its slowest ticks, so each tick's p99 and the median tick's ratio to the floor's
are reported beside it."""

import json
import time

from bench import clients, ticks


def tick(second):
    """The time socket's message for a whole second, built 1 ms after it."""
    moment = time.gmtime(second)
    return json.dumps({"type": "time_update", "formatted": time.strftime("%Y-%m-%d %H:%M:%S UTC", moment),
                       "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S.001Z", moment)})


def test_each_arrival_is_counted_under_its_second_and_each_second_gets_its_p99():
    window = {1_000, 1_001, 1_002}
    sockets = [[(second + late / 1000, tick(second)) for second, late in ((1_000, 5), (1_001, 7), (1_003, 1))]
               for _ in range(10)] + [[(1_001.050, tick(1_001))]]
    by_second = {second: [] for second in window}
    arrived, built, skipped = clients.lateness(sockets, window, by_second)
    assert len(arrived) == 21 and len(built) == 21
    assert skipped == 10 * 1 + 1 * 2  # 1,002 never came; the last socket had only 1,001
    assert [len(by_second[second]) for second in sorted(window)] == [10, 11, 0]
    assert clients.tick_p99s(by_second) == [5.0, 50.0, None]


def test_the_median_tick_s_ratio_leaves_one_slow_second_out():
    floor = [80.0, 82.0, 81.0, 103.0, 79.0]
    service = [82.0, 84.0, 83.0, 80.0, 81.0]
    assert ticks.median_tick_ratio(service, floor) == 1.01
    assert ticks.median_tick_ratio([None], floor) is None


def test_a_run_s_seconds_print_as_their_median_and_the_three_slowest():
    assert ticks.seconds_of([80.0, None, 82.0, 103.0, 79.0]) == "81.0, slowest 103.0 / 82.0 / 80.0"
    assert ticks.seconds_of([None]) == "-"
