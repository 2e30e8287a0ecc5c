"""Fixtures: an app on a temporary SQLite file with in-memory limits, its clients, a user, keys, and a
client logged in to the web application; the slow marker and the order of the files, both read from
the folders (unit/, live/, browser/)."""

import atexit
import collections
import contextlib
import os
import shutil
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent
# The shared helpers (live servers, private services, clocks, receivers) import as top-level modules.
sys.path.insert(0, str(TESTS / "support"))

# app.py builds `app = create_app()` on import: point it at throwaway state first.
_import_dir = tempfile.mkdtemp(prefix="apiservice-import-")
# Gone with the process, which each test process (and the run's controller) would otherwise leave.
atexit.register(shutil.rmtree, _import_dir, ignore_errors=True)
os.environ["DATABASE_URL"] = f"sqlite:///{_import_dir}/import.db"
os.environ.setdefault("SECRET_KEY", "test-secret")
# scrypt at a test's cost, for the in-process apps and the live servers (whose environment starts
# from this one): the service's default takes ~0.1 s of a core per hash, and the tests make
# thousands. A test about what a hash costs sets the default back.
os.environ.setdefault("PASSWORD_HASH_COST", "1024")
# Bytecode written and read, even where PYTHONDONTWRITEBYTECODE is set (as on some CI machines):
# without it each of the run's hundreds of Python processes (workers, servers, CLIs) compiles the
# service's modules anew, ~0.1 s of a core each, and each worker rewrites every test module in
# every run. This process writes the service's bytecode as it imports the app below, before the
# workers start; on a clean clone the workers still rewrite the test modules once, side by side.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

import pytest  # noqa: E402
import services  # noqa: E402
from appconfig import APP_SETTINGS, build_schema, share_compiled_templates  # noqa: E402
from gevent._hub_local import get_hub_if_exists  # noqa: E402
from mailserver import mail_server  # noqa: E402

from accounts import users  # noqa: E402
from app import close_app, create_app  # noqa: E402
from keys import keycache  # noqa: E402
from orgs import keyactions  # noqa: E402

# The live server fixtures: `server`, its `env`, `server_mode`, `run_mode`, `commands`, `live`.
pytest_plugins = ["serverfixtures"]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item):
    """gevent's timers count from the time its loop last read, which stands still while the loop
    does not run: after the blocking work of earlier tests (minutes of it on a loaded machine), a
    `joinall(timeout=10)` or `gevent.Timeout(0.5)` would end at once. Read the time afresh when
    each test starts, after its fixtures."""
    hub = get_hub_if_exists()
    if hub is not None:
        hub.loop.update_now()


def pytest_sessionfinish(session):
    services.stop_redis()
    services.drop_session_database()


# pytest keeps each test module with its assertions rewritten in __pycache__, but on a clean
# checkout six workers collecting at once all missed it and each rewrote every module: 25 s of CPU
# and 12 s of the start on 2 cores. Two workers (one a core) collect at once; the others start
# once the first has written the cache.
COLLECTING_FIRST = {"gw0", "gw1"}


def collected_marker(config):
    """The file the first worker makes once it has collected, in the run's own base temporary
    folder (each worker's is a folder of it)."""
    return Path(config.option.basetemp).parent / "gw0-collected"


@pytest.hookimpl(tryfirst=True)
def pytest_collection(session):
    workerinput = getattr(session.config, "workerinput", None)
    if workerinput is None or workerinput["workerid"] in COLLECTING_FIRST:
        return
    deadline = time.monotonic() + 60
    while not collected_marker(session.config).exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def pytest_collection_finish(session):
    workerinput = getattr(session.config, "workerinput", None)
    if workerinput is not None and workerinput["workerid"] == "gw0":
        collected_marker(session.config).touch()


# What `-m "not slow"` leaves out: every file under live/ and browser/ (the latter also `browser`,
# what `-m "not browser"` leaves out). A test in unit/ that asks for a live server belongs in live/;
# its run stops at collection, naming it.
SLOW_FOLDERS = {"live", "browser"}
# Which files start first: a browser test takes longest, a live one next.
FOLDER_ORDER = {"browser": 0, "live": 1, "unit": 2}
LIVE_FIXTURES = {"live", "server", "servers", "fallback", "cluster", "run_mode"}


def folder_of(item):
    return item.path.relative_to(TESTS).parts[0]


