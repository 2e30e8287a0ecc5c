"""REST under wrk: bare Flask, the public endpoint, protected/test with one key and with a
random one of 100,000, the other keyed GETs (user/me, usage/stats, usage/history) with one key,
and the FastAPI peer's async and sync routes (bench/peer.py) with one key, interleaved rounds;
with --against, another checkout's beside them.

    python -m bench.rest [--against DIR] [--runs N] [--quick] [--json FILE]
"""

import os
import statistics

from bench import servers, suite, wrk

BARE = "bare Flask `GET /bare`"
DEMO = "public `GET /api/v1/demo/year`"
ONE_KEY = "`GET /api/v1/protected/test`, 1 key"
RANDOM_KEY = "`GET /api/v1/protected/test`, random of {:,} keys"
PEER_ASYNC = "FastAPI + uvicorn peer, `async def` route, 1 key"
PEER_SYNC = "FastAPI + uvicorn peer, `def` route, 1 key"
# The other keyed GETs, each with one key: they read the database on every request.
OTHER_KEYED = {f"`GET /api/v1/{path}`, 1 key": path for path in ("user/me", "usage/stats", "usage/history")}


def measure(workdir, options):
    env = servers.service_env(workdir)
    secrets = servers.seed_keys(env, options.random_keys)
    keys_file = workdir / "keys.txt"
    keys_file.write_text("\n".join(secrets) + "\n")
    against, other_env = options.against, None
    if against:
        # Its own database, with the same users and keys: the other checkout may be at an older
        # schema version, and would refuse to start on this one's.
        other_env = dict(env, DATABASE_URL=f"sqlite:///{workdir}/against.db")
        servers.service(other_env, against).stop()  # creates its tables
        servers.copy_accounts(workdir / "bench.db", workdir / "against.db")
    runs = []
    for run in range(1, options.runs + 1):
        service, bare, peer = servers.service(env), servers.bare(env), servers.Peer(workdir, secrets[0])
        other = servers.service(other_env, against) if against else None
        try:
            runs.append(measure_rounds(service, bare, peer, other, secrets, keys_file, options))
        finally:
            for server in (service, bare, peer, other):
                if server:
                    server.stop()
        print_run(run, runs[-1], options)
    if options.runs > 1:
        medians = [statistics.median(run["ratios"]) for run in runs]
        print(f"\nprotected/test, 1 key, ÷ bare, median of each run: {', '.join(f'{m:.2f}' for m in medians)}; "
              f"median {statistics.median(medians):.2f}, spread {min(medians):.2f}–{max(medians):.2f}")
        medians = [statistics.median(run["peer_ratios"]) for run in runs]
        print(f"protected/test, 1 key, ÷ the peer's faster route, median of each run: "
              f"{', '.join(f'{m:.2f}' for m in medians)}; median {statistics.median(medians):.2f}, "
              f"spread {min(medians):.2f}–{max(medians):.2f}")
    # Every round of every run: one run's numbers are exactly what a single run has always written.
    results = {name: [result for run in runs for result in run["results"][name]] for name in runs[0]["results"]}
    numbers = {"bare": BARE, "worker_rss_mib": round(runs[-1]["rss"] / 1024),
               "cases": {name: {"runs": rounds, "median": medians_of(rounds)} for name, rounds in results.items()}}
    if options.runs > 1:
        numbers["ratio_to_bare_runs"] = [round(statistics.median(run["ratios"]), 3) for run in runs]
        numbers["ratio_to_peer_runs"] = [round(statistics.median(run["peer_ratios"]), 3) for run in runs]
    return numbers


