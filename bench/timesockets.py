"""Time sockets on one worker: how late each second's tick arrives and what a socket costs in
memory, for 1,000 to 5,000 sockets (or the counts given). By default the 100 sockets opened last
are read and the others held unread, for 10 s of ticks; with --all, client processes read every
socket for 60 s of ticks and the kernel stamps each arrival, and their CPU share is reported.

    python -m bench.timesockets [--all] [--sockets N [N ...]] [--runs N] [--quick] [--json FILE]
"""

import asyncio
import time

import websockets

from bench import clients, sendfloor, servers, suite, ticks

SAMPLE_SOCKETS = 100
STALLED_RECEIVE_BUFFER = 1024


def measure(workdir, options):
    env = servers.service_env(workdir)
    # The service allows 10 time sockets per key.
    secrets = servers.seed_keys(env, max(options.socket_counts) // 10)
    seconds = options.every_socket_seconds if options.all_sockets else options.tick_seconds
    if options.all_sockets:
        print(f"\nTime sockets, every one read: {seconds} s of ticks; lateness after the whole second "
              f"of every tick on every socket, as the client's kernel stamped its arrival (SO_TIMESTAMPNS), read by "
              f"{clients.READER_PROCESSES} client processes on core {servers.CLIENT_CORE}, whose CPU use "
              f"(user + system ÷ wall time, in % of that one core) is shown; before each run, the machine's floor "
              f"in the same minute, read by the same clients: one process that answers the handshakes and writes "
              f"the same frame to every socket at each whole second in a bare send() loop (bench/sendfloor.py), "
              f"its arrival p50 / p99 / max, and the service's arrival p99 ÷ the floor's\n")
        print(f"| sockets{run_column(options)} | handshake failures | skipped seconds | built p50 / p99 / max ms "
              "| arrived p50 / p99 / max ms | client CPU, % of one core | RSS per socket KiB "
              "| floor arrived p50 / p99 / max ms | p99 ÷ floor p99 |")
        print("|---" * (9 + (options.runs > 1)) + "|")
    else:
        print(f"\nTime sockets: all open, {seconds} s of ticks; lateness after the whole second, "
              f"measured on the {SAMPLE_SOCKETS} sockets opened last (the others never read, so the client costs "
              f"nothing)\n")
        print(f"| sockets{run_column(options)} | handshake failures | skipped seconds (sample) "
              "| built p50 / p99 / max ms | arrived p50 / p99 / max ms | RSS per socket KiB |")
        print("|---" * (6 + (options.runs > 1)) + "|")
    rows = []
    for run in range(1, options.runs + 1):
        for count in options.socket_counts:
            floor = read_floor(count, seconds) if options.all_sockets else None
            server = servers.service(env)
            try:
                before = server.rss_kib()
                if options.all_sockets:
                    row = read_every_socket(server, secrets, count, before, seconds)
                    row["floor_arrived_ms"] = floor["arrived_ms"]
                    row["floor_skipped_seconds"] = floor["skipped_seconds"]
                    row["p99_to_floor"] = (row["arrived_ms"] and floor["arrived_ms"]
                                           and round(row["arrived_ms"]["p99"] / floor["arrived_ms"]["p99"], 2))
                    row["floor_tick_p99_ms"] = floor["tick_p99_ms"]
                    row["median_tick_p99_to_floor"] = ticks.median_tick_ratio(row["tick_p99_ms"],
                                                                                floor["tick_p99_ms"])
                else:
                    row = asyncio.run(measure_ticks(server, secrets, count, before, seconds))
            finally:
                server.stop()
            rows.append(row | ({"run": run} if options.runs > 1 else {}))
            print(tick_row(f"{count:,}" + (f" | {run}" if options.runs > 1 else ""), row))
    if options.runs > 1:
        print_runs(rows, options)
    if options.all_sockets:
        print_ticks(rows, options)
    read = "every socket" if options.all_sockets else f"the {SAMPLE_SOCKETS} sockets opened last"
    return {"read": read, "tick_seconds": seconds, "rows": rows}


def run_column(options):
    return " | run" if options.runs > 1 else ""


def print_runs(rows, options):
    """Each count's figures over the runs, side by side."""
    cpu = "client CPU %, each run | " if options.all_sockets else ""
    floor = " floor p99, each run ms | p99 ÷ floor p99, each run |" if options.all_sockets else ""
    print(f"\n| sockets | arrived p50, each run ms | arrived p99, each run ms | {cpu}handshake failures, "
          f"skipped seconds | RSS per socket, each run KiB |{floor}")
    print("|---" * (5 + 3 * bool(cpu)) + "|")
    for count in options.socket_counts:
        runs = [row for row in rows if row["sockets"] == count]

        arrived = {field: each([row["arrived_ms"] and row["arrived_ms"][field] for row in runs])
                   for field in ("p50", "p99")}
        cpu_cell = f"{' / '.join(str(row['client_cpu_percent']) for row in runs)} | " if cpu else ""
        floor_cells = (f" {each([row['floor_arrived_ms'] and row['floor_arrived_ms']['p99'] for row in runs])} | "
                       f"{each([row['p99_to_floor'] for row in runs], '.2f')} |") if cpu else ""
        print(f"| {count:,} | {arrived['p50']} | {arrived['p99']} | {cpu_cell}"
              f"{sum(row['handshake_failures'] for row in runs)}, {sum(row['skipped_seconds'] for row in runs)} "
              f"| {each([row['rss_per_socket_kib'] for row in runs])} |{floor_cells}")


def print_ticks(rows, options):
    """Each run's seconds (every one is in the JSON): the median second's arrival p99 and the three
    slowest, the service's and its floor's, and the median's ratio."""
    print("\nEach second's arrival p99, ms: the median second and the three slowest, the service's; the same, its "
          "floor's; the median second's ÷ the floor's\n")
    for row in rows:
        run = f", run {row['run']}" if options.runs > 1 else ""
        print(f"- {row['sockets']:,}{run}: {ticks.seconds_of(row['tick_p99_ms'])}; "
              f"floor {ticks.seconds_of(row['floor_tick_p99_ms'])}; {each([row['median_tick_p99_to_floor']], '.2f')}")


def each(values, spec=".1f"):
    return " / ".join("-" if value is None else f"{value:{spec}}" for value in values)


def tick_row(first_cell, row):
    """One markdown row of a time-socket table."""
    def layout(spread):
        return "-" if spread is None else f"{spread['p50']:.1f} / {spread['p99']:.1f} / {spread['max']:.1f}"
    cpu = f" {row['client_cpu_percent']} |" if "client_cpu_percent" in row else ""
    floor = (f" {layout(row['floor_arrived_ms'])} | {each([row['p99_to_floor']], '.2f')} |"
             if "floor_arrived_ms" in row else "")
    return (f"| {first_cell} | {row['handshake_failures']} | {row['skipped_seconds']} | {layout(row['built_ms'])} "
            f"| {layout(row['arrived_ms'])} |{cpu} {row['rss_per_socket_kib']:.1f} |{floor}")


def read_every_socket(server, secrets, count, rss_before, tick_seconds):
    """--all: clients.READER_PROCESSES processes open `count` sockets between them and read every tick."""
    paths = [f"/api/v1/ws/time?api_key={secrets[index // 10]}" for index in range(count)]
    row = clients.read_every_socket(server.port, paths, tick_seconds, server.rss_kib)
    rss_open = row.pop("rss_open_kib")
    return row | {"rss_per_socket_kib": round((rss_open - rss_before) / max(1, count - row["handshake_failures"]), 1)}


def read_floor(count, tick_seconds):
    """The floor of the same count, read the same way (bench/sendfloor.py)."""
    floor = servers.Floor()
    try:
        return clients.read_every_socket(floor.port, [sendfloor.PATH] * count, tick_seconds)
    finally:
        floor.stop()


async def measure_ticks(server, secrets, count, rss_before, tick_seconds, stalled=0, flood=False):
    """Hold count - SAMPLE_SOCKETS sockets unread, the first `stalled` of them with tiny receive
    buffers (and, with flood, sending pings flat out); read the SAMPLE_SOCKETS opened last."""
    host, port = "127.0.0.1", server.port
    url = server.base.replace("http", "ws") + "/api/v1/ws/time?api_key="
    failures, holders, stalled_writers, sample = [], [], [], []
    gate = asyncio.Semaphore(100)

    async def hold(index):
        async with gate:
            try:
                writer = await clients.hold_raw_socket(
                    host, port, f"/api/v1/ws/time?api_key={secrets[index // 10]}",
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
    floods = [asyncio.ensure_future(clients.flood_pings(writer)) for writer in stalled_writers if flood]
    await asyncio.gather(*(watch(i) for i in range(count - SAMPLE_SOCKETS, count)))

    async def listen(ws, arrivals):
        async for raw in ws:
            arrivals.append((time.time(), raw))

    listeners = [asyncio.ensure_future(listen(ws, arrivals)) for ws, arrivals in sample]
    await asyncio.sleep(2)
    rss_open = server.rss_kib()
    first_second = int(time.time()) + 2
    window = set(range(first_second, first_second + tick_seconds))
    await asyncio.sleep(first_second + tick_seconds + 1.5 - time.time())
    for task in listeners + floods:
        task.cancel()
    await asyncio.gather(*listeners, *floods, return_exceptions=True)
    for writer in holders:
        writer.close()

    arrived_ms, built_ms, skipped = clients.lateness((arrivals for _, arrivals in sample), window)
    per_socket = (rss_open - rss_before) / max(1, len(holders) + len(sample))
    return {"sockets": count, "handshake_failures": len(failures), "skipped_seconds": skipped,
            "built_ms": clients.percentiles(sorted(built_ms)), "arrived_ms": clients.percentiles(sorted(arrived_ms)),
            "rss_per_socket_kib": round(per_socket, 1)}


if __name__ == "__main__":
    suite.main("python -m bench.timesockets", {"sockets": measure}, __doc__)
