"""Benchmark, run by hand: the service and a bare Flask app under the same gunicorn settings,
one gevent worker pinned to core 1, the load generators on core 0. Prints markdown tables;
with --json FILE, also writes every scenario's numbers there (bench/plot.py draws them).

    pip install -r bench/requirements.txt && apt-get install wrk
    python bench/run.py                 # everything
    python bench/run.py rest            # REST only (wrk)
    python bench/run.py sockets echo    # time sockets, echo round trips
    python bench/run.py sockets --all   # time sockets, every one read by several client processes
    python bench/run.py stalled         # 3,000 time sockets, 1 % of them stalled
    python bench/run.py echo --against ../before   # and the echo of another checkout beside it
    python bench/run.py rest --against ../before   # and its REST, interleaved with this one
    python bench/run.py logins          # GET /api/v1/status while 20 users log in
    python bench/run.py redis           # protected/test with Redis limits ÷ memory limits
    python bench/run.py redis --against ../before  # and the other checkout's Redis path beside it
    python bench/run.py scale           # protected/test on PostgreSQL + Redis ÷ SQLite + memory, and x bare
    python bench/run.py scale --against ../before  # and both configurations of the other checkout
    python bench/run.py rest echo --json docs/bench/results.json   # and the numbers as JSON
    BENCH_REDIS_URL=redis://127.0.0.1:6379/13 python bench/run.py redis   # redis, scale: another Redis database
"""

import argparse
import asyncio
import base64
import concurrent.futures
import datetime
import json
import multiprocessing
import os
import re
import resource
import select
import socket
import sqlite3
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests
import websockets

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SERVER_CORE, CLIENT_CORE = "1", "0"
WRK_SECONDS, WRK_CONNECTIONS, REPETITIONS = 10, 50, 3
RANDOM_KEYS = 100_000
SOCKET_COUNTS = (1000, 3000, 5000)
TICK_SECONDS = 10
SAMPLE_SOCKETS = 100
ECHO_CLIENTS, ECHO_SECONDS = 50, 10
# Its own database, emptied at the start: choose another where several people share one Redis.
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/14")
POSTGRES_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
POSTGRES_DATABASE = "apiservice_bench"  # made afresh at the start
CLIENT_PROCESSES = 2  # sockets --all: the readers, all on the client core
ALL_SOCKETS = False  # --all: sockets measures every socket instead of the 100 opened last
AGAINST = None  # --against: another checkout measured beside this one (rest, echo)


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """gunicorn -c gunicorn.conf.py with one gevent worker, pinned to SERVER_CORE."""

    def __init__(self, wsgi_app, env, chdir=ROOT, config=ROOT / "gunicorn.conf.py"):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        env = dict(env, PORT=str(self.port), WEB_CONCURRENCY="1")
        command = ["taskset", "-c", SERVER_CORE, sys.executable, "-m", "gunicorn",
                   "-c", str(config), "--chdir", str(chdir),
                   "--access-logfile", "/dev/null", wsgi_app]
        self.process = subprocess.Popen(command, cwd=chdir, env=env, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
        for _ in range(300):
            try:
                requests.get(self.base + "/", timeout=5)
                break
            except requests.RequestException:
                assert self.process.poll() is None, f"{wsgi_app} did not start"
                time.sleep(0.1)
        self.worker_pid = int(subprocess.check_output(["pgrep", "-P", str(self.process.pid)]).split()[0])

    def rss_kib(self):
        status = Path(f"/proc/{self.worker_pid}/status").read_text()
        return int(re.search(r"VmRSS:\s+(\d+) kB", status)[1])

    def stop(self):
        self.process.terminate()
        self.process.wait(timeout=60)


def service_env(workdir):
    return dict(os.environ,
                DATABASE_URL=f"sqlite:///{workdir}/bench.db",
                SECRET_KEY="bench",
                RATE_LIMIT_TIERS="free=1000000000/hour",
                PUBLIC_RATE_LIMIT="1000000000/minute")


def seed_keys(env, count):
    """Create user bench with `count` development keys; return their secrets."""
    os.environ.update(env)
    import accounts
    import auth
    import models
    from app import create_app

    app = create_app()
    with app.app_context():
        user = accounts.create_user("bench", "bench@example.com", "bench password")
        secrets = [auth.generate_secret("development") for _ in range(count)]
        rows = [{"user": user.id, "name": f"bench {i}", "key_type": "development",
                 "display_prefix": secret[:12], "key_hash": auth.hash_key(secret)}
                for i, secret in enumerate(secrets)]
        with models.db.atomic():
            for start in range(0, len(rows), 500):
                models.ApiKey.insert_many(rows[start:start + 500]).execute()
    return secrets


def copy_accounts(source, target):
    """Copy the users and keys of one SQLite database into another made by the service (the
    tables have the same columns in every schema version so far)."""
    with sqlite3.connect(target) as connection:
        connection.execute("ATTACH DATABASE ? AS source", (str(source),))
        for table in ("users", "api_keys"):
            connection.execute(f"INSERT INTO {table} SELECT * FROM source.{table}")
    connection.close()


def wrk(url, headers=(), script=None, env=None, seconds=WRK_SECONDS):
    command = ["taskset", "-c", CLIENT_CORE, "wrk", "-t2", f"-c{WRK_CONNECTIONS}", f"-d{seconds}s", "--latency"]
    for header in headers:
        command += ["-H", header]
    if script:
        command += ["-s", script]
    output = subprocess.run(command + [url], capture_output=True, text=True, env=env, check=True).stdout
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
    errors = re.search(r"Socket errors: (.*)", output)
    return {
        "rps": float(re.search(r"Requests/sec:\s+([\d.]+)", output)[1]),
        "p50": latency_ms(re.search(r"^\s+50%\s+(\S+)", output, re.M)[1]),
        "p99": latency_ms(re.search(r"^\s+99%\s+(\S+)", output, re.M)[1]),
        "non_2xx": int(non_2xx[1]) if non_2xx else 0,
        "errors": errors[1] if errors else "none",
    }


def latency_ms(text):
    match = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text)
    if match is None:
        raise ValueError(f"wrk printed a latency of {text!r}")
    value, unit = match.groups()
    return float(value) * {"us": 0.001, "ms": 1, "s": 1000, "m": 60_000}[unit]


