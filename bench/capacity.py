"""What the parts every worker and instance share pay for one served request, one kept key and one
open time socket: Redis commands and bytes (and Redis CPU), PostgreSQL transactions, rows written
and connections held, the worker's memory. Counts, not timings: a busy machine moves them little.
docs/scaling.md's capacity plan rests on them.

One worker on PostgreSQL (a database of its own, made afresh) and a redis-server of its own on a
free port: INFO's counters are the whole server's, which another client of a shared Redis would move.

- requests: a fixed number of `GET /api/v1/protected/test` at 1, 10 and 100 at once (keep-alive
  connections), with one key (every request finds it kept) and with a new key each (every request
  reads its key from the database: the case of 1,000,000 keys spread thin);
- the key cache: tracemalloc around serving 10,000 new keys in this process, then clearing the cache;
- time sockets: what a handshake costs, the worker's memory per socket, and with every socket open
  the heartbeats and revocation checks of 60 s (two heartbeats, twelve checks), then the closes.

    python -m bench.capacity [--runs N] [--quick] [--json FILE]
"""

import asyncio
import collections
import gc
import re
import time
import tracemalloc

from bench import clients, servers, sharedstores, suite

POSTGRES_DATABASE = "capacity_bench"  # made afresh at the start of each run
CONCURRENCIES = (1, 10, 100)
HEARTBEAT_SECONDS = 30  # ws/slots.py's SharedSocketSlots.HEARTBEAT_SECONDS, and its window is two of them
# After the last answer: the usage flush (within 1 s), then PostgreSQL's backends report their
# counts: a backend that reported less than a second before going idle reports again 10 s later.
SETTLE_SECONDS = 12
IDLE_SECONDS = 20
# Time sockets closed at once, in the first half of the closes (the second half closes together).
CLOSE_AT_ONCE = 50
PATH = "/api/v1/protected/test"


# The load: a fixed number of requests, each answered before its connection sends the next.

async def send_requests(port, requests, concurrency):
    """Send each request (bytes) once over `concurrency` keep-alive connections; return the count of
    each status. A connection the server closes (keep-alive's end) is opened again."""
    waiting = iter(requests)
    statuses = collections.Counter()

    async def connection():
        reader = writer = None
        for request in waiting:
            for _ in range(3):
                if writer is None:
                    reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(request)
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                    length = re.search(rb"\r\ncontent-length: *(\d+)", head, re.I)
                    await reader.readexactly(int(length[1]) if length else 0)
                    statuses[int(head[9:12])] += 1
                    break
                except (asyncio.IncompleteReadError, ConnectionError):
                    writer.close()
                    reader = writer = None
        if writer is not None:
            writer.close()

    await asyncio.gather(*(connection() for _ in range(concurrency)))
    return statuses


def request_bytes(secret):
    return f"GET {PATH} HTTP/1.1\r\nHost: bench\r\nX-API-Key: {secret}\r\n\r\n".encode()


def measure_requests(server, counters, baseline, one_key, new_keys, count):
    """The per-request costs of `count` requests at each concurrency, one key and a new key each."""
    asyncio.run(send_requests(server.port, [request_bytes(one_key)] * 200, 10))  # scripts loaded, the key kept
    time.sleep(SETTLE_SECONDS)
    idle = counters.idle_rate(IDLE_SECONDS)
    cases = []
    for keys in ("one key", "a new key each"):
        for concurrency in CONCURRENCIES:
            secrets = [one_key] * count if keys == "one key" else new_keys.pop(0)
            rss_before = server.rss_kib()
            before = counters.read()
            with sharedstores.ConnectionWatch(counters.postgres, baseline) as watch:
                started = time.monotonic()
                statuses = asyncio.run(send_requests(server.port, [request_bytes(s) for s in secrets], concurrency))
                seconds = time.monotonic() - started
            time.sleep(SETTLE_SECONDS)
            delta, elapsed = counters.since(before)
            cases.append({"keys": keys, "concurrency": concurrency, "requests": count, "statuses": dict(statuses),
                          "seconds": round(seconds, 2), "connections_held": watch.held,
                          "connections_active": watch.active, "rss_growth_kib": server.rss_kib() - rss_before,
                          "delta": delta, "per_request": sharedstores.per_unit(delta, idle, elapsed, count)})
    return {"idle_per_second": idle, "cases": cases}


# The key cache, in this process: what clearing it frees.

def measure_key_cache(secrets):
    """tracemalloc's bytes held by the key cache once each secret's key has served one request in
    this process (through the app, so each kept key carries what the limiter makes for it), and
    the count of keys it held."""
    from app import create_app

    app = create_app()
    client = app.test_client()
    cache = app.extensions["keys"]
    for secret in secrets[:10]:  # the app's first requests make what every later one shares
        client.get(PATH, headers={"X-API-Key": secret})
    cache.entries.clear()
    gc.collect()
    tracemalloc.start()
    try:
        for secret in secrets:
            assert client.get(PATH, headers={"X-API-Key": secret}).status_code == 200
        app.extensions["usage"].flush()  # the pending counts, which are not the cache's
        gc.collect()
        held, kept = tracemalloc.get_traced_memory()[0], len(cache.entries)
        cache.entries.clear()
        gc.collect()
        freed = held - tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    return {"keys": kept, "bytes": freed, "bytes_per_key": round(freed / kept)}


