"""The servers a benchmark measures and what they start from: gunicorn with one gevent worker
pinned to the server core (and the FastAPI peer, one uvicorn process there), the service's
environment, the bench user's keys."""

import os
import re
import resource
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
# The service's modules, which seed_keys imports; never bench/, whose lifecycle.py would shadow
# the service's (bench/run.py takes bench/ off the path).
sys.path.insert(0, str(ROOT))

SERVER_CORE, CLIENT_CORE = "1", "0"
# Its own database, emptied at the start: choose another where several people share one Redis.
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/14")


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def use_client_core():
    """Pin this process to the client core and let it (and the servers it starts, which inherit
    the limit) open as many files as the hard limit allows, up to 65,536: a time socket is one."""
    os.sched_setaffinity(0, {int(CLIENT_CORE)})
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 65536)), hard))


class Server:
    """gunicorn -c CONFIG with one gevent worker, pinned to SERVER_CORE."""

    def __init__(self, wsgi_app, env, chdir=ROOT, config=ROOT / "gunicorn.conf.py"):
        self.port = free_port()
        self.start(["gunicorn", "-c", str(config), "--chdir", str(chdir), "--access-logfile", "/dev/null", wsgi_app],
                   dict(env, PORT=str(self.port), WEB_CONCURRENCY="1"), chdir)
        self.worker_pid = int(subprocess.check_output(["pgrep", "-P", str(self.process.pid)]).split()[0])

    def start(self, module_command, env, chdir):
        """Run `python -m MODULE_COMMAND...` on SERVER_CORE; return once it answers on self.port."""
        self.base = f"http://127.0.0.1:{self.port}"
        command = ["taskset", "-c", SERVER_CORE, sys.executable, "-m", *module_command]
        self.process = subprocess.Popen(command, cwd=chdir, env=env, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
        for _ in range(300):
            try:
                requests.get(self.base + "/", timeout=5)
                break
            except requests.RequestException:
                assert self.process.poll() is None, f"{module_command[-1]} did not start"
                time.sleep(0.1)

    def rss_kib(self):
        status = Path(f"/proc/{self.worker_pid}/status").read_text()
        return int(re.search(r"VmRSS:\s+(\d+) kB", status)[1])

    def stop(self):
        self.process.terminate()
        self.process.wait(timeout=60)


class Peer(Server):
    """bench/peer.py under uvicorn with uvloop and httptools: one process, pinned to SERVER_CORE,
    its access log on (as by default) and written, like gunicorn's, to /dev/null. Its database
    of keys, made at its start in workdir, holds `secret`."""

    def __init__(self, workdir, secret):
        self.port = free_port()
        self.start(["uvicorn", "--loop", "uvloop", "--http", "httptools", "--port", str(self.port), "bench.peer:app"],
                   dict(os.environ, PEER_KEY=secret, PEER_DATABASE=str(workdir / "peer.db")), ROOT)
        self.worker_pid = self.process.pid


class Floor(Server):
    """bench/sendfloor.py's server, the tick's floor: one process, pinned to SERVER_CORE."""

    def __init__(self):
        self.port = free_port()
        self.start(["bench.sendfloor", "--serve", str(self.port)], dict(os.environ), ROOT)
        self.worker_pid = self.process.pid


def service(env, checkout=ROOT):
    """The service of a checkout (this one by default), under its own gunicorn.conf.py."""
    return Server("app:app", env, chdir=checkout, config=checkout / "gunicorn.conf.py")


def bare(env):
    """The ceiling: bench/bare.py under the service's gunicorn settings (bench/bare.conf.py)."""
    return Server("bench.bare:app", env, config=BENCH / "bare.conf.py")


def service_env(workdir):
    return dict(os.environ,
                DATABASE_URL=f"sqlite:///{workdir}/bench.db",
                SECRET_KEY="bench",
                RATE_LIMIT_TIERS="free=1000000000/hour",
                PUBLIC_RATE_LIMIT="1000000000/minute")


def seed_keys(env, count):
    """Create user bench with `count` development keys; return their secrets."""
    os.environ.update(env)
    import models
    from keys import keyformat
    try:
        from accounts import users
    except ImportError:  # a checkout from before the accounts/ room
        from web import accounts as users
    from app import create_app

    app = create_app()
    with app.app_context():
        user = users.create_user("bench", "bench@example.com", "bench password")
        secrets = [keyformat.generate_secret("development") for _ in range(count)]
        # A checkout from before organisations has no org column.
        owner = {"org": models.personal_organisation(user.id).id} if hasattr(models, "personal_organisation") else {}
        rows = [{"user": user.id, "name": f"bench {i}", "key_type": "development",
                 "display_prefix": secret[:12], "key_hash": keyformat.hash_key(secret), **owner}
                for i, secret in enumerate(secrets)]
        with models.db.atomic():
            for start in range(0, len(rows), 500):
                models.ApiKey.insert_many(rows[start:start + 500]).execute()
    return secrets


def copy_accounts(source, target):
    """Copy the users, organisations and keys of one SQLite database into another made by the
    service, perhaps of another schema version: the tables and columns both have (a later version
    only adds them)."""
    with sqlite3.connect(target) as connection:
        connection.execute("ATTACH DATABASE ? AS source", (str(source),))
        for table in ("users", "organisations", "memberships", "api_keys"):
            both = "SELECT count(*) FROM {}.sqlite_master WHERE type = 'table' AND name = ?"
            if not all(connection.execute(both.format(side), (table,)).fetchone()[0] for side in ("main", "source")):
                continue
            target_columns = [row[1] for row in connection.execute(f"PRAGMA main.table_info({table})")]
            source_columns = {row[1] for row in connection.execute(f"PRAGMA source.table_info({table})")}
            columns = ", ".join(column for column in target_columns if column in source_columns)
            connection.execute(f"INSERT INTO {table} ({columns}) SELECT {columns} FROM source.{table}")
    connection.close()


def rotated(names, repetition):
    """The names in the order of one round: who goes first moves on each round, since the server
    measured later in a round does better."""
    shift = repetition % len(names)
    return names[shift:] + names[:shift]
