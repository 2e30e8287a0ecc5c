"""Contract fuzzing: schemathesis drives the Procfile's gunicorn server from openapi.json, with
generated key headers, odd headers and undocumented methods, with and without a valid key. Every
check must pass: no 5xx, every status, header and body as described, 405 with Allow, and no
traceback in the server's log."""

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from liveserver import ROOT, make_key, service_env, start_procfile


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("fuzz")
    env = service_env(tmp_path)
    secret = make_key(env)
    server = start_procfile(tmp_path, env)
    yield server, secret
    output = server.output()
    server.stop()
    assert "Traceback" not in output


# The file, which test_openapi.py shows is what the server serves.
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
