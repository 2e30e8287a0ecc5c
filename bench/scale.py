"""protected/test with one key: the documented scale-out (PostgreSQL + Redis), the same on a
Redis Cluster of three masters and three replicas started for the run, PostgreSQL with limits in
memory (no key cache there) and the default (SQLite + memory), one worker each, with bare Flask,
in rounds whose order rotates; with --against, those configurations of the other checkout too.
Needs PostgreSQL on 127.0.0.1:5432, Redis (BENCH_REDIS_URL, emptied first) and redis-server 7.

    python -m bench.scale [--against DIR] [--quick] [--json FILE]
"""

import sys
import tempfile
from pathlib import Path

from bench import servers, sharedstores, suite, wrk

POSTGRES_DATABASE = "apiservice_bench"  # made afresh at the start
BARE = "bare Flask `GET /bare`"
BASELINE = "SQLite + memory://"
ONE_REDIS = "PostgreSQL + redis://"
CLUSTER = "PostgreSQL + redis+cluster://"


def redis_cluster(folder):
    """The test suite's Redis Cluster (tests/support/redistopologies.py), started in folder."""
    sys.path.insert(0, str(servers.ROOT / "tests" / "support"))
    from redistopologies import redis_cluster

    return redis_cluster(folder)


def measure(workdir, options):
    with tempfile.TemporaryDirectory() as folder, redis_cluster(Path(folder)) as cluster_url:
        return measure_on(workdir, options, cluster_url)


def measure_on(workdir, options, cluster_url):
    import redis

    database_url = sharedstores.fresh_database(POSTGRES_DATABASE)
    redis.Redis.from_url(servers.REDIS_URL).flushdb()
    sqlite_env = servers.service_env(workdir)
    postgres_env = dict(sqlite_env, DATABASE_URL=database_url)
    secrets = {"sqlite": servers.seed_keys(sqlite_env, 1)[0], "postgresql": servers.seed_keys(postgres_env, 1)[0]}
    configurations = {
        BASELINE: ("sqlite", sqlite_env),
        ONE_REDIS: ("postgresql", dict(postgres_env, RATELIMIT_STORAGE_URL=servers.REDIS_URL)),
        CLUSTER: ("postgresql", dict(postgres_env, RATELIMIT_STORAGE_URL=cluster_url)),
        "PostgreSQL + memory://": ("postgresql", postgres_env),
    }
    started = {BARE: (servers.bare(sqlite_env), "/bare", None)}
    checkouts = [(servers.ROOT, "")] + ([(options.against, f" of {options.against.name}")] if options.against else [])
    try:
        for checkout, suffix in checkouts:
            for name, (database, env) in configurations.items():
                started[name + suffix] = (servers.service(env, checkout), "/api/v1/protected/test", secrets[database])
        results = {name: [] for name in started}
        for repetition in range(options.repetitions + 1):  # the first round warms up
            for name in servers.rotated(list(started), repetition):
                server, path, secret = started[name]
                result = wrk.run(server.base + path, headers=[f"X-API-Key: {secret}"] if secret else [],
                                 seconds=options.wrk_seconds)
                if repetition:
                    results[name].append(result)
    finally:
        for server, _, _ in started.values():
            server.stop()

    print(f"\nprotected/test, 1 key, by configuration: wrk -t2 -c{wrk.CONNECTIONS} -d{options.wrk_seconds}s, "
          f"{options.repetitions} rounds after a warm-up, the order rotated each round\n")
    print("| configuration | req/s, each round | p99 ms, each round | x bare | ÷ SQLite + memory | "
          "p99 ÷ SQLite + memory | non-2xx |")
    print("|---|---|---|---|---|---|---|")
    bare = results[BARE]
    for name, runs in results.items():
        suffix = name[name.index(" of "):] if " of " in name else ""
        sqlite = results[BASELINE + suffix]
        print(f"| {name} | {each(runs, 'rps', '{:,.0f}')} | {each(runs, 'p99', '{:.1f}')} "
              f"| {ratios(runs, bare, 'rps')} | {ratios(runs, sqlite, 'rps')} | {ratios(runs, sqlite, 'p99')} "
              f"| {sum(run['non_2xx'] for run in runs)} |")
    for _, suffix in checkouts:
        print(f"\n{CLUSTER}{suffix} ÷ {ONE_REDIS}{suffix}, each round: "
              f"{ratios(results[CLUSTER + suffix], results[ONE_REDIS + suffix], 'rps')} (req/s), "
              f"{ratios(results[CLUSTER + suffix], results[ONE_REDIS + suffix], 'p99')} (p99)")
    return {"bare": BARE, "baseline": BASELINE, "configurations": results}


def each(runs, field, layout):
    return " / ".join(layout.format(run[field]) for run in runs)


def ratios(runs, others, field):
    """Each round's figure ÷ the other's in the same round."""
    return " / ".join(f"{run[field] / other[field]:.2f}" for run, other in zip(runs, others))


if __name__ == "__main__":
    suite.main("python -m bench.scale", {"scale": measure}, __doc__)
