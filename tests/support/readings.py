"""What a live server shows of itself: its /metrics parsed, and its log lines parsed as JSON."""

import json

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families


def scrape(server, headers=None):
    """Return {(name, frozenset(labels)): value} from the server's /metrics."""
    response = requests.get(server.base + "/metrics", headers=headers, timeout=10)
    assert response.status_code == 200, response.text
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(response.text) for sample in family.samples}


def metric(server, name, **labels):
    return scrape(server).get((name, frozenset(labels.items())), 0.0)


def json_lines(server):
    """Every line the server wrote, each parsed as JSON (a line that is not JSON fails the test)."""
    parsed = []
    for line in server.output().splitlines():
        try:
            parsed.append(json.loads(line))
        except ValueError:
            pytest.fail(f"not a JSON line: {line!r}")
    return parsed
