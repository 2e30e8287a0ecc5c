"""Echo round trips: 50 connections from one asyncio client against the bare flask-sock echo and
the service's echo, interleaved rounds; with --against, another checkout's echo beside them.

    python -m bench.echo [--against DIR] [--quick] [--json FILE]
"""

import json
import statistics

from bench import clients, servers, suite

BARE = "bare flask-sock echo `/echo`"


def measure(workdir, options):
    env = servers.service_env(workdir)
    service, bare = servers.service(env), servers.bare(env)
    cases = {BARE: (bare, "/echo"), "`WS /api/v1/ws/echo`": (service, "/api/v1/ws/echo")}
    if options.against:
        # Its own database: the other checkout may be at an older schema version, and would
        # refuse to start on this one's.
        other = servers.service(dict(env, DATABASE_URL=f"sqlite:///{workdir}/against.db"), options.against)
        cases[f"`WS /api/v1/ws/echo` of {options.against.name}"] = (other, "/api/v1/ws/echo")
    connections, seconds = options.echo_clients, options.echo_seconds
    try:
        for server, path in cases.values():
            clients.echo_round_trips(server.base, path, connections, seconds)  # warm-up
        results = {name: [] for name in cases}
        for repetition in range(options.repetitions):
            for name in servers.rotated(list(cases), repetition):
                server, path = cases[name]
                latencies, reply = clients.echo_round_trips(server.base, path, connections, seconds)
                results[name].append(latencies)
                if server is service:
                    assert json.loads(reply)["message"] == "ping", reply
    finally:
        for server, _ in cases.values():
            server.stop()

    def summary(latencies):
        return len(latencies) / seconds, latencies[len(latencies) // 2] * 1000, \
            latencies[int(len(latencies) * 0.99)] * 1000

    medians = {name: [statistics.median(values) for values in zip(*map(summary, runs))]
               for name, runs in results.items()}
    ceiling = medians[BARE][0]
    print(f"\nEcho: {connections} connections from one asyncio client, {seconds} s, "
          f"median of {options.repetitions} interleaved runs\n")
    print("| socket | round trips/s | x bare | p50 ms | p99 ms |")
    print("|---|---|---|---|---|")
    for name, (rate, p50, p99) in medians.items():
        print(f"| {name} | {rate:,.0f} | {rate / ceiling:.2f} | {p50:.2f} | {p99:.2f} |")
    fields = ("round_trips_per_s", "p50_ms", "p99_ms")
    return {"bare": BARE, "clients": connections,
            "cases": {name: {"runs": [dict(zip(fields, summary(latencies))) for latencies in runs],
                             "median": dict(zip(fields, medians[name]))} for name, runs in results.items()}}


if __name__ == "__main__":
    suite.main("python -m bench.echo", {"echo": measure}, __doc__)