def pytest_collection_modifyitems(items):
    for item in items:
        folder = folder_of(item)
        if folder in SLOW_FOLDERS:
            item.add_marker(pytest.mark.slow)
        if folder == "browser":
            item.add_marker(pytest.mark.browser)
        if folder == "unit" and LIVE_FIXTURES & set(item.fixturenames):
            raise pytest.UsageError(f"{item.nodeid} starts a live server: its place is tests/live/")


@pytest.hookimpl(trylast=True, specname="pytest_collection_modifyitems")
def pytest_collection_modifyitems_longest_first(items):
    """After pytest's own ordering (parameters of module fixtures grouped), the files of browser/,
    then live/, then unit/, each folder's files by their number of tests, most first. pytest-xdist
    hands out whole files (--dist loadfile) in the order collected (pytest.ini's
    --no-loadscope-reorder keeps it): the slowest files start at once and the short unit files fill
    the workers' ends."""
    tests_in = collections.Counter(item.path for item in items)
    items.sort(key=lambda item: (FOLDER_ORDER.get(folder_of(item), len(FOLDER_ORDER)), -tests_in[item.path],
                                 str(item.path)))


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request, tmp_path):
    """Each test that uses the database runs on SQLite and on PostgreSQL. For a test that makes its
    apps with the `app` or `make_app` fixture the database already holds the schema they would
    build, built once per worker and copied (SQLite) or emptied of rows (PostgreSQL): building it
    for each test took a third of the unit tests' time. Otherwise, and in a module marked
    `empty_database` (one that loads an earlier release's schema), it is empty."""
    built = bool({"app", "make_app"} & set(request.fixturenames)) \
        and request.node.get_closest_marker("empty_database") is None
    if request.param == "postgresql":
        return services.postgres_url_as_built(build_schema) if built else services.postgres_url()
    path = tmp_path / "test.db"
    if built:
        shutil.copyfile(request.getfixturevalue("sqlite_schema"), path)
    return f"sqlite:///{path}"


@pytest.fixture(scope="session")
def sqlite_schema(tmp_path_factory):
    """A SQLite file holding what the `app` fixture's app builds in an empty one, whole in its main
    file (no -wal beside it), to copy."""
    folder = tmp_path_factory.mktemp("schema")
    build_schema(f"sqlite:///{folder}/built.db")
    with contextlib.closing(sqlite3.connect(folder / "built.db")) as built, \
            contextlib.closing(sqlite3.connect(folder / "schema.db")) as copy:
        built.backup(copy)
    return folder / "schema.db"


@pytest.fixture
def app(database_url):
    app = share_compiled_templates(create_app({**APP_SETTINGS, "DATABASE_URL": database_url}))
    with app.app_context():
        yield app
    close_app(app)


@pytest.fixture
def make_app():
    """create_app for a test that needs apps of its own settings; each is closed afterwards."""
    made = []

    def make(overrides):
        made.append(share_compiled_templates(create_app(overrides)))
        return made[-1]

    yield make
    for app in made:
        close_app(app)


@pytest.fixture
def smtp():
    """A real SMTP server (aiosmtpd) on a free loopback port for the test (tests/support/mailserver.py);
    a module that serves one server for all its tests keeps its own, module-scoped."""
    with mail_server() as server:
        yield server


@pytest.fixture
def client(app):
    return app.test_client()


@pytest.fixture
def runner(app):
    return app.test_cli_runner()


@pytest.fixture
def user(app):
    return users.create_user("alice", "alice@example.com", "correct horse battery")


@pytest.fixture
def api_key(user):
    """The secret of an active development key of tier free (3/minute in tests)."""
    _, secret = keyactions.issue_key(user, "Alice dev", "development")
    return secret


@pytest.fixture
def pro_key(user):
    """The secret of an active production key of tier pro (100/minute in tests)."""
    _, secret = keyactions.issue_key(user, "Alice live", "production", "pro")
    return secret


@pytest.fixture
def logged_in(client, user):
    """The client, logged in to the web application as alice."""
    response = client.post("/login", data={"username": "alice", "password": "correct horse battery"})
    assert response.status_code == 302
    return client


@pytest.fixture
def lookups(monkeypatch):
    """The hashes the key cache reads from the database, in order."""
    read = []
    find = keycache.find_active_key

    def counting_find(key_hash):
        read.append(key_hash)
        return find(key_hash)

    monkeypatch.setattr(keycache, "find_active_key", counting_find)
    return read
