"""A newcomer's first hour: `.env` read by `python app.py`, gunicorn and the flask command alike (the
real environment winning) and `.env.example` true to the code; a busy port that ends the start at
once with the line to try; the SECRET_KEY warning of a service that looks deployed; and the files
that come with the code (.python-version, LICENSE). What happens at start is tested by starting
the service for real, in both run modes where `python app.py` has two."""

import fnmatch
import re
import secrets
import shutil
import socket
import sqlite3
import subprocess
import sys

import pytest
import requests
from liveserver import (
    ROOT,
    Server,
    free_port,
    procfile_command,
    run_cli,
    service_env,
    without_gunicorn,
)

from app import load_config
from serving import startup

# Every variable of the contract's configuration tables, and those the run modes read besides.
SETTINGS = {
    "DATABASE_URL", "SECRET_KEY", "RATELIMIT_STORAGE_URL", "RATE_LIMIT_TIERS", "PUBLIC_RATE_LIMIT",
    "TRUSTED_PROXIES", "HOST", "PORT", "MAX_KEYS_PER_USER", "MAX_BODY_BYTES", "PASSWORD_HASH_COST", "CORS_ORIGINS",
    "USAGE_HOURLY_RETENTION_DAYS", "USAGE_DAILY_RETENTION_DAYS", "REVOKED_KEY_RETENTION_DAYS",
    "WEBAUTHN_RP_ID", "WEBAUTHN_ORIGIN",
    "WEB_CONCURRENCY", "LOG_FORMAT", "METRICS_TOKEN", "WS_SEND_TIMEOUT", "PROMETHEUS_MULTIPROC_DIR",
    "WEBHOOK_RETRY_SCHEDULE", "WEBHOOK_ALLOW_PRIVATE", "ACCOUNT_RATE_LIMIT", "RATE_LIMIT_ON_STORAGE_FAILURE",
    "MAIL_URL", "MAIL_FROM", "PUBLIC_URL", "MAIL_RETRY_SCHEDULE",
    "GITHUB_SECRET_SCANNING", "GITHUB_SECRET_SCANNING_KEYS_URL",
    "BILLING_EXPORT", "BILLING_URL", "BILLING_API_KEY", "BILLING_METERS", "BILLING_RETRY_SCHEDULE",
}
EXAMPLE_LINE = re.compile(r"# ([A-Z_]+)=(.*)")
STRONG_KEY = "k3" * 16 + "0123456789abcdef"


def example_settings():
    """{name: default} of the commented settings in .env.example."""
    return dict(match.groups() for line in (ROOT / ".env.example").read_text().splitlines()
                if (match := EXAMPLE_LINE.fullmatch(line)))


def test_env_example_lists_every_setting():
    assert set(example_settings()) == SETTINGS
    assert set(load_config({"SECRET_KEY": "x"})) <= SETTINGS


def test_env_example_shows_the_real_defaults():
    unset = load_config({"SECRET_KEY": "x"})
    for name, default in example_settings().items():
        if name in unset and default:
            assert load_config({"SECRET_KEY": "x", name: default})[name] == unset[name], name


def test_env_is_kept_out_of_git_and_the_example_is_not():
    patterns = [line.strip() for line in (ROOT / ".gitignore").read_text().splitlines()]
    assert ".env" in patterns
    assert not any(fnmatch.fnmatch(".env.example", pattern) for pattern in patterns if pattern)


def env_without(env, *names):
    return {name: value for name, value in env.items() if name not in names}


def write_env_file(folder, **settings):
    (folder / ".env").write_text("".join(f"{name}={value}\n" for name, value in settings.items()))


