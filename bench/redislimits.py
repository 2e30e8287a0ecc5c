"""protected/test with one key, its limits in Redis and in memory, in rounds whose order rotates;
with --against, the other checkout's Redis path beside them. BENCH_REDIS_URL picks the Redis
database, which is emptied first.

    python -m bench.redislimits [--against DIR] [--quick] [--json FILE]
"""

from bench import servers, suite, wrk


def measure(workdir, options):
    import redis

    env = servers.service_env(workdir)
    secret = servers.seed_keys(env, 1)[0]
    redis_env = dict(env, RATELIMIT_STORAGE_URL=servers.REDIS_URL)
    redis.Redis.from_url(servers.REDIS_URL).flushdb()
    started = {"memory://": servers.service(env), "redis://": servers.service(redis_env)}
    if options.against:
        started[f"redis:// of {options.against.name}"] = servers.service(redis_env, options.against)
    header = [f"X-API-Key: {secret}"]
    try:
        for server in started.values():
            wrk.run(server.base + "/api/v1/protected/test", headers=header, seconds=options.wrk_seconds)  # warm-up
        results = {name: [] for name in started}
        for repetition in range(options.repetitions):
            for name in servers.rotated(list(started), repetition):
                results[name].append(wrk.run(started[name].base + "/api/v1/protected/test", headers=header,
                                             seconds=options.wrk_seconds))
    finally:
        for server in started.values():
            server.stop()
    print(f"\nprotected/test, 1 key, by limit storage: wrk -t2 -c{wrk.CONNECTIONS} -d{options.wrk_seconds}s, "
          f"{options.repetitions} runs, the order rotated each run\n")
    print("| storage | req/s, each run | p99 ms, each run | ÷ memory, each run | non-2xx |")
    print("|---|---|---|---|---|")
    for name, runs in results.items():
        ratios = [run["rps"] / memory["rps"] for run, memory in zip(runs, results["memory://"])]
        rps = " / ".join(f"{run['rps']:,.0f}" for run in runs)
        p99 = " / ".join(f"{run['p99']:.1f}" for run in runs)
        print(f"| {name} | {rps} | {p99} | {' / '.join(f'{ratio:.2f}' for ratio in ratios)} "
              f"| {sum(run['non_2xx'] for run in runs)} |")
    return {"baseline": "memory://", "storages": results}


if __name__ == "__main__":
    suite.main("python -m bench.redislimits", {"redis": measure}, __doc__)
