"""Contract fuzzing: schemathesis drives the live server from the description it serves, in each
configuration: every feature on (in both run modes), which serves the repository's openapi.json,
and a default deployment (GitHub's reports off), which leaves that operation out. Generated key
headers, odd headers and undocumented methods, with and without a valid key: every check must pass
(no 5xx, every status, header and body as described, 405 with Allow), and no traceback in the
server's log."""

import pytest
import requests
import schemathesis
from githubscanning import PATH as GITHUB_REPORTS
from hypothesis import HealthCheck, settings
from liveserver import make_key, service_env, serving

import openapi

FUZZED = settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
# What each deployment serves, known before its server starts; each fixture checks that its server
# serves exactly this.
EVERY_FEATURE = openapi.OPENAPI
BY_DEFAULT = openapi.described(lambda path, method: path != GITHUB_REPORTS)


def served(server):
    return requests.get(server.base + "/api/v1/openapi.json", timeout=30).json()


@pytest.fixture(scope="module")
def every_feature(live):
    assert served(live[0]) == EVERY_FEATURE
    return live


@pytest.fixture(scope="module")
def default_deployment(tmp_path_factory):
    """(server, secret): the Procfile's server with the default settings, and one production key."""
    tmp_path = tmp_path_factory.mktemp("default")
    env = service_env(tmp_path)
    secret = make_key(env)
    with serving(tmp_path, env) as server:
        assert served(server) == BY_DEFAULT
        yield server, secret
    assert secret not in server.output()


@schemathesis.openapi.from_dict(EVERY_FEATURE).parametrize()
@FUZZED
def test_generated_requests(case, every_feature):
    server, _ = every_feature
    case.call_and_validate(base_url=server.base)


@schemathesis.openapi.from_dict(EVERY_FEATURE).parametrize()
@FUZZED
def test_generated_requests_with_a_valid_key(case, every_feature):
    server, secret = every_feature
    case.call_and_validate(base_url=server.base, headers={"X-API-Key": secret})


@schemathesis.openapi.from_dict(BY_DEFAULT).parametrize()
@FUZZED
def test_generated_requests_to_a_default_deployment(case, default_deployment):
    server, _ = default_deployment
    case.call_and_validate(base_url=server.base)


@schemathesis.openapi.from_dict(BY_DEFAULT).parametrize()
@FUZZED
def test_generated_requests_to_a_default_deployment_with_a_valid_key(case, default_deployment):
    server, secret = default_deployment
    case.call_and_validate(base_url=server.base, headers={"X-API-Key": secret})