def measure_rounds(service, bare, peer, other, secrets, keys_file, options):
    """A warm-up, then options.repetitions interleaved rounds of every case on these servers."""
    seconds = options.wrk_seconds
    keyed = {"headers": [f"X-API-Key: {secrets[0]}"], "seconds": seconds}
    random_key = {"script": str(servers.BENCH / "random_key.lua"), "env": dict(os.environ, KEYS_FILE=str(keys_file)),
                  "seconds": seconds}
    random_name = RANDOM_KEY.format(options.random_keys)
    cases = {
        BARE: lambda: wrk.run(bare.base + "/bare", seconds=seconds),
        DEMO: lambda: wrk.run(service.base + "/api/v1/demo/year", seconds=seconds),
        ONE_KEY: lambda: wrk.run(service.base + "/api/v1/protected/test", **keyed),
        PEER_ASYNC: lambda: wrk.run(peer.base + "/api/v1/protected/test", **keyed),
        PEER_SYNC: lambda: wrk.run(peer.base + "/sync/api/v1/protected/test", **keyed),
        random_name: lambda: wrk.run(service.base, **random_key),
    }
    for name, path in OTHER_KEYED.items():
        cases[name] = (lambda path: lambda: wrk.run(f"{service.base}/api/v1/{path}", **keyed))(path)
    if other:
        name = options.against.name
        cases[f"{DEMO}, of {name}"] = lambda: wrk.run(other.base + "/api/v1/demo/year", seconds=seconds)
        cases[f"{ONE_KEY}, of {name}"] = lambda: wrk.run(other.base + "/api/v1/protected/test", **keyed)
        # Both carry 100,000 keys' windows into the next round, or the comparison would not be fair.
        cases[f"{random_name}, of {name}"] = lambda: wrk.run(other.base, **random_key)
    for case in cases.values():
        case()  # warm-up
    results = {name: [] for name in cases}
    for repetition in range(options.repetitions):
        for name in order(random_name, repetition, other and options.against.name):
            results[name].append(cases[name]())
    ratios = [ours["rps"] / bare["rps"] for ours, bare in zip(results[ONE_KEY], results[BARE])]
    peer_ratios = [ours["rps"] / max(fast["rps"], slow["rps"])
                   for ours, fast, slow in zip(results[ONE_KEY], results[PEER_ASYNC], results[PEER_SYNC])]
    return {"results": results, "ratios": ratios, "peer_ratios": peer_ratios, "rss": service.rss_kib()}


def order(random_name, repetition, against):
    """The cases of one round. protected/test with one key and the peer's two routes take turns
    to go first. With --against (the other checkout's name), each endpoint of this checkout runs
    next to the same endpoint of the other, which goes first every other round, so that neither
    gains from its place in the round (the public endpoint of the other checkout, run after this
    one's random-key case, came out 10-15 % ahead of its own history)."""
    def beside(name):
        pair = [name, f"{name}, of {against}"] if against else [name]
        return pair if repetition % 2 == 0 else pair[::-1]

    keyed = servers.rotated([beside(ONE_KEY), [PEER_ASYNC], [PEER_SYNC]], repetition)
    return [BARE, *beside(DEMO), *(name for group in keyed for name in group), *OTHER_KEYED, *beside(random_name)]


def medians_of(rounds):
    return ({field: statistics.median(r[field] for r in rounds) for field in ("rps", "p50", "p99")}
            | {"non_2xx": sum(r["non_2xx"] for r in rounds), "errors": rounds[-1]["errors"]})


def print_run(number, run, options):
    results = run["results"]
    medians = {name: medians_of(rounds) for name, rounds in results.items()}
    ceiling = medians[BARE]["rps"]
    of_runs = f", run {number} of {options.runs}" if options.runs > 1 else ""
    print(f"\nREST: wrk -t2 -c{wrk.CONNECTIONS} -d{options.wrk_seconds}s, median of {options.repetitions} "
          f"interleaved runs{of_runs}\n")
    print("| endpoint | req/s | x bare | p50 ms | p99 ms | non-2xx | socket errors |")
    print("|---|---|---|---|---|---|---|")
    for name, m in medians.items():
        print(f"| {name} | {m['rps']:,.0f} | {m['rps'] / ceiling:.2f} | {m['p50']:.2f} | {m['p99']:.2f} "
              f"| {m['non_2xx']} | {m['errors']} |")
    print(f"\nworker RSS after the runs ({options.random_keys:,} keys with windows): {run['rss'] / 1024:.0f} MiB")
    print("protected/test, 1 key, ÷ bare, each round: " + ", ".join(f"{ratio:.2f}" for ratio in run["ratios"])
          + f"; median {statistics.median(run['ratios']):.2f}")
    print("protected/test, 1 key, ÷ the peer's faster route in the same round, each round: "
          + ", ".join(f"{ratio:.2f}" for ratio in run["peer_ratios"])
          + f"; median {statistics.median(run['peer_ratios']):.2f}")
    if options.against:
        theirs = results[f"{ONE_KEY}, of {options.against.name}"]
        print(f"protected/test, 1 key, this checkout ÷ {options.against.name}, each round: "
              + ", ".join(f"{a['rps'] / b['rps']:.2f}" for a, b in zip(results[ONE_KEY], theirs)))


if __name__ == "__main__":
    suite.main("python -m bench.rest", {"rest": measure}, __doc__)
