"""Contract fuzzing: schemathesis drives the live server in both run modes from openapi.json, with
generated key headers, odd headers and undocumented methods, with and without a valid key. Every
check must pass: no 5xx, every status, header and body as described, 405 with Allow, and no
traceback in the server's log."""

import schemathesis
from hypothesis import HealthCheck, settings
from liveserver import ROOT

# The file, which tests/unit/test_openapi.py shows is what the server serves.
schema = schemathesis.openapi.from_path(ROOT / "openapi.json")


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_generated_requests(case, live):
    server, _ = live
    case.call_and_validate(base_url=server.base)


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_generated_requests_with_a_valid_key(case, live):
    server, secret = live
    case.call_and_validate(base_url=server.base, headers={"X-API-Key": secret})