def test_python_app_py_reads_env_with_the_real_environment_winning(tmp_path, run_mode):
    port = free_port()
    write_env_file(tmp_path, PORT=port, DATABASE_URL=f"sqlite:///{tmp_path}/from-env-file.db",
                   RATE_LIMIT_TIERS="free=7/hour", PUBLIC_RATE_LIMIT="1/hour")
    env = env_without(service_env(tmp_path), "DATABASE_URL", "RATE_LIMIT_TIERS", "FLASK_SKIP_DOTENV")
    assert env["PUBLIC_RATE_LIMIT"] == "off"
    if run_mode == "fallback":
        env = without_gunicorn(env)
    server = Server([sys.executable, str(ROOT / "app.py")], env, port, tmp_path / "app.log", run_mode, cwd=tmp_path)
    try:
        secret = re.search(r"sk_test_[A-Za-z0-9]{32,}", server.output())[0]
        test = requests.get(server.base + "/api/v1/protected/test", headers={"X-API-Key": secret}, timeout=10)
        assert test.headers["RateLimit-Policy"] == '"free";q=7;w=3600'
        # PUBLIC_RATE_LIMIT=off from the real environment, not .env's 1/hour.
        assert [requests.get(server.base + "/api/v1/status", timeout=10).status_code for _ in range(3)] == [200] * 3
    finally:
        server.stop()
    assert (tmp_path / "from-env-file.db").exists()


def test_the_procfile_s_gunicorn_reads_env(tmp_path):
    port = free_port()
    write_env_file(tmp_path, PORT=port, RATE_LIMIT_TIERS="free=7/hour")
    env = env_without(service_env(tmp_path), "RATE_LIMIT_TIERS", "FLASK_SKIP_DOTENV")
    cli_env = dict(env, RATE_LIMIT_TIERS="free=7/hour")
    run_cli(cli_env, "users", "create", "erin", "--email", "erin@example.com", "--password-stdin",
            stdin="a long password\n")
    secret = run_cli(cli_env, "keys", "create", "erin", "--name", "k", "--type", "production").stdout.split()[-1]
    settings, argv = procfile_command()
    assert argv == ["gunicorn", "-c", "gunicorn.conf.py", "app:app"]
    # The Procfile's command, started from another folder: the one with the .env.
    argv = ["gunicorn", "-c", str(ROOT / "gunicorn.conf.py"), "--chdir", str(ROOT), "app:app"]
    # PORT comes from .env alone: gunicorn.conf.py read it before choosing where to bind.
    server = Server(argv, dict(env, **settings), port, tmp_path / "gunicorn.log", cwd=tmp_path)
    try:
        test = requests.get(server.base + "/api/v1/protected/test", headers={"X-API-Key": secret}, timeout=10)
        assert test.headers["RateLimit-Policy"] == '"free";q=7;w=3600'
    finally:
        server.stop()


def test_the_flask_command_reads_env_with_the_real_environment_winning(tmp_path):
    write_env_file(tmp_path, DATABASE_URL=f"sqlite:///{tmp_path}/from-env-file.db",
                   RATE_LIMIT_TIERS="free=1/hour,pro=5/hour")
    env = env_without(service_env(tmp_path), "RATE_LIMIT_TIERS", "FLASK_SKIP_DOTENV")

    def flask(*args, stdin=None, skip=False):
        command = [sys.executable, "-m", "flask", "--app", str(ROOT / "app.py"), *args]
        return subprocess.run(command, cwd=tmp_path, env=dict(env, FLASK_SKIP_DOTENV="1") if skip else env,
                              input=stdin, capture_output=True, text=True, timeout=60)

    created = flask("users", "create", "erin", "--email", "erin@example.com", "--password-stdin",
                    stdin="a long password\n")
    assert created.returncode == 0, created.stderr
    # The tier "pro" exists only in .env's RATE_LIMIT_TIERS.
    assert flask("keys", "create", "erin", "--name", "k", "--type", "production", "--tier", "pro").returncode == 0
    refused = flask("keys", "create", "erin", "--name", "k2", "--type", "production", "--tier", "pro", skip=True)
    assert refused.returncode != 0 and "pro" in refused.stderr
    # DATABASE_URL from the real environment, not .env's.
    with sqlite3.connect(env["DATABASE_URL"].removeprefix("sqlite:///")) as connection:
        assert connection.execute("SELECT username FROM users").fetchall() == [("erin",)]
    assert not (tmp_path / "from-env-file.db").exists()


