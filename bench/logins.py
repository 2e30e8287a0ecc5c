"""p99 of GET /api/v1/status on 10 keep-alive connections while 20 users log in 3 times each at
once (scrypt at the service's cost), against the p99 of as long a stretch without them.

Each user logs in from its own address (X-Forwarded-For, believed with TRUSTED_PROXIES=1), since
the service allows 20 log-ins a minute per address; at most 20 wait for a hash at once, below the
32 beyond which a log-in is refused with 503.

    python -m bench.logins [--quick] [--json FILE]
"""

import asyncio
import concurrent.futures
import os
import re
import time

import requests

from bench import servers, suite

LOGIN_USERS, LOGINS_EACH, STATUS_CONNECTIONS = 20, 3, 10


def measure(workdir, options):
    env = dict(servers.service_env(workdir), TRUSTED_PROXIES="1")
    os.environ.update(env)
    from accounts import users
    from app import create_app

    with create_app().app_context():
        for n in range(LOGIN_USERS):
            users.create_user(f"login{n}", f"login{n}@example.com", "bench login password")
    print(f"\n`GET /api/v1/status` on {STATUS_CONNECTIONS} connections, alone and while {LOGIN_USERS} users "
          f"log in {LOGINS_EACH} times each at once; {options.login_runs} runs\n")
    print("| run | log-ins took s | status p50 / p99 ms alone | status p50 / p99 ms during log-ins | p99 ratio |")
    print("|---|---|---|---|---|")
    runs = []
    for run in range(1, options.login_runs + 1):
        server = servers.service(env)
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


if __name__ == "__main__":
    suite.main("python -m bench.logins", {"logins": measure}, __doc__)