def bench_rest(workdir):
    env = service_env(workdir)
    secrets = seed_keys(env, RANDOM_KEYS)
    keys_file = workdir / "keys.txt"
    keys_file.write_text("\n".join(secrets) + "\n")
    service = Server("app:app", env)
    bare = Server("bare:app", env, chdir=ROOT / "bench", config=ROOT / "bench" / "bare.conf.py")
    cases = {
        "bare Flask `GET /bare`": lambda: wrk(bare.base + "/bare"),
        "public `GET /api/v1/demo/year`": lambda: wrk(service.base + "/api/v1/demo/year"),
        "`GET /api/v1/protected/test`, 1 key": lambda: wrk(
            service.base + "/api/v1/protected/test", headers=[f"X-API-Key: {secrets[0]}"]),
        f"`GET /api/v1/protected/test`, random of {RANDOM_KEYS:,} keys": lambda: wrk(
            service.base, script=str(ROOT / "bench" / "random_key.lua"),
            env=dict(os.environ, KEYS_FILE=str(keys_file))),
    }
    servers = [service, bare]
    if AGAINST:
        # Its own database, with the same users and keys: the other checkout may be at an older
        # schema version, and would refuse to start on this one's.
        other_env = dict(env, DATABASE_URL=f"sqlite:///{workdir}/against.db")
        before = Server("app:app", other_env, chdir=AGAINST, config=AGAINST / "gunicorn.conf.py")
        copy_accounts(workdir / "bench.db", workdir / "against.db")
        servers.append(before)
        cases[f"public `GET /api/v1/demo/year` of {AGAINST.name}"] = lambda: wrk(before.base + "/api/v1/demo/year")
        cases[f"`GET /api/v1/protected/test`, 1 key, of {AGAINST.name}"] = lambda: wrk(
            before.base + "/api/v1/protected/test", headers=[f"X-API-Key: {secrets[0]}"])
        # Both carry 100,000 keys' windows into the next round, or the comparison would not be fair.
        cases[f"`GET /api/v1/protected/test`, random of {RANDOM_KEYS:,} keys, of {AGAINST.name}"] = lambda: wrk(
            before.base, script=str(ROOT / "bench" / "random_key.lua"),
            env=dict(os.environ, KEYS_FILE=str(keys_file)))
    try:
        for run in cases.values():
            run()  # warm-up
        results = {name: [] for name in cases}
        for repetition in range(REPETITIONS):
            for name in rest_order(list(cases), repetition):
                results[name].append(cases[name]())
        rss = service.rss_kib()
    finally:
        for server in servers:
            server.stop()

    medians = {name: {field: statistics.median(r[field] for r in runs) for field in ("rps", "p50", "p99")}
               | {"non_2xx": sum(r["non_2xx"] for r in runs), "errors": runs[-1]["errors"]}
               for name, runs in results.items()}
    ceiling = medians["bare Flask `GET /bare`"]["rps"]
    print(f"\nREST: wrk -t2 -c{WRK_CONNECTIONS} -d{WRK_SECONDS}s, median of {REPETITIONS} interleaved runs\n")
    print("| endpoint | req/s | x bare | p50 ms | p99 ms | non-2xx | socket errors |")
    print("|---|---|---|---|---|---|---|")
    for name, m in medians.items():
        print(f"| {name} | {m['rps']:,.0f} | {m['rps'] / ceiling:.2f} | {m['p50']:.2f} | {m['p99']:.2f} "
              f"| {m['non_2xx']} | {m['errors']} |")
    print(f"\nworker RSS after the runs ({RANDOM_KEYS:,} keys with windows): {rss / 1024:.0f} MiB")
    if AGAINST:
        ours = results["`GET /api/v1/protected/test`, 1 key"]
        theirs = results[f"`GET /api/v1/protected/test`, 1 key, of {AGAINST.name}"]
        print("protected/test, 1 key, this checkout ÷ " + AGAINST.name + ", each run: "
              + ", ".join(f"{a['rps'] / b['rps']:.2f}" for a, b in zip(ours, theirs)))
    return {"bare": "bare Flask `GET /bare`", "worker_rss_mib": round(rss / 1024),
            "cases": {name: {"runs": runs, "median": medians[name]} for name, runs in results.items()}}


