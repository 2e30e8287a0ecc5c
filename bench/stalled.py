"""3,000 time sockets, with and without 30 (1 %) stalled ones: they never read and have tiny
receive buffers, so the server's writes to them back up; in the last case they also send pings
flat out, whose pongs back up too. The healthy sample's lateness should not move.

    python -m bench.stalled [--quick] [--json FILE]
"""

import asyncio

from bench import servers, suite
from bench.timesockets import measure_ticks, tick_row

SOCKETS, STALLED_SOCKETS = 3000, 30
CASES = {"none": (0, False), "1 % never read": (STALLED_SOCKETS, False),
         "1 % never read, ping flood": (STALLED_SOCKETS, True)}


def measure(workdir, options):
    env = servers.service_env(workdir)
    secrets = servers.seed_keys(env, SOCKETS // 10)
    print(f"\nTime sockets, {SOCKETS:,} open, {options.stalled_runs} interleaved runs of each case\n")
    print("| stalled sockets | handshake failures | skipped seconds (sample) | built p50 / p99 / max ms "
          "| arrived p50 / p99 / max ms | RSS per socket KiB |")
    print("|---|---|---|---|---|---|")
    results = {case: [] for case in CASES}
    for _ in range(options.stalled_runs):
        for case, (stalled, flood) in CASES.items():
            server = servers.service(env)
            try:
                results[case].append(asyncio.run(measure_ticks(server, secrets, SOCKETS, server.rss_kib(),
                                                               options.tick_seconds, stalled, flood)))
            finally:
                server.stop()
            print(tick_row(case, results[case][-1]))
    return {"sockets": SOCKETS, "stalled_sockets": STALLED_SOCKETS, "cases": results}


if __name__ == "__main__":
    suite.main("python -m bench.stalled", {"stalled": measure}, __doc__)
