"""metering/thresholds.py: where a window's allowance reaches 80 % and 100 %."""

from metering import thresholds


def test_threshold_marks_for_small_and_large_allowances():
    assert thresholds.marks(1) == {0: 100} and thresholds.marks(5) == {1: 80, 0: 100}
    assert thresholds.marks(1000) == {200: 80, 0: 100} and thresholds.marks(7) == {1: 80, 0: 100}