def bench_redis(workdir):
    """protected/test, 1 key, with RATELIMIT_STORAGE_URL on Redis and in memory, interleaved."""
    env = service_env(workdir)
    secret = seed_keys(env, 1)[0]
    redis_env = dict(env, RATELIMIT_STORAGE_URL=REDIS_URL)
    import redis

    redis.Redis.from_url(REDIS_URL).flushdb()
    servers = {"memory://": Server("app:app", env), "redis://": Server("app:app", redis_env)}
    if AGAINST:
        servers[f"redis:// of {AGAINST.name}"] = Server("app:app", redis_env, chdir=AGAINST,
                                                         config=AGAINST / "gunicorn.conf.py")
    header = [f"X-API-Key: {secret}"]
    try:
        for server in servers.values():
            wrk(server.base + "/api/v1/protected/test", headers=header)  # warm-up
        results = {name: [] for name in servers}
        for repetition in range(REPETITIONS):
            names = list(servers)
            for name in names[repetition % len(names):] + names[:repetition % len(names)]:
                results[name].append(wrk(servers[name].base + "/api/v1/protected/test", headers=header))
    finally:
        for server in servers.values():
            server.stop()
    print(f"\nprotected/test, 1 key, by limit storage: wrk -t2 -c{WRK_CONNECTIONS} -d{WRK_SECONDS}s, "
          f"{REPETITIONS} runs, the order rotated each run\n")
    print("| storage | req/s, each run | p99 ms, each run | ÷ memory, each run | non-2xx |")
    print("|---|---|---|---|---|")
    for name, runs in results.items():
        ratios = [run["rps"] / memory["rps"] for run, memory in zip(runs, results["memory://"])]
        rps = " / ".join(f"{run['rps']:,.0f}" for run in runs)
        p99 = " / ".join(f"{run['p99']:.1f}" for run in runs)
        print(f"| {name} | {rps} | {p99} | {' / '.join(f'{ratio:.2f}' for ratio in ratios)} "
              f"| {sum(run['non_2xx'] for run in runs)} |")
    return {"baseline": "memory://", "storages": results}


def bench_scale(workdir):
    """protected/test, 1 key: the documented scale-out (PostgreSQL + Redis), PostgreSQL with limits in
    memory (no key cache there) and the default (SQLite + memory), one worker each, with bare Flask,
    interleaved with the order rotated each round."""
    import psycopg
    import redis

    with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as connection:
        connection.execute(f"DROP DATABASE IF EXISTS {POSTGRES_DATABASE} WITH (FORCE)")
        connection.execute(f"CREATE DATABASE {POSTGRES_DATABASE}")
    redis.Redis.from_url(REDIS_URL).flushdb()
    sqlite_env = service_env(workdir)
    postgres_env = dict(sqlite_env, DATABASE_URL=POSTGRES_ADMIN_URL.rsplit("/", 1)[0] + "/" + POSTGRES_DATABASE)
    secrets = {"sqlite": seed_keys(sqlite_env, 1)[0], "postgresql": seed_keys(postgres_env, 1)[0]}
    configurations = {
        "SQLite + memory://": ("sqlite", sqlite_env),
        "PostgreSQL + redis://": ("postgresql", dict(postgres_env, RATELIMIT_STORAGE_URL=REDIS_URL)),
        "PostgreSQL + memory://": ("postgresql", postgres_env),
    }
    servers = {"bare Flask `GET /bare`": (Server("bare:app", sqlite_env, chdir=ROOT / "bench",
                                                 config=ROOT / "bench" / "bare.conf.py"), "/bare", None)}
    checkouts = [(ROOT, "")] + ([(AGAINST, f" of {AGAINST.name}")] if AGAINST else [])
    for chdir, suffix in checkouts:
        for name, (database, env) in configurations.items():
            server = Server("app:app", env, chdir=chdir, config=chdir / "gunicorn.conf.py")
            servers[name + suffix] = (server, "/api/v1/protected/test", secrets[database])
    try:
        results = {name: [] for name in servers}
        for repetition in range(REPETITIONS + 1):  # the first round warms up
            names = list(servers)
            for name in names[repetition % len(names):] + names[:repetition % len(names)]:
                server, path, secret = servers[name]
                result = wrk(server.base + path, headers=[f"X-API-Key: {secret}"] if secret else [])
                if repetition:
                    results[name].append(result)
    finally:
        for server, _, _ in servers.values():
            server.stop()

    print(f"\nprotected/test, 1 key, by configuration: wrk -t2 -c{WRK_CONNECTIONS} -d{WRK_SECONDS}s, "
          f"{REPETITIONS} rounds after a warm-up, the order rotated each round\n")
    print("| configuration | req/s, each round | p99 ms, each round | x bare | ÷ SQLite + memory | "
          "p99 ÷ SQLite + memory | non-2xx |")
    print("|---|---|---|---|---|---|---|")
    bare = results["bare Flask `GET /bare`"]
    for name, runs in results.items():
        suffix = name[name.index(" of "):] if " of " in name else ""
        sqlite = results["SQLite + memory://" + suffix]
        print(f"| {name} | {each(runs, 'rps', '{:,.0f}')} | {each(runs, 'p99', '{:.1f}')} "
              f"| {ratios(runs, bare, 'rps')} | {ratios(runs, sqlite, 'rps')} | {ratios(runs, sqlite, 'p99')} "
              f"| {sum(run['non_2xx'] for run in runs)} |")
    return {"bare": "bare Flask `GET /bare`", "baseline": "SQLite + memory://", "configurations": results}


def each(runs, field, layout):
    return " / ".join(layout.format(run[field]) for run in runs)


def ratios(runs, others, field):
    """Each round's figure ÷ the other's in the same round."""
    return " / ".join(f"{run[field] / other[field]:.2f}" for run, other in zip(runs, others))


