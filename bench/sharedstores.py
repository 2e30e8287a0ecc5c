"""The stores every worker and instance shares, counted from outside: a redis-server of the
bench's own, whose INFO counts commands, bytes and CPU for the whole server, and a PostgreSQL
database made afresh, whose statistics count transactions, rows and connections. bench/capacity.py
turns what changes between two readings into costs per request and per socket; bench/scale.py and
bench/pgbouncer.py make their databases afresh here too.
"""

import re
import shutil
import socket
import subprocess
import threading
import time

from bench import servers

POSTGRES_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
# The bench's own connection to its database (the per-table counts), left out of the connection counts.
OURS = "bench-sharedstores"
# The connections the service holds to the bench database, and how many of them run a statement.
CONNECTIONS_HELD = ("SELECT count(*), count(*) FILTER (WHERE state = 'active') FROM pg_stat_activity "
                    "WHERE datname = %s AND backend_type = 'client backend' AND application_name <> %s")


# Redis: INFO read over a bare socket, so its own request and reply can be taken out of the counts.

def redis_info(port):
    """INFO all as a snapshot: the server's command, byte and CPU counters and each command's calls,
    with the size of this INFO's request and reply, which the next snapshot's counters include."""
    request = b"*2\r\n$4\r\nINFO\r\n$3\r\nall\r\n"
    with socket.create_connection(("127.0.0.1", port)) as connection:
        connection.sendall(request)
        reply = b""
        while b"\r\n" not in reply or len(reply) < reply.index(b"\r\n") + 2 + int(reply[1:reply.index(b"\r\n")]) + 2:
            reply += connection.recv(65536)
    fields = dict(line.split(":", 1) for line in reply.decode().split("\r\n")[1:] if ":" in line)
    calls = {name.removeprefix("cmdstat_"): int(re.search(r"calls=(\d+)", value)[1])
             for name, value in fields.items() if name.startswith("cmdstat_")}
    return {"commands": int(fields["total_commands_processed"]), "in": int(fields["total_net_input_bytes"]),
            "out": int(fields["total_net_output_bytes"]),
            "cpu": float(fields["used_cpu_user"]) + float(fields["used_cpu_sys"]),
            "connections": int(fields["total_connections_received"]), "clients": int(fields["connected_clients"]),
            "calls": calls, "request_bytes": len(request), "reply_bytes": len(reply)}


def redis_delta(before, after):
    """What clients other than these two snapshots did between them: commands run (a script's own
    commands included), bytes in and out, CPU seconds, connections opened, and the calls of each
    command. The later counters hold the earlier INFO (its call and reply) and the later INFO's
    request and connection."""
    calls = {name: after["calls"][name] - before["calls"].get(name, 0) for name in after["calls"] if name != "info"}
    return {"commands": after["commands"] - before["commands"] - 1,
            "in": after["in"] - before["in"] - after["request_bytes"],
            "out": after["out"] - before["out"] - before["reply_bytes"],
            "cpu": after["cpu"] - before["cpu"],
            "connections": after["connections"] - before["connections"] - 1,
            "scripts": calls.get("evalsha", 0) + calls.get("eval", 0),
            "calls": {name: count for name, count in calls.items() if count}}


