"""The live server fixtures, written once (tests/conftest.py loads them): a module's `server`,
started from its `env` in its `server_mode` and stopped at the module's end, its log checked; a
module changes what differs by overriding `server_settings`, `env`, `server_mode` or
`server_log_check`, and keeps the rest. A module whose tests run on both databases or in both run
modes binds the shared fixture to the name it overrides (`env = env_on_each_database`,
`server_mode = each_run_mode`): pytest names a fixture after the module attribute that holds it."""

import pytest
from githubscanning import Signer, serving_keys
from liveserver import RUN_MODES, cli_session, make_key, service_env, serving

# The public address of the modules whose servers send mail with links.
PUBLIC_URL = "https://api.example.com"


def mailing(smtp, **settings):
    """The settings of a server that mails through smtp, its links to PUBLIC_URL."""
    return {"MAIL_URL": smtp.url, "PUBLIC_URL": PUBLIC_URL, **settings}


@pytest.fixture(scope="module", params=RUN_MODES)
def run_mode(request):
    """Each live-server test that asks for it runs against both run modes: the Procfile's gunicorn,
    and `python app.py`'s fallback server with gunicorn unimportable (as on Windows)."""
    return request.param


@pytest.fixture(scope="module")
def server_settings():
    """The settings the module's server runs with beyond service_env's: none unless overridden."""
    return {}


@pytest.fixture(scope="module")
def env(tmp_path_factory, server_settings, server_mode):
    """The environment of the module's server and CLI: a fresh SQLite file for each server_mode, and
    server_settings. A module overrides it for a database of its parameters."""
    return service_env(tmp_path_factory.mktemp("server"), **server_settings)


@pytest.fixture(scope="module")
def server_mode():
    """The run mode of the module's server: the Procfile's gunicorn. A module whose tests run in
    both modes overrides it with `run_mode`."""
    return "gunicorn"


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def env_on_each_database(request, tmp_path_factory, server_settings):
    """The env of a module whose tests run on SQLite and on PostgreSQL: a fresh database of each
    kind, shared by both run modes, and server_settings."""
    return service_env(tmp_path_factory.mktemp("server"), request.param, **server_settings)


@pytest.fixture(scope="module")
def each_run_mode(run_mode):
    """The server_mode of a module whose tests run against both run modes (run_mode's)."""
    return run_mode


@pytest.fixture(scope="module")
def server_log_check():
    """Called with the server's whole log once it has stopped (beyond serving's "no traceback"): a
    module overrides it to assert that no secret of its tests was logged."""
    return lambda output: None


@pytest.fixture(scope="module")
def server(env, server_mode, server_log_check, tmp_path_factory):
    """The service for the module's tests, on env, in server_mode; afterwards its log holds no
    traceback and passes server_log_check."""
    with serving(tmp_path_factory.mktemp("server-log"), env, server_mode) as server:
        yield server
    server_log_check(server.output())


@pytest.fixture(scope="module")
def commands(env):
    """The command line on env's database, in one process for the module."""
    with cli_session(env) as session:
        yield session


@pytest.fixture(scope="module")
def live(tmp_path_factory, run_mode):
    """(server, secret): the server in each run mode on a fresh SQLite file, with one production key,
    and every documented operation served (GitHub's reports, its keys from a loopback server that
    signs none of the requests made here). Afterwards its log must hold no traceback and no trace of
    the secret."""
    tmp_path = tmp_path_factory.mktemp("live")
    with serving_keys(Signer("f" * 64)) as keys:
        env = service_env(tmp_path, GITHUB_SECRET_SCANNING="on", GITHUB_SECRET_SCANNING_KEYS_URL=keys.url)
        secret = make_key(env)
        with serving(tmp_path, env, run_mode) as server:
            yield server, secret
    output = server.output()
    assert secret not in output and secret[8:] not in output