def rest_order(names, repetition):
    """The cases of one round. With --against, each endpoint of this checkout runs next to the
    same endpoint of the other, which goes first every other round, so that neither gains from
    its place in the round (the public endpoint of the other checkout, run after this one's
    random-key case, came out 10-15 % ahead of its own history)."""
    if not AGAINST:
        return names
    own, other = names[:len(names) // 2 + 1], names[len(names) // 2 + 1:]
    order = own[:1]
    for pair in zip(own[1:], other):
        order += pair if repetition % 2 == 0 else pair[::-1]
    return order


def bench_sockets(workdir):
    env = service_env(workdir)
    secrets = seed_keys(env, max(SOCKET_COUNTS) // 10)
    if ALL_SOCKETS:
        return bench_all_sockets(env, secrets)
    print(f"\nTime sockets: all open, {TICK_SECONDS} s of ticks; lateness after the whole second, measured on "
          f"the {SAMPLE_SOCKETS} sockets opened last (the others never read, so the client costs nothing)\n")
    print("| sockets | handshake failures | skipped seconds (sample) | built p50 / p99 / max ms "
          "| arrived p50 / p99 / max ms | RSS per socket KiB |")
    print("|---|---|---|---|---|---|")
    rows = []
    for count in SOCKET_COUNTS:
        server = Server("app:app", env)
        try:
            before = server.rss_kib()
            rows.append(asyncio.run(measure_ticks(server, secrets, count, before)))
        finally:
            server.stop()
        print(tick_row(count, rows[-1]))
    return {"read": f"the {SAMPLE_SOCKETS} sockets opened last", "tick_seconds": TICK_SECONDS, "rows": rows}


def bench_all_sockets(env, secrets):
    print(f"\nTime sockets, every one read: {TICK_SECONDS} s of ticks; lateness after the whole second of "
          f"every tick on every socket, as the client's kernel stamped its arrival (SO_TIMESTAMPNS), read by "
          f"{CLIENT_PROCESSES} client processes on core {CLIENT_CORE}, whose CPU use is shown\n")
    print("| sockets | handshake failures | skipped seconds | built p50 / p99 / max ms "
          "| arrived p50 / p99 / max ms | client CPU, % of its core | RSS per socket KiB |")
    print("|---|---|---|---|---|---|---|")
    rows = []
    for count in SOCKET_COUNTS:
        server = Server("app:app", env)
        try:
            before = server.rss_kib()
            rows.append(read_every_socket(server, secrets, count, before))
        finally:
            server.stop()
        print(tick_row(count, rows[-1]))
    return {"read": "every socket", "tick_seconds": TICK_SECONDS, "rows": rows}


def read_every_socket(server, secrets, count, rss_before):
    paths = [f"/api/v1/ws/time?api_key={secrets[index // 10]}" for index in range(count)]
    context = multiprocessing.get_context("spawn")
    pipes, processes = [], []
    for share in range(CLIENT_PROCESSES):
        ours, theirs = context.Pipe()
        process = context.Process(target=read_time_sockets, args=(server.port, paths[share::CLIENT_PROCESSES], theirs))
        process.start()
        pipes.append(ours)
        processes.append(process)
    failures = sum(pipe.recv() for pipe in pipes)
    time.sleep(2)
    rss_open = server.rss_kib()
    first_second = int(time.time()) + 2
    for pipe in pipes:
        pipe.send(first_second)
    reports = [pipe.recv() for pipe in pipes]
    for process in processes:
        process.join()
    arrived = sorted(late for report in reports for late in report["arrived_ms"])
    built = sorted(late for report in reports for late in report["built_ms"])
    skipped = sum(report["skipped"] for report in reports)
    cpu = sum(report["cpu_seconds"] for report in reports) / max(report["wall_seconds"] for report in reports)
    per_socket = (rss_open - rss_before) / max(1, count - failures)
    return {"sockets": count, "handshake_failures": failures, "skipped_seconds": skipped,
            "built_ms": percentiles(built), "arrived_ms": percentiles(arrived),
            "client_cpu_percent": round(100 * cpu), "rss_per_socket_kib": round(per_socket, 1)}


# Linux's SO_TIMESTAMPNS (and SCM_TIMESTAMPNS): the kernel stamps each packet as it arrives, so a
# busy client cannot make the server look late. The socket module does not export them.
SO_TIMESTAMPNS = 35


class TimeSocketReader:
    """One time socket of sockets --all: reads every frame and keeps each chunk with the time the
    kernel received it; nothing is parsed until the run is over."""

    def __init__(self, port, path):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=120)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(f"GET {path} HTTP/1.1\r\nHost: bench\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                          f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode())
        self.sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        self.chunks = []

    def finish_handshake(self):
        """Wait for the 101 (raise ConnectionError for anything else), then stop blocking."""
        while b"\r\n\r\n" not in b"".join(data for _, data in self.chunks):
            if not self.read():
                raise ConnectionError("closed before the handshake")
        if not self.chunks[0][1].startswith(b"HTTP/1.1 101"):
            raise ConnectionError(self.chunks[0][1].split(b"\r\n")[0].decode(errors="replace"))
        self.sock.setblocking(False)

    def read(self):
        """Read what is waiting; return False once the server has closed the socket."""
        data, ancillary, _, _ = self.sock.recvmsg(65536, 64)
        stamp = time.time()
        for level, kind, value in ancillary:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
                seconds, nanoseconds = struct.unpack("qq", value[:16])
                stamp = seconds + nanoseconds / 1e9
        self.chunks.append((stamp, data))
        return bool(data)

    def messages(self):
        """Yield (arrival time, payload) for each text frame, stamped with the chunk that ended it."""
        buffer, upgraded = b"", False
        for arrived, data in self.chunks:
            buffer += data
            if not upgraded:
                head, found, rest = buffer.partition(b"\r\n\r\n")
                if not found:
                    continue
                buffer, upgraded = rest, True
            while len(buffer) >= 2:
                length, start = buffer[1] & 0x7F, 2
                if length == 126:
                    length, start = int.from_bytes(buffer[2:4], "big"), 4
                if len(buffer) < start + length:
                    break
                opcode, payload = buffer[0] & 0x0F, buffer[start:start + length]
                buffer = buffer[start + length:]
                if opcode == 1:
                    yield arrived, payload


def read_time_sockets(port, paths, pipe):
    """A client process of sockets --all: open paths (100 handshakes at a time), report the
    failures, wait for the first second of the window, read every socket through epoll until it
    ends, then report every tick's lateness and this process's CPU time."""
    os.sched_setaffinity(0, {int(CLIENT_CORE)})
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 65536)), hard))
    readers, failures = {}, 0
    for start in range(0, len(paths), 100):
        opening = []
        for path in paths[start:start + 100]:
            try:
                opening.append(TimeSocketReader(port, path))
            except OSError:
                failures += 1
        for reader in opening:
            try:
                reader.finish_handshake()
                readers[reader.sock.fileno()] = reader
            except OSError:
                failures += 1
    poller = select.epoll()
    for fileno in readers:
        poller.register(fileno, select.EPOLLIN)
    pipe.send(failures)
    first_second = pipe.recv()
    started, cpu_started = time.time(), time.process_time()
    ends_at = first_second + TICK_SECONDS + 1.5
    while (left := ends_at - time.time()) > 0:
        for fileno, _ in poller.poll(min(left, 0.5)):
            try:
                if not readers[fileno].read():
                    poller.unregister(fileno)
            except BlockingIOError:
                pass
    cpu_seconds, wall_seconds = time.process_time() - cpu_started, time.time() - started
    window = set(range(first_second, first_second + TICK_SECONDS))
    parsed, arrived_ms, built_ms, skipped = {}, [], [], 0
    for reader in readers.values():
        seen = set()
        for arrived, raw in reader.messages():
            if raw not in parsed:
                message = json.loads(raw)
                parsed[raw] = (epoch(message["formatted"], "%Y-%m-%d %H:%M:%S UTC"),
                               epoch(message["timestamp"], "%Y-%m-%dT%H:%M:%S.%fZ")
                               ) if message.get("type") == "time_update" else (None, None)
            second, built = parsed[raw]
            if second in window:
                seen.add(second)
                arrived_ms.append((arrived - second) * 1000)
                built_ms.append((built - second) * 1000)
        skipped += len(window - seen)
        reader.sock.close()
    pipe.send({"arrived_ms": arrived_ms, "built_ms": built_ms, "skipped": skipped, "cpu_seconds": cpu_seconds,
               "wall_seconds": wall_seconds})