@pytest.fixture
def taken_port():
    """A port another program listens on, at 127.0.0.1."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def test_a_busy_port_ends_the_start_at_once_with_the_line_to_try(tmp_path, run_mode, taken_port):
    env = service_env(tmp_path, PORT=str(taken_port))
    if run_mode == "fallback":
        env = without_gunicorn(env)
    started = subprocess.run([sys.executable, "app.py"], cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=60)
    assert started.returncode == 1
    assert f"Port {taken_port} on 127.0.0.1 is already in use by another program." in started.stderr
    suggested = int(re.search(r"^    PORT=([0-9]+) python app\.py$", started.stderr, re.M)[1])
    assert suggested > taken_port
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", suggested))
    assert "Created user" not in started.stdout
    assert "Retrying" not in started.stderr and "Can't connect" not in started.stderr


def test_an_address_not_of_this_machine_ends_the_start_with_a_sentence(tmp_path):
    env = service_env(tmp_path, HOST="192.0.2.1", PORT="5000")  # TEST-NET-1: nobody's address
    started = subprocess.run([sys.executable, "app.py"], cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=60)
    assert started.returncode == 1
    assert started.stderr.startswith("Cannot listen on 192.0.2.1:5000 (")
    assert "check HOST" in started.stderr and "Created user" not in started.stdout


def copy_of_the_service(tmp_path):
    """The service's files in a folder of their own, so that a SECRET_KEY it generates is kept in
    that copy's instance/, not in the checkout's."""
    copy = tmp_path / "service"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns(
        ".git", ".venv", "venv", "tests", "bench", "docs", "instance", "__pycache__", ".pytest_cache", "*.db"))
    return copy


@pytest.mark.parametrize("settings, workers, warned", [
    ({}, 1, False),
    ({"SECRET_KEY": STRONG_KEY}, 4, False),
    ({"TRUSTED_PROXIES": "0", "WEB_CONCURRENCY": "1"}, 1, False),
    ({"TRUSTED_PROXIES": "1"}, 1, True),
    # The count the server starts, whatever WEB_CONCURRENCY says (gunicorn's -w wins over it).
    ({}, 4, True),
    ({"WEB_CONCURRENCY": "4"}, 1, False),
    ({"TRUSTED_PROXIES": "2", "SECRET_KEY": STRONG_KEY}, 1, False),
])
def test_secret_key_warning_only_where_the_service_looks_deployed(settings, workers, warned):
    warning = startup.secret_key_warning(settings, workers)
    assert (warning is not None) == warned
    if warned:
        assert "Every instance needs the same SECRET_KEY" in warning


@pytest.mark.parametrize("key, problem", [
    ("changeme", "is a well-known placeholder"),
    ("secret", "is a well-known placeholder"),
    ("dev", "is a well-known placeholder"),
    ("Change-Me", "is a well-known placeholder"),
    ("django-insecure-3kq8v1x0z7m2n5b4c6l9j8h7g6f5d4s3a2", "is a well-known placeholder"),
    ("your-secret-key-goes-here-0123456789abcdef", "is a well-known placeholder"),
    ("hunter2hunter2", "is only 14 characters long"),
    ("0123456789abcdef0123456789abcde", "is only 31 characters long"),
    ("x" * 64, "is made of fewer than 8 different characters"),
])
def test_a_weak_secret_key_is_warned_about_in_any_deployment(key, problem):
    warning = startup.secret_key_warning({"SECRET_KEY": key}, 1)
    assert warning.startswith(f"SECRET_KEY {problem}: ")
    if len(key) > 8:  # the sentence's own words hold "secret" and "dev"
        assert key not in warning


def test_a_random_secret_key_is_not_warned_about():
    # As SECRET_KEY_COMMAND makes them, and as secrets.token_urlsafe() does.
    for _ in range(200):
        assert startup.secret_key_warning({"SECRET_KEY": secrets.token_hex()}, 8) is None
        assert startup.secret_key_warning({"SECRET_KEY": secrets.token_urlsafe()}, 8) is None


def test_a_generated_secret_key_is_warned_about_at_start_when_deployed(tmp_path, run_mode):
    copy = copy_of_the_service(tmp_path)
    port = free_port()
    env = env_without(service_env(tmp_path, PORT=str(port)), "SECRET_KEY")
    settings, argv = procfile_command()
    if run_mode == "fallback":
        argv, env = [sys.executable, "app.py"], without_gunicorn(dict(env, **settings))
    else:
        env = dict(env, **settings)
    assert env["TRUSTED_PROXIES"] == "1"
    server = Server(argv, env, port, tmp_path / "server.log", run_mode, cwd=copy)
    try:
        assert server.wait_for_output("Every instance needs the same SECRET_KEY")
    finally:
        server.stop()
    assert (copy / "instance" / "secret_key").exists()


@pytest.mark.parametrize("how", ["-w", "GUNICORN_CMD_ARGS"])
def test_the_missing_secret_key_warning_counts_the_workers_gunicorn_starts(tmp_path, how):
    copy = copy_of_the_service(tmp_path)
    port = free_port()
    env = env_without(service_env(tmp_path, PORT=str(port), TRUSTED_PROXIES="0"), "SECRET_KEY", "WEB_CONCURRENCY")
    argv = ["gunicorn", "-c", "gunicorn.conf.py", "app:app"]
    if how == "-w":
        argv[1:1] = ["-w", "2"]
    else:
        env["GUNICORN_CMD_ARGS"] = "--workers 2"
    server = Server(argv, env, port, tmp_path / "server.log", cwd=copy)
    try:
        assert "looks deployed (2 workers)" in server.wait_for_output("Every instance needs the same SECRET_KEY")
        assert requests.get(server.base + "/api/v1/status", timeout=10).status_code == 200
    finally:
        server.stop()
    assert "Traceback" not in server.output()


@pytest.mark.parametrize("run_mode, key", [("gunicorn", "changeme"), ("fallback", "dev")])
def test_a_weak_secret_key_is_warned_about_at_every_start(tmp_path, run_mode, key):
    port = free_port()
    env = service_env(tmp_path, PORT=str(port), SECRET_KEY=key)
    if run_mode == "fallback":
        argv, env = [sys.executable, "app.py"], without_gunicorn(env)
    else:
        argv = ["gunicorn", "-c", "gunicorn.conf.py", "app:app"]
    for start in range(2):
        server = Server(argv, env, port, tmp_path / f"server-{start}.log", run_mode)
        try:
            assert server.wait_for_output("SECRET_KEY is a well-known placeholder: ")
        finally:
            server.stop()


def test_python_version_file_names_the_version_the_service_needs():
    assert (ROOT / ".python-version").read_text() == "3.11\n"


def test_the_licence_is_mit_and_names_the_data_files_own_licences():
    licence = (ROOT / "LICENSE").read_text()
    assert licence.startswith("MIT License\n\nCopyright (c) 2026 the API-key demo service authors\n")
    data_files = [path.name for path in (ROOT / "data").iterdir() if path.name != "README.md"]
    assert data_files and all(f"data/{name}" in licence for name in data_files)
    assert "BSD 3-Clause" in licence and "data/README.md" in licence


def test_python_app_py_version_prints_the_version_status_reports():
    import api

    printed = subprocess.run([sys.executable, "app.py", "--version"], cwd=ROOT, capture_output=True, text=True,
                             timeout=30, check=True).stdout
    assert printed == f"{api.VERSION}\n"
    assert re.fullmatch(r"[0-9]+\.[0-9]+\.[0-9]+", api.VERSION)
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert f"## [{api.VERSION}]" in changelog
