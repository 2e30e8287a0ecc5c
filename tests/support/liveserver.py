"""Helpers that start the real service on a free port in either run mode (the Procfile's gunicorn
command, or `python app.py`'s fallback server where gunicorn cannot be imported, as on Windows), and
run the real CLI against its database."""

import contextlib
import itertools
import json
import os
import random
import re
import shlex
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import requests
import services

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PASSWORD = "tangerine submarine 42"
SECRET_PATTERN = re.compile(r'id="new-secret"[^>]*>(sk_(?:live|test)_[A-Za-z0-9]+)<')
# "gunicorn": the Procfile's command; "fallback": `python app.py` with gunicorn unimportable.
RUN_MODES = ["gunicorn", "fallback"]
# A sitecustomize.py that makes `import gunicorn` fail, as on Windows.
NO_GUNICORN = ROOT / "tests" / "fixtures" / "no_gunicorn"
addresses = (f"10.9.{n // 250}.{n % 250 + 1}" for n in itertools.count())
# Test servers listen from here up to the kernel's range for outgoing connections.
FIRST_PORT = 10000
PORT_CHOICE = random.SystemRandom()
usernames = (f"user{n}" for n in itertools.count())


def free_port():
    """A port that no socket holds now, below the kernel's range for outgoing connections. A port
    from bind(0) comes from that range, and a client's connection (any test's) could take it
    before the server meant for it binds it, which then fails to start ("already in use")."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as ports:
        first_ephemeral = int(ports.read().split()[0])
    for _ in range(1000):
        # Not the random module's generator, which a test may seed alike in every worker.
        port = PORT_CHOICE.randrange(FIRST_PORT, first_ephemeral)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError(f"no free port between {FIRST_PORT} and {first_ephemeral}")


def service_env(tmp_path, database="sqlite", **extra):
    """Return the environment of a server on a fresh database: "sqlite" or "postgresql"."""
    env = dict(os.environ)
    env.update({
        "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        "DATABASE_URL": services.postgres_url() if database == "postgresql" else f"sqlite:///{tmp_path}/server.db",
        # Long and varied enough not to be warned about (startup.weak_secret_key).
        "SECRET_KEY": "test-secret-of-the-live-servers-9f3c2a7e1b5d",
        "RATE_LIMIT_TIERS": "free=100000/hour,tiny=2/minute",
        "PUBLIC_RATE_LIMIT": "off",
        "PYTHONUNBUFFERED": "1",
        # A developer's .env must not change what the tests run (the servers and the CLI skip it).
        "FLASK_SKIP_DOTENV": "1",
    })
    env.update(extra)
    return env


def run_cli(env, *args, stdin=None):
    return subprocess.run([sys.executable, "-m", "flask", "--app", "app", *args], cwd=ROOT, env=env,
                          input=stdin, capture_output=True, text=True, timeout=60)


def cli(env, *args, stdin=None):
    """Run `flask --app app ARGS` against env's database; return its stdout."""
    result = run_cli(env, *args, stdin=stdin)
    assert result.returncode == 0, result.stderr
    return result.stdout