async def hold_raw_socket(host, port, path, receive_buffer=None):
    """Open a WebSocket with a bare handshake and never read from it: holding thousands costs the
    client no CPU, so the measured sample below sees the server's lateness, not the client's. With
    a small receive_buffer, the server soon finds the socket full: a stalled client."""
    sock = socket.socket()
    if receive_buffer:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (host, port))
    reader, writer = await asyncio.open_connection(sock=sock)
    key = base64.b64encode(os.urandom(16)).decode()
    writer.write((f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
                  f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n")
                 .encode())
    head = await reader.readuntil(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 101"):
        raise ConnectionError(head.split(b"\r\n")[0].decode())
    writer.transport.pause_reading()
    return writer


STALLED_SOCKETS, STALLED_RUNS, STALLED_RECEIVE_BUFFER = 30, 3, 1024
# A masked (key 0) ping with 125 bytes: the client sends these without ever reading the pongs.
PING_FRAME = bytes([0x89, 0x80 | 125, 0, 0, 0, 0]) + b"p" * 125
STALLED_CASES = {"none": (0, False), "1 % never read": (STALLED_SOCKETS, False),
                 "1 % never read, ping flood": (STALLED_SOCKETS, True)}


def bench_stalled(workdir):
    """3,000 time sockets, with and without 30 (1 %) stalled ones: they never read and have tiny
    receive buffers, so the server's writes to them back up; in the last case they also send pings
    flat out, whose pongs back up too. The healthy sample's lateness should not move."""
    env = service_env(workdir)
    secrets = seed_keys(env, 300)
    count = 3000
    print(f"\nTime sockets, {count:,} open, {STALLED_RUNS} interleaved runs of each case\n")
    print("| stalled sockets | handshake failures | skipped seconds (sample) | built p50 / p99 / max ms "
          "| arrived p50 / p99 / max ms | RSS per socket KiB |")
    print("|---|---|---|---|---|---|")
    results = {case: [] for case in STALLED_CASES}
    for _ in range(STALLED_RUNS):
        for case, (stalled, flood) in STALLED_CASES.items():
            server = Server("app:app", env)
            try:
                results[case].append(asyncio.run(measure_ticks(server, secrets, count, server.rss_kib(),
                                                               stalled, flood)))
            finally:
                server.stop()
            print(tick_row(case, results[case][-1]))
    return {"sockets": count, "stalled_sockets": STALLED_SOCKETS, "cases": results}


async def flood_pings(writer):
    try:
        while True:
            writer.write(PING_FRAME * 64)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass


async def measure_ticks(server, secrets, count, rss_before, stalled=0, flood=False):
    host, port = "127.0.0.1", server.port
    url = server.base.replace("http", "ws") + "/api/v1/ws/time?api_key="
    failures, holders, stalled_writers, sample = [], [], [], []
    gate = asyncio.Semaphore(100)

    async def hold(index):
        async with gate:
            try:
                writer = await hold_raw_socket(host, port, f"/api/v1/ws/time?api_key={secrets[index // 10]}",
                                               STALLED_RECEIVE_BUFFER if index < stalled else None)
                holders.append(writer)
                if index < stalled:
                    stalled_writers.append(writer)
            except Exception as error:
                failures.append(repr(error))

    async def watch(index):
        # Opened last, so the ticker reaches these after every holder: the worst case.
        try:
            ws = await websockets.connect(url + secrets[index // 10], open_timeout=120, ping_interval=None,
                                          compression=None, max_queue=None)
            await ws.recv()
            sample.append((ws, []))
        except Exception as error:
            failures.append(repr(error))

    await asyncio.gather(*(hold(i) for i in range(count - SAMPLE_SOCKETS)))
    floods = [asyncio.ensure_future(flood_pings(writer)) for writer in stalled_writers if flood]
    await asyncio.gather(*(watch(i) for i in range(count - SAMPLE_SOCKETS, count)))

    async def listen(ws, arrivals):
        async for raw in ws:
            arrivals.append((raw, time.time()))

    listeners = [asyncio.ensure_future(listen(ws, arrivals)) for ws, arrivals in sample]
    await asyncio.sleep(2)
    rss_open = server.rss_kib()
    first_second = int(time.time()) + 2
    window = set(range(first_second, first_second + TICK_SECONDS))
    await asyncio.sleep(first_second + TICK_SECONDS + 1.5 - time.time())
    for task in listeners + floods:
        task.cancel()
    await asyncio.gather(*listeners, *floods, return_exceptions=True)
    for writer in holders:
        writer.close()

    parsed = {}
    built_ms, arrived_ms, skipped = [], [], 0
    for _, arrivals in sample:
        seen = set()
        for raw, arrived in arrivals:
            if raw not in parsed:
                message = json.loads(raw)
                parsed[raw] = (epoch(message["formatted"], "%Y-%m-%d %H:%M:%S UTC"),
                               epoch(message["timestamp"], "%Y-%m-%dT%H:%M:%S.%fZ"))
            second, built = parsed[raw]
            if second in window:
                seen.add(second)
                built_ms.append((built - second) * 1000)
                arrived_ms.append((arrived - second) * 1000)
        skipped += len(window - seen)
    per_socket = (rss_open - rss_before) / max(1, len(holders) + len(sample))
    return {"sockets": count, "handshake_failures": len(failures), "skipped_seconds": skipped,
            "built_ms": percentiles(sorted(built_ms)), "arrived_ms": percentiles(sorted(arrived_ms)),
            "rss_per_socket_kib": round(per_socket, 1)}


def epoch(text, layout):
    return datetime.datetime.strptime(text, layout).replace(tzinfo=datetime.UTC).timestamp()


def percentiles(values):
    """p50, p99 and max of sorted values, or None for none."""
    if not values:
        return None
    pick = lambda q: values[min(len(values) - 1, int(q * len(values)))]  # noqa: E731
    return {"p50": round(pick(0.5), 1), "p99": round(pick(0.99), 1), "max": round(values[-1], 1)}


def tick_row(first_cell, row):
    """One markdown row of a time-socket table."""
    def layout(spread):
        return "-" if spread is None else f"{spread['p50']:.1f} / {spread['p99']:.1f} / {spread['max']:.1f}"
    cpu = f" {row['client_cpu_percent']} |" if "client_cpu_percent" in row else ""
    cell = f"{first_cell:,}" if isinstance(first_cell, int) else first_cell
    return (f"| {cell} | {row['handshake_failures']} | {row['skipped_seconds']} | {layout(row['built_ms'])} "
            f"| {layout(row['arrived_ms'])} |{cpu} {row['rss_per_socket_kib']:.1f} |")


class EchoClient(asyncio.Protocol):
    """One echo connection that sends the same pre-masked frame and reads each reply only for its
    length: so little work per round trip that one client core can keep the server busy."""

    FRAME = bytes([0x81, 0x80 | 4, 0, 0, 0, 0]) + b"ping"  # a text frame masked with key 0

    def __init__(self, path, stop_at, latencies, first_replies, done):
        self.path, self.stop_at, self.latencies = path, stop_at, latencies
        self.first_replies, self.done = first_replies, done
        self.buffer = b""
        self.upgraded = False

    def connection_made(self, transport):
        self.transport = transport
        key = base64.b64encode(os.urandom(16)).decode()
        transport.write(f"GET {self.path} HTTP/1.1\r\nHost: bench\r\nUpgrade: websocket\r\n"
                        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                        f"Sec-WebSocket-Version: 13\r\n\r\n".encode())

    def send(self):
        self.sent_at = time.perf_counter()
        self.transport.write(self.FRAME)

    def data_received(self, data):
        self.buffer += data
        if not self.upgraded:
            head, upgraded, self.buffer = self.buffer.partition(b"\r\n\r\n")
            if not upgraded:
                self.buffer = head
                return
            assert head.startswith(b"HTTP/1.1 101"), head
            self.upgraded = True
            self.send()
        while len(self.buffer) >= 2:
            length, start = self.buffer[1] & 0x7F, 2
            if length == 126:
                length, start = int.from_bytes(self.buffer[2:4], "big"), 4
            if len(self.buffer) < start + length:
                return
            opcode, payload = self.buffer[0] & 0x0F, self.buffer[start:start + length]
            self.buffer = self.buffer[start + length:]
            if opcode != 1:
                continue  # a ping from the server
            self.latencies.append(time.perf_counter() - self.sent_at)
            if len(self.first_replies) < 1:
                self.first_replies.append(payload.decode())
            if time.time() < self.stop_at:
                self.send()
            else:
                self.transport.close()

    def connection_lost(self, error):
        self.done.set_result(None)


def echo_round_trips(base, path):
    """Run ECHO_CLIENTS echo connections for ECHO_SECONDS; return (sorted latencies, a reply)."""
    latencies, first_replies = [], []

    async def run():
        loop = asyncio.get_running_loop()
        host, port = base.removeprefix("http://").split(":")
        stop_at = time.time() + ECHO_SECONDS
        finished = []
        for _ in range(ECHO_CLIENTS):
            done = loop.create_future()
            await loop.create_connection(
                lambda: EchoClient(path, stop_at, latencies, first_replies, done), host, int(port))
            finished.append(done)
        await asyncio.gather(*finished)

    asyncio.run(run())
    latencies.sort()
    return latencies, first_replies[0]


def bench_echo(workdir):
    env = service_env(workdir)
    service = Server("app:app", env)
    bare = Server("bare:app", env, chdir=ROOT / "bench", config=ROOT / "bench" / "bare.conf.py")
    cases = {"bare flask-sock echo `/echo`": (bare, "/echo"), "`WS /api/v1/ws/echo`": (service, "/api/v1/ws/echo")}
    if AGAINST:
        before = Server("app:app", env, chdir=AGAINST, config=AGAINST / "gunicorn.conf.py")
        cases[f"`WS /api/v1/ws/echo` of {AGAINST}"] = (before, "/api/v1/ws/echo")
    try:
        for server, path in cases.values():
            echo_round_trips(server.base, path)  # warm-up
        results = {name: [] for name in cases}
        names = list(cases)
        for repetition in range(REPETITIONS):
            # The server measured later in a round does better here; rotate who goes first.
            for name in names[repetition % len(names):] + names[:repetition % len(names)]:
                server, path = cases[name]
                latencies, reply = echo_round_trips(server.base, path)
                results[name].append(latencies)
                if server is service:
                    assert json.loads(reply)["message"] == "ping", reply
    finally:
        for server, _ in cases.values():
            server.stop()

    def summary(latencies):
        return len(latencies) / ECHO_SECONDS, latencies[len(latencies) // 2] * 1000, \
            latencies[int(len(latencies) * 0.99)] * 1000

    medians = {name: [statistics.median(values) for values in zip(*map(summary, runs))]
               for name, runs in results.items()}
    ceiling = medians["bare flask-sock echo `/echo`"][0]
    print(f"\nEcho: {ECHO_CLIENTS} connections from one asyncio client, {ECHO_SECONDS} s, "
          f"median of {REPETITIONS} interleaved runs\n")
    print("| socket | round trips/s | x bare | p50 ms | p99 ms |")
    print("|---|---|---|---|---|")
    for name, (rate, p50, p99) in medians.items():
        print(f"| {name} | {rate:,.0f} | {rate / ceiling:.2f} | {p50:.2f} | {p99:.2f} |")
    fields = ("round_trips_per_s", "p50_ms", "p99_ms")
    return {"bare": "bare flask-sock echo `/echo`", "clients": ECHO_CLIENTS,
            "cases": {name: {"runs": [dict(zip(fields, summary(latencies))) for latencies in runs],
                             "median": dict(zip(fields, medians[name]))} for name, runs in results.items()}}


def bench_cycles(workdir):
    """Connect and drop 1,000 time sockets (half without a close frame); report the RSS change."""
    env = service_env(workdir)
    secrets = seed_keys(env, 10)
    server = Server("app:app", env)
    url = server.base.replace("http", "ws") + "/api/v1/ws/time?api_key="

    async def cycle(index):
        ws = await websockets.connect(url + secrets[index % 10], compression=None)
        await ws.recv()
        if index % 2:
            ws.transport.abort()
        else:
            await ws.close()

    async def run(rounds):
        for start in range(0, rounds, 10):
            await asyncio.gather(*(cycle(i) for i in range(start, start + 10)))

    try:
        asyncio.run(run(200))
        time.sleep(2)
        before = server.rss_kib()
        asyncio.run(run(1000))
        time.sleep(2)
        after = server.rss_kib()
        still_open = requests.get(server.base + "/api/v1/status").status_code
    finally:
        server.stop()
    print(f"\n1,000 connect/disconnect cycles: worker RSS {before} -> {after} KiB "
          f"({after - before:+d} KiB); server answering: {still_open == 200}")
    return {"cycles": 1000, "rss_before_kib": before, "rss_after_kib": after, "answering": still_open == 200}


LOGIN_USERS, LOGINS_EACH, STATUS_CONNECTIONS, LOGIN_RUNS = 20, 3, 10, 3


def bench_logins(workdir):
    """p99 of GET /api/v1/status on 10 keep-alive connections while 20 users log in 3 times each
    at once (scrypt at the service's cost), against the p99 of as long a stretch without them.
    Each user logs in from its own address (X-Forwarded-For, believed with TRUSTED_PROXIES=1),
    since the service allows 20 log-ins a minute per address; at most 20 wait for a hash at once,
    below the 32 beyond which a log-in is refused with 503."""
    env = dict(service_env(workdir), TRUSTED_PROXIES="1")
    os.environ.update(env)
    import accounts
    from app import create_app

    with create_app().app_context():
        for n in range(LOGIN_USERS):
            accounts.create_user(f"login{n}", f"login{n}@example.com", "bench login password")
    print(f"\n`GET /api/v1/status` on {STATUS_CONNECTIONS} connections, alone and while {LOGIN_USERS} users "
          f"log in {LOGINS_EACH} times each at once; {LOGIN_RUNS} runs\n")
    print("| run | log-ins took s | status p50 / p99 ms alone | status p50 / p99 ms during log-ins | p99 ratio |")
    print("|---|---|---|---|---|")
    runs = []
    for run in range(1, LOGIN_RUNS + 1):
        server = Server("app:app", env)
        try:
            alone, during, took = asyncio.run(measure_logins(server))
        finally:
            server.stop()
        print(f"| {run} | {took:.1f} | {alone[0]:.1f} / {alone[1]:.1f} | {during[0]:.1f} / {during[1]:.1f} "
              f"| {during[1] / alone[1]:.2f} |")
        runs.append({"logins_took_s": round(took, 1), "alone_ms": {"p50": alone[0], "p99": alone[1]},
                     "during_ms": {"p50": during[0], "p99": during[1]}})
    return {"users": LOGIN_USERS, "logins_each": LOGINS_EACH, "connections": STATUS_CONNECTIONS, "runs": runs}


async def measure_logins(server):
    """Return ((p50, p99) alone, (p50, p99) during the log-ins, seconds the log-ins took)."""
    host, port = "127.0.0.1", server.port
    request = f"GET /api/v1/status HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode()
    samples, stop = [], asyncio.Event()

    async def poll():
        reader, writer = await asyncio.open_connection(host, port)
        while not stop.is_set():
            started = time.perf_counter()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(re.search(rb"Content-Length: (\d+)", head)[1])
            await reader.readexactly(length)
            samples.append((started, time.perf_counter() - started))
        writer.close()

    def log_in(user):
        with requests.Session() as browser:
            browser.headers["X-Forwarded-For"] = f"10.77.0.{user + 1}"
            page = browser.get(server.base + "/login").text
            token = re.search(r'name="csrf_token" value="([^"]+)"', page)[1]
            response = browser.post(server.base + "/login", allow_redirects=False, timeout=300,
                                    data={"username": f"login{user}", "password": "bench login password",
                                          "csrf_token": token})
            assert response.status_code == 302, response.status_code

    pollers = [asyncio.ensure_future(poll()) for _ in range(STATUS_CONNECTIONS)]
    await asyncio.sleep(1)
    alone_from = time.perf_counter()
    await asyncio.sleep(5)
    alone_to = during_from = time.perf_counter()
    loop = asyncio.get_running_loop()
    with concurrent.futures.ThreadPoolExecutor(LOGIN_USERS) as pool:
        await asyncio.gather(*(loop.run_in_executor(pool, log_in, n % LOGIN_USERS)
                               for n in range(LOGIN_USERS * LOGINS_EACH)))
    during_to = time.perf_counter()
    stop.set()
    await asyncio.gather(*pollers)

    def p50_p99(start, end):
        latencies = sorted(latency * 1000 for started, latency in samples if start <= started < end)
        return latencies[len(latencies) // 2], latencies[int(0.99 * len(latencies))]

    return p50_p99(alone_from, alone_to), p50_p99(during_from, during_to), during_to - during_from


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parts = {"rest": bench_rest, "sockets": bench_sockets, "stalled": bench_stalled, "echo": bench_echo,
             "cycles": bench_cycles, "logins": bench_logins, "redis": bench_redis, "scale": bench_scale}
    # Checked here: argparse 3.11 checks an empty nargs="*" against choices and refuses it.
    parser.add_argument("parts", nargs="*", help=f"any of {', '.join(parts)} (default: all)")
    parser.add_argument("--all", action="store_true",
                        help="sockets: read every socket with several client processes, not only the last 100")
    parser.add_argument("--against", type=Path, metavar="DIR",
                        help="rest, echo, redis, scale: also measure the service in DIR, a checkout of another revision "
                             "(git worktree add DIR REV), interleaved with this one")
    parser.add_argument("--json", type=Path, metavar="FILE",
                        help="also write every scenario's numbers to FILE, as bench/plot.py reads them")
    args = parser.parse_args()
    chosen = args.parts or list(parts)
    global AGAINST, ALL_SOCKETS
    ALL_SOCKETS = args.all
    AGAINST = args.against and args.against.resolve()
    if unknown := set(chosen) - set(parts):
        parser.error(f"unknown parts: {', '.join(sorted(unknown))}")
    os.sched_setaffinity(0, {int(CLIENT_CORE)})
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 65536)), hard))
    print(f"{datetime.date.today()}, {os.cpu_count()} cores, Python {sys.version.split()[0]}, "
          f"one gevent worker on core {SERVER_CORE}, clients on core {CLIENT_CORE}")
    report = {"date": datetime.date.today().isoformat(),
              "command": "python bench/run.py " + " ".join(sys.argv[1:]),
              "machine": {"cores": os.cpu_count(), "python": sys.version.split()[0],
                          "server_core": SERVER_CORE, "client_core": CLIENT_CORE},
              "settings": {"wrk_seconds": WRK_SECONDS, "wrk_connections": WRK_CONNECTIONS,
                           "repetitions": REPETITIONS, "random_keys": RANDOM_KEYS,
                           "socket_counts": list(SOCKET_COUNTS), "tick_seconds": TICK_SECONDS,
                           "echo_clients": ECHO_CLIENTS, "echo_seconds": ECHO_SECONDS},
              "parts": {}}
    for part in chosen:
        with tempfile.TemporaryDirectory(prefix=f"bench-{part}-") as workdir:
            report["parts"][part] = parts[part](Path(workdir))
        if args.json:  # after each part, so a long run interrupted later keeps what it measured
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
