"""bench/capacity.py's report: the statuses other than 200, named."""

from bench import capacity


def test_other_statuses_name_each_status_but_200():
    assert capacity.other_statuses({200: 985, 503: 15}) == "15 x 503"
    assert capacity.other_statuses({200: 1000}) == "0"