class PrivateRedis:
    """redis-server on a free port, keeping nothing on disk, for one run."""

    def __init__(self):
        program = shutil.which("redis-server")
        if program is None:
            raise SystemExit("this bench needs redis-server (Debian: apt-get install redis-server)")
        self.port = servers.free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process = subprocess.Popen([program, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                         "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(100):
            try:
                redis_info(self.port)
                return
            except OSError:
                time.sleep(0.05)
        raise SystemExit("redis-server did not start")

    def stop(self):
        self.process.terminate()
        self.process.wait(timeout=10)


def fresh_database(name):
    """Drop the database `name` on 127.0.0.1:5432 if it is there, make it again, empty, and return its URL."""
    import psycopg

    drop_database(name)
    with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as connection:
        connection.execute(f"CREATE DATABASE {name}")
    return POSTGRES_ADMIN_URL.rsplit("/", 1)[0] + "/" + name


def drop_database(name):
    """Drop the database `name` on 127.0.0.1:5432 if it is there: as a run ends, nothing of the
    bench's stays behind."""
    import psycopg

    with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as connection:
        connection.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


# PostgreSQL: pg_stat_database read from the admin database adds nothing to the counts; the
# per-table counts, read in the bench database, add one transaction a read (the idle rate has them too).

class Postgres:
    """A database made afresh for one run: its counters and the connections open to it."""

    DATABASE_COUNTERS = ("xact_commit", "xact_rollback", "tup_inserted", "tup_updated", "tup_deleted")
    TABLE_COUNTERS = ("n_tup_ins", "n_tup_upd", "idx_scan")

    def __init__(self, database):
        import psycopg

        self.database = database
        self.url = fresh_database(database)
        self.admin = psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True)
        self.tables = None
        self.psycopg = psycopg

    def counters(self):
        """The database's transactions and rows, and the service's tables' rows and index scans."""
        row = self.admin.execute(f"SELECT {', '.join(self.DATABASE_COUNTERS)} FROM pg_stat_database "
                                 "WHERE datname = %s", (self.database,)).fetchone()
        found = dict(zip(self.DATABASE_COUNTERS, row))
        if self.tables is None:
            self.tables = self.psycopg.connect(self.url, autocommit=True, application_name=OURS)
        for table, *values in self.tables.execute(
                f"SELECT relname, {', '.join(self.TABLE_COUNTERS)} FROM pg_stat_user_tables "
                "WHERE relname IN ('api_keys', 'usage_hours', 'usage_days', 'usage_writers')"):
            for name, value in zip(self.TABLE_COUNTERS, values):
                found[f"{table}.{name}"] = value or 0
        return found

    def connections(self):
        """(connections the service holds to the bench database, of which running a statement)."""
        return self.admin.execute(CONNECTIONS_HELD, (self.database, OURS)).fetchone()

    def close(self):
        for connection in (self.admin, self.tables):
            if connection is not None:
                connection.close()


def difference(before, after):
    return {name: after[name] - before.get(name, 0) for name in after}


def per_unit(delta, idle_rate, seconds, units):
    """Each counter of delta less what the idle worker does in `seconds` (idle_rate: counts a
    second), divided by units (requests, sockets, or socket-seconds)."""
    return {name: (value - idle_rate.get(name, 0) * seconds) / units for name, value in delta.items()}


class ConnectionWatch:
    """Samples the service's connections to `postgres`'s database every 20 ms while it runs: the
    most held and active, less the `baseline` held before the worker started (this process's apps
    keep theirs)."""

    def __init__(self, postgres, baseline):
        import psycopg

        self.connection = psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True)
        self.database, self.baseline = postgres.database, baseline
        self.held = self.active = 0
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self.watch, daemon=True)

    def watch(self):
        while not self.stopped.wait(0.02):
            held, active = self.connection.execute(CONNECTIONS_HELD, (self.database, OURS)).fetchone()
            self.held, self.active = max(self.held, held - self.baseline), max(self.active, active)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stopped.set()
        self.thread.join()
        self.connection.close()


class Counters:
    """Redis's and PostgreSQL's counters at one moment, and what changed since another."""

    def __init__(self, redis_port, postgres):
        self.redis_port, self.postgres = redis_port, postgres

    def read(self):
        return {"at": time.monotonic(), "redis": redis_info(self.redis_port), "postgres": self.postgres.counters()}

    def since(self, before):
        """(What changed since `before`, flat: redis.*, redis.calls.*, postgres.*; the seconds between.)"""
        after = self.read()
        redis = redis_delta(before["redis"], after["redis"])
        flat = {f"redis.{name}": value for name, value in redis.items() if name != "calls"}
        flat |= {f"redis.calls.{name}": value for name, value in redis["calls"].items()}
        flat |= {f"postgres.{name}": value for name, value in difference(before["postgres"], after["postgres"]).items()}
        return flat, after["at"] - before["at"]

    def idle_rate(self, seconds):
        """Counts a second of the worker serving nothing (its outbox poll, the maintenance jobs)."""
        before = self.read()
        time.sleep(seconds)
        delta, elapsed = self.since(before)
        return {name: value / elapsed for name, value in delta.items()}