class CliSession:
    """The command line's commands run in one process of their own that loads the app once (the
    same commands, through Flask's CLI runner, against env's database and limit storage): a test
    that runs fifty of them pays one start instead of fifty."""

    DRIVER = ("import json, sys\n"
              "from app import app\n"
              "runner = app.test_cli_runner()\n"
              "for line in sys.stdin:\n"
              "    args, stdin = json.loads(line)\n"
              "    result = runner.invoke(args=args, input=stdin)\n"
              "    print(json.dumps([result.exit_code, result.stdout, result.output]), flush=True)\n")

    def __init__(self, env):
        self.process = subprocess.Popen([sys.executable, "-c", self.DRIVER], cwd=ROOT, env=env, text=True,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def __call__(self, *args, stdin=None):
        """Run one command (with stdin as its input); return its stdout, as cli() does, asserting it
        succeeded."""
        self.process.stdin.write(json.dumps([args, stdin]) + "\n")
        self.process.stdin.flush()
        code, stdout, output = json.loads(self.process.stdout.readline())
        assert code == 0, output
        return stdout

    def close(self):
        self.process.stdin.close()
        self.process.wait(timeout=30)


@contextlib.contextmanager
def cli_session(env):
    session = CliSession(env)
    try:
        yield session
    finally:
        session.close()


def make_key(env, tier="free", commands=None, user="carol"):
    """Create a production key of the tier for the user (made on first use); return the secret.
    commands: a CliSession on env, to run the commands in (else they run in one of their own)."""
    if commands is None:
        with cli_session(env) as commands:
            return make_key(env, tier, commands, user)
    try:
        exists = commands("keys", "list", user) is not None
    except AssertionError:
        exists = False
    if not exists:
        commands("users", "create", user, "--email", f"{user}@example.com", "--password-stdin",
                 stdin="a long password\n")
    return commands("keys", "create", user, "--name", f"{tier} key", "--type", "production",
                    "--tier", tier).strip().splitlines()[-1]


def without_gunicorn(env):
    """env for a Python in which `import gunicorn` fails, as on Windows."""
    return dict(env, PYTHONPATH=os.pathsep.join(filter(None, [str(NO_GUNICORN), env.get("PYTHONPATH")])))


class Server:
    def __init__(self, command, env, port, log_path, mode="gunicorn", cwd=ROOT):
        self.base = f"http://127.0.0.1:{port}"
        self.mode = mode
        self.log_path = log_path
        self.log = open(log_path, "w")
        self.process = subprocess.Popen(command, cwd=cwd, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        try:
            self.wait_until_serving(port)
        except BaseException:
            # However the wait ends (a timeout, Ctrl-C, a stop), the server ends with it.
            self.stop()
            raise

    def wait_until_serving(self, port):
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.output()
            # The server's own listening line (gunicorn's, or the fallback's, which ends alike), so a
            # server of another test run on the same port is not taken for ours.
            if f":{port} (" in self.output():
                try:
                    requests.get(self.base + "/api/v1/status", timeout=5)
                    return
                except requests.RequestException:
                    pass
            time.sleep(0.1)
        raise AssertionError("server did not start:\n" + self.output())

    def output(self):
        if not self.log.closed:
            self.log.flush()
        return Path(self.log_path).read_text()

    def wait_for_output(self, text, seconds=60):
        """Return the output once it contains text; fail after `seconds` (generous, for a loaded
        machine: it returns as soon as the text is there)."""
        deadline = time.monotonic() + seconds
        while text not in (output := self.output()):
            assert time.monotonic() < deadline, f"{text!r} never appeared in:\n{output}"
            time.sleep(0.05)
        return output

    def stop(self, sig=signal.SIGTERM):
        if self.process.poll() is None:
            # As a platform does: the signal goes to the whole process group.
            os.killpg(self.process.pid, sig)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.log.close()
        return self.process.returncode


def procfile_command():
    """Return the Procfile's web process as (NAME=value settings, argv)."""
    line = (ROOT / "Procfile").read_text().strip()
    assert line.startswith("web: ")
    words = shlex.split(line.removeprefix("web: "))
    settings = dict(word.split("=", 1) for word in words if re.fullmatch(r"[A-Z_]+=\S*", word))
    return settings, words[len(settings):]


def start_procfile(tmp_path, env):
    port = free_port()
    settings, argv = procfile_command()
    env = dict(env, **settings, PORT=str(port))
    return Server(argv, env, port, tmp_path / f"gunicorn-{port}.log")


def start_instances(tmp_path, env, count=2):
    """count instances of the Procfile's gunicorn on env, as behind a load balancer. When one fails
    to start, those already started are stopped before the failure is raised: no test leaves a
    server running."""
    servers = []
    try:
        for _ in range(count):
            servers.append(start_procfile(tmp_path, env))
    except BaseException:
        for server in servers:
            server.stop()
        raise
    return servers


def start_server(tmp_path, env, mode="gunicorn"):
    """The service in a run mode (RUN_MODES) on a free port, with the Procfile's settings in both."""
    if mode == "gunicorn":
        return start_procfile(tmp_path, env)
    port = free_port()
    settings, _ = procfile_command()
    env = without_gunicorn(dict(env, **settings, HOST="127.0.0.1", PORT=str(port)))
    return Server([sys.executable, "app.py"], env, port, tmp_path / f"fallback-{port}.log", mode)


@contextlib.contextmanager
def serving(tmp_path, env, mode="gunicorn"):
    """The server for a module's tests; afterwards its log must hold no traceback."""
    server = start_server(tmp_path, env, mode)
    try:
        yield server
    finally:
        output = server.output()
        server.stop()
    assert "Traceback" not in output


def stored_total(database_url, key):
    """Return the key's total_requests as the database holds it."""
    sql = "SELECT total_requests FROM api_keys WHERE display_prefix = %s"
    if database_url.startswith("sqlite"):
        with sqlite3.connect(database_url.removeprefix("sqlite:///")) as connection:
            return connection.execute(sql.replace("%s", "?"), (key[:12],)).fetchone()[0]
    with psycopg.connect(database_url) as connection:
        return connection.execute(sql, (key[:12],)).fetchone()[0]


def assert_served_and_stored(server, env, key, count):
    """Send count requests with a key that has made none yet, each answered 200, and wait until
    env's database holds all of them in the key's total."""
    for _ in range(count):
        assert requests.get(server.base + "/api/v1/protected/test", headers={"X-API-Key": key},
                            timeout=10).status_code == 200
    wait_for(lambda: stored_total(env["DATABASE_URL"], key) == count)


def children(pid):
    """The pids of a process's children, from /proc (Linux)."""
    found = []
    for child in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{child}/stat") as stat:
                if int(stat.read().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(child))
        except OSError:
            continue
    return found


def metrics_folder(master_pid):
    """The private folder where a gunicorn master's workers keep their metrics, from the files they map."""
    for pid in children(master_pid):
        try:
            with open(f"/proc/{pid}/maps") as maps:
                found = re.search(r"(/\S*apiservice-metrics-[^/\s]+)/", maps.read())
        except OSError:
            continue
        if found:
            return found.group(1)
    raise AssertionError("no worker maps a metrics file")


def wait_for(predicate, seconds=60):
    """Return once predicate() holds; fail after `seconds`. The deadline is generous, for a loaded
    machine: a wait returns as soon as its condition holds, so only a failure waits it out."""
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.1)


class Browser:
    """A requests session with its own client address, that fills in the CSRF token."""

    def __init__(self, server, address=None):
        self.base = server.base
        self.http = requests.Session()
        self.http.headers["X-Forwarded-For"] = address or next(addresses)

    def get(self, path, **options):
        return self.http.get(self.base + path, allow_redirects=False, timeout=30, **options)

    def post(self, path, data=None, form_page=None, **options):
        token = re.search(r'name="csrf_token" value="([^"]+)"', self.get(form_page or path).text)[1]
        return self.http.post(self.base + path, data={**(data or {}), "csrf_token": token},
                              allow_redirects=False, timeout=30, **options)

    def signup(self, username=None, password=PASSWORD):
        username = username or next(usernames)
        response = self.post("/signup", {"username": username, "email": f"{username}@example.com",
                                         "password": password})
        assert response.status_code == 302, response.text
        self.username = username
        return self

    def login(self, username, password=PASSWORD, next_path=None):
        query = f"?next={next_path}" if next_path is not None else ""
        return self.post(f"/login{query}", {"username": username, "password": password}, form_page="/login")

    def logged_in(self):
        return self.get("/settings/profile").status_code == 200

    def create_key(self, name="key"):
        return self.post("/settings/security/keys", {"name": name, "type": "production"},
                         form_page="/settings/security")

    def copy(self):
        twin = Browser.__new__(Browser)
        twin.base, twin.http = self.base, requests.Session()
        twin.http.headers.update(self.http.headers)
        twin.http.cookies.update(self.http.cookies)
        return twin
