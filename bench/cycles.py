"""Connect and drop 1,000 time sockets (half without a close frame) and report the worker's RSS
change: what a leak per connection would show.

    python -m bench.cycles [--json FILE]
"""

import asyncio
import time

import requests
import websockets

from bench import servers, suite

CYCLES = 1000


def measure(workdir, options):
    env = servers.service_env(workdir)
    secrets = servers.seed_keys(env, 10)
    server = servers.service(env)
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
        asyncio.run(run(CYCLES))
        time.sleep(2)
        after = server.rss_kib()
        still_open = requests.get(server.base + "/api/v1/status").status_code
    finally:
        server.stop()
    print(f"\n{CYCLES:,} connect/disconnect cycles: worker RSS {before} -> {after} KiB "
          f"({after - before:+d} KiB); server answering: {still_open == 200}")
    return {"cycles": CYCLES, "rss_before_kib": before, "rss_after_kib": after, "answering": still_open == 200}


if __name__ == "__main__":
    suite.main("python -m bench.cycles", {"cycles": measure}, __doc__)