# Time sockets: handshakes, memory, heartbeats and revocation checks, closes.

def measure_sockets(server, counters, baseline, secrets, count, window):
    """What `count` time sockets (10 a key) cost: each handshake, the worker's memory, `window`
    seconds of heartbeats and revocation checks (starting just after a whole HEARTBEAT_SECONDS),
    and each close; and the slots left in Redis when half of them close at once."""
    redis_port = counters.redis_port
    time.sleep(SETTLE_SECONDS)
    idle = counters.idle_rate(IDLE_SECONDS)
    paths = [f"/api/v1/ws/time?api_key={secrets[index // 10]}" for index in range(count)]
    rss_before = server.rss_kib()
    loop = asyncio.new_event_loop()
    try:
        before = counters.read()
        with sharedstores.ConnectionWatch(counters.postgres, baseline) as watch:
            held, failures = loop.run_until_complete(clients.open_answering_sockets(server.port, paths))
        time.sleep(SETTLE_SECONDS)
        opened, elapsed = counters.since(before)
        handshakes = sharedstores.per_unit(opened, idle, elapsed, len(held))
        rss_per_socket = (server.rss_kib() - rss_before) / len(held)
        # The jobs run half a second after their whole second: start after a heartbeat has run and
        # its checks' counts have reached pg_stat_database, end before the next round would.
        start = (time.time() // HEARTBEAT_SECONDS + 1) * HEARTBEAT_SECONDS + 3
        loop.run_until_complete(asyncio.sleep(start - time.time()))
        before = counters.read()
        loop.run_until_complete(asyncio.sleep(window))
        steady, elapsed = counters.since(before)
        still_open = sum(not holder.closed for holder in held)
        per_socket_second = sharedstores.per_unit(steady, idle, elapsed, len(held) * elapsed)
        # Half the sockets close CLOSE_AT_ONCE at a time, as clients come and go; then the others all
        # at once, as when a network drops them together.
        paced, together = held[:len(held) // 2], held[len(held) // 2:]
        before = counters.read()
        for start in range(0, len(paced), CLOSE_AT_ONCE):
            for holder in paced[start:start + CLOSE_AT_ONCE]:
                holder.transport.close()
            loop.run_until_complete(asyncio.sleep(0.2))
        loop.run_until_complete(asyncio.sleep(SETTLE_SECONDS))
        closed, elapsed = counters.since(before)
        closes = sharedstores.per_unit(closed, idle, elapsed, len(paced))
        slots_after_paced = open_slots(redis_port)
        before = counters.read()
        for holder in together:
            holder.transport.close()
        loop.run_until_complete(asyncio.sleep(SETTLE_SECONDS))
        closed_together, elapsed = counters.since(before)
        slots_after_together = open_slots(redis_port)
    finally:
        loop.close()
    return {"sockets": len(held), "handshake_failures": failures, "still_open_after_window": still_open,
            "window_seconds": window, "rss_per_socket_kib": round(rss_per_socket, 1),
            "connections_held": watch.held, "idle_per_second": idle, "per_handshake": handshakes,
            "per_socket_second": per_socket_second, "per_close": closes,
            "closed_together": len(together), "slots_left_after_paced_closes": slots_after_paced,
            "slots_left_after_closing_together": slots_after_together,
            "deltas": {"handshakes": opened, "window": steady, "paced closes": closed,
                       "closes together": closed_together}}


def open_slots(redis_port):
    """The time-socket slots Redis still holds (ws/slots.py's sorted sets)."""
    import redis

    client = redis.Redis(port=redis_port)
    try:
        return sum(client.zcard(name) for name in client.scan_iter("time-sockets:*"))
    finally:
        client.close()


# The report.

def measure(workdir, options):
    count = 1_000 if options.quick else 10_000
    socket_count = 500 if options.quick else 5_000
    window = HEARTBEAT_SECONDS if options.quick else 2 * HEARTBEAT_SECONDS
    runs = []
    for run in range(1, options.runs + 1):
        redis_server, postgres = sharedstores.PrivateRedis(), sharedstores.Postgres(POSTGRES_DATABASE)
        try:
            env = dict(servers.service_env(workdir), DATABASE_URL=postgres.url, RATELIMIT_STORAGE_URL=redis_server.url)
            secrets = servers.seed_keys(env, 1 + len(CONCURRENCIES) * count + socket_count // 10)
            one_key, socket_keys = secrets[0], secrets[-(socket_count // 10):]
            new_keys = [secrets[1 + i * count:1 + (i + 1) * count] for i in range(len(CONCURRENCIES))]
            counters = sharedstores.Counters(redis_server.port, postgres)
            baseline = postgres.connections()[0]
            server = servers.service(env)
            try:
                requests = measure_requests(server, counters, baseline, one_key, list(new_keys), count)
            finally:
                server.stop()
            key_cache = measure_key_cache(new_keys[0])
            baseline = postgres.connections()[0]
            server = servers.service(env)
            try:
                sockets = measure_sockets(server, counters, baseline, socket_keys, socket_count, window)
            finally:
                server.stop()
        finally:
            postgres.close()
            redis_server.stop()
        runs.append({"run": run, "requests": requests, "key_cache": key_cache, "sockets": sockets})
        print_run(runs[-1], count)
    return {"requests": count, "sockets": socket_count, "runs": runs}


def rows_written(cost):
    return cost["postgres.tup_inserted"] + cost["postgres.tup_updated"]


def usage_rows(cost):
    return sum(cost.get(f"postgres.{table}.{counter}", 0) for table in ("usage_hours", "usage_days")
               for counter in ("n_tup_ins", "n_tup_upd"))


def other_statuses(statuses):
    return ", ".join(f"{count:,} x {status}" for status, count in sorted(statuses.items()) if status != 200) or "0"


def print_run(run, count):
    print(f"\nRun {run['run']}: {count:,} `GET {PATH}` at each concurrency, one worker on PostgreSQL + Redis; "
          "costs per request, the idle worker's own taken out\n")
    print("| keys | at once | s | Redis scripts | Redis commands | Redis bytes in / out | Redis CPU µs "
          "| Redis connections opened | PG transactions | PG rows written (usage rows) "
          "| PG connections held (active) | worker RSS growth KiB | non-200 |")
    print("|---" * 13 + "|")
    for case in run["requests"]["cases"]:
        cost, delta = case["per_request"], case["delta"]
        print(f"| {case['keys']} | {case['concurrency']} | {case['seconds']:.1f} | {cost['redis.scripts']:.3f} "
              f"| {cost['redis.commands']:.2f} | {cost['redis.in']:.0f} / {cost['redis.out']:.0f} "
              f"| {cost['redis.cpu'] * 1e6:.1f} | {delta['redis.connections']} "
              f"| {cost['postgres.xact_commit']:.3f} | {rows_written(cost):.3f} ({usage_rows(cost):.3f}) "
              f"| {case['connections_held']} ({case['connections_active']}) | {case['rss_growth_kib']:,} "
              f"| {other_statuses(case['statuses'])} |")
    idle = run["requests"]["idle_per_second"]
    print(f"\nIdle worker, a second: {idle['postgres.xact_commit']:.2f} PG transactions, "
          f"{rows_written(idle):.2f} rows written, {idle['redis.commands']:.2f} Redis commands")
    cache = run["key_cache"]
    print(f"Key cache: {cache['keys']:,} keys hold {cache['bytes'] / 1024:,.0f} KiB, "
          f"{cache['bytes_per_key']:,} bytes a key ({cache['bytes_per_key'] * 10_000 / 2**20:.1f} MiB per 10,000)")
    sockets = run["sockets"]
    print(f"\nTime sockets: {sockets['sockets']:,} open (10 a key), {sockets['handshake_failures']} failed, "
          f"{sockets['still_open_after_window']:,} still open after the {sockets['window_seconds']} s window; "
          f"worker RSS {sockets['rss_per_socket_kib']} KiB a socket; PG connections held at most "
          f"{sockets['connections_held']}\n")
    print("| | Redis commands | Redis scripts | Redis bytes in / out | Redis connections opened "
          "| PG transactions | PG rows written |")
    print("|---" * 7 + "|")
    for name, phase, unit in (("per_handshake", "handshakes", "a handshake"),
                              ("per_socket_second", "window", "a socket, a second")):
        cost = sockets[name]
        print(f"| {unit} | {cost['redis.commands']:.4f} | {cost['redis.scripts']:.4f} "
              f"| {cost['redis.in']:.1f} / {cost['redis.out']:.1f} | {sockets['deltas'][phase]['redis.connections']} "
              f"| {cost['postgres.xact_commit']:.4f} | {rows_written(cost):.4f} |")
    paced, together = sockets["deltas"]["paced closes"], sockets["deltas"]["closes together"]
    half = sockets["sockets"] - sockets["closed_together"]
    # The sockets still open meanwhile go on with their checks: a close's own cost is its ZREM.
    print(f"\nCloses, {CLOSE_AT_ONCE} at a time: {paced.get('redis.calls.zrem', 0):,} ZREM for {half:,} closes, "
          f"{paced['redis.connections']} Redis connections opened, "
          f"{sockets['slots_left_after_paced_closes'] - sockets['closed_together']:,} "
          f"slots left behind; {sockets['closed_together']:,} at once: {together.get('redis.calls.zrem', 0):,} ZREM, "
          f"{together['redis.connections']} connections opened, {sockets['slots_left_after_closing_together']:,} "
          "slots left behind in all (each until it expires)")
    for phase, calls in sockets["deltas"].items():
        print(f"Redis calls, {phase}: " + ", ".join(f"{name.removeprefix('redis.calls.')} {value:,}"
                                                   for name, value in calls.items() if name.startswith("redis.calls.")))


if __name__ == "__main__":
    suite.main("python -m bench.capacity", {"capacity": measure}, __doc__)
