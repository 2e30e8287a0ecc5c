"""How exactly the service's limits hold across processes and machines: for each storage (memory
in one process, one Redis, a Redis Cluster of three masters and three replicas), instances (1, 2,
4) and workers (1, 2), every cell sends bursts of 0.5, 1 and 3 times a key's allowance at once,
spread over the instances, each burst on a fresh key (so each is one window of its own), and
counts what was admitted against what the window allows. Then, on the cluster, the master holding
a key's window is SIGKILLed in the middle of its window: what the failover loses shows as
over-admission.

    python -m bench.accuracy                  # the matrix; writes docs/accuracy.md and docs/accuracy.png
    python -m bench.accuracy --rounds 2 --no-write

The servers are the Procfile's gunicorn on private PostgreSQL and Redis servers (and a cluster on
the machine's redis-server), pinned to core 1 where the machine has two, the clients on core 0.
tests/live/test_accuracy.py runs a few cells of it and asserts the promise: no over-admission
while every node is up."""

import argparse
import collections
import concurrent.futures
import contextlib
import datetime
import os
import re
import signal
import sys
import tempfile
import time
from pathlib import Path

import redis
import requests

from bench import servers

sys.path.insert(0, str(servers.ROOT / "tests" / "support"))

from liveserver import CliSession, children, service_env, start_procfile  # noqa: E402
from privateservers import PrivatePostgres, PrivateRedis  # noqa: E402
from redistopologies import kill_master_holding, masters, redis_cluster  # noqa: E402

LIMIT = 10
# The tiers' windows, in seconds, as RATE_LIMIT_TIERS names them (its periods: second to day).
WINDOWS = {1: "second", 60: "minute"}
LOADS = (0.5, 1, 3)
TIERS = ",".join(f"w{seconds}={LIMIT}/{period}" for seconds, period in WINDOWS.items())
DEPLOYMENTS = [("memory", 1, 1)] + [(storage, instances, workers) for storage in ("redis", "cluster")
                                    for instances in (1, 2, 4) for workers in (1, 2)]
FAILOVER_DEPLOYMENT = ("cluster", 4, 2)
ENDPOINT = "/api/v1/protected/test"
DOCS = servers.ROOT / "docs"

Round = collections.namedtuple("Round", "offered admitted refused failed seconds")
Round.__doc__ = """One burst: requests sent, answered 200, answered 429, answered otherwise (503, 500, no
answer), and the seconds from its first send to its last answer."""


def pin_to_server_core(pid):
    """The master and the workers it has forked (those it forks later inherit it)."""
    if os.cpu_count() > 1:
        for process in [pid, *children(pid)]:
            os.sched_setaffinity(process, {int(servers.SERVER_CORE)})


def over_admitted(rounds, window):
    """The requests admitted beyond the allowance, over the rounds that ended within their window
    (a longer burst spans two windows, where twice the allowance is right)."""
    return sum(max(0, one.admitted - LIMIT) for one in rounds if one.seconds < window)


def admitted_share(rounds):
    """Admitted ÷ allowed: 1.0 is exact."""
    return sum(one.admitted for one in rounds) / sum(min(one.offered, LIMIT) for one in rounds)


class Deployment:
    """instances of the service, each of `workers` gevent workers, on one database and one limit storage."""

    def __init__(self, folder, database_url, storage_url, instances, workers):
        self.env = service_env(folder, DATABASE_URL=database_url, RATELIMIT_STORAGE_URL=storage_url,
                               WEB_CONCURRENCY=str(workers), RATE_LIMIT_TIERS=TIERS, PUBLIC_RATE_LIMIT="off",
                               MAX_KEYS_PER_USER="100000")
        self.storage_url = storage_url
        folder.mkdir(parents=True, exist_ok=True)
        self.commands = CliSession(self.env)
        self.instances = []
        try:
            self.commands("users", "create", "bench", "--email", "bench@example.com", "--password-stdin",
                          stdin="a long bench password\n")
            for _ in range(instances):
                self.instances.append(start_procfile(folder, self.env))
                pin_to_server_core(self.instances[-1].process.pid)
        except BaseException:
            self.close()
            raise
        self.bases = [instance.base for instance in self.instances]

    def new_key(self, window):
        """A fresh key of the window's tier: (its id, its secret)."""
        printed = self.commands("keys", "create", "bench", "--name", "bench", "--type", "production",
                                "--tier", f"w{window}")
        return int(re.search(r"\(id ([0-9]+)\)", printed)[1]), printed.strip().splitlines()[-1]

    def burst(self, secret, count, pool):
        """count requests with the key at once, round-robin over the instances: a Round."""
        def get(number):
            try:
                return requests.get(self.bases[number % len(self.bases)] + ENDPOINT, headers={"X-API-Key": secret},
                                    timeout=30).status_code
            except requests.RequestException:
                return None

        started = time.monotonic()
        statuses = list(pool.map(get, range(count)))
        seconds = time.monotonic() - started
        return Round(count, statuses.count(200), statuses.count(429), count - statuses.count(200)
                     - statuses.count(429), seconds)

    def close(self):
        for instance in self.instances:
            instance.stop()
        self.commands.close()


def measure(deployment, windows=tuple(WINDOWS), loads=LOADS, rounds=3):
    """{(window, load): [Round, ...]} of each cell on the deployment, a fresh key a round."""
    results = {}
    with concurrent.futures.ThreadPoolExecutor(int(max(loads) * LIMIT)) as pool:
        for window in windows:
            for load in loads:
                results[window, load] = [deployment.burst(deployment.new_key(window)[1], int(load * LIMIT), pool)
                                         for _ in range(rounds)]
    return results


def failover(deployment, pool):
    """Kill the master holding a 60-second key's window once half its allowance is used, then send
    a request every 0.1 s until 3 s after the first 200 again: (the Round of the whole window, the
    seconds from the kill to that first 200)."""
    key_id, secret = deployment.new_key(60)
    first = deployment.burst(secret, LIMIT // 2, pool)
    kill_master_holding(deployment.storage_url, f"*key:{key_id}*")
    killed, back, statuses = time.monotonic(), None, []
    while time.monotonic() - killed < 30 and (back is None or time.monotonic() - killed < back + 3):
        try:
            status = requests.get(deployment.bases[len(statuses) % len(deployment.bases)] + ENDPOINT,
                                  headers={"X-API-Key": secret}, timeout=30).status_code
        except requests.RequestException:
            status = None
        statuses.append(status)
        if status == 200 and back is None:
            back = time.monotonic() - killed
        time.sleep(0.1)
    deployment.errors = statuses.count(500)
    refused = first.refused + statuses.count(429)
    whole = Round(first.offered + len(statuses), first.admitted + statuses.count(200), refused,
                  first.failed + len(statuses) - statuses.count(200) - statuses.count(429),
                  time.monotonic() - killed)
    return whole, back


def emptied(storage_url):
    """Delete every window the storage holds (on each master of a cluster)."""
    if storage_url.startswith("redis+cluster://"):
        for host, port in masters(storage_url):
            redis.Redis(host=host, port=port).flushall()
    elif storage_url.startswith("redis://"):
        redis.Redis.from_url(storage_url).flushall()


@contextlib.contextmanager
def storages(folder, wanted):
    """{storage: URL} of the storages wanted, each started for the run."""
    with contextlib.ExitStack() as stack:
        urls = {"memory": "memory://"}
        if "redis" in wanted:
            private = PrivateRedis()
            stack.callback(private.close)
            urls["redis"] = private.url
        if "cluster" in wanted:
            urls["cluster"] = stack.enter_context(redis_cluster(folder / "cluster"))
        yield urls


def run(rounds, deployments):
    folder = Path(tempfile.mkdtemp(prefix="bench-accuracy-"))
    postgres = PrivatePostgres()
    report = {"cells": [], "failover": None}
    try:
        with storages(folder, {storage for storage, _, _ in deployments}) as urls:
            for number, (storage, instances, workers) in enumerate(deployments):
                database = f"{postgres.url.rsplit('/', 1)[0]}/bench{number}"
                postgres.run("createdb", "-h", "127.0.0.1", "-p", str(postgres.port), "-U", "postgres",
                             f"bench{number}")
                # Each deployment's database numbers its keys from 1 again: their old windows must go.
                emptied(urls[storage])
                deployment = Deployment(folder / f"d{number}", database, urls[storage], instances, workers)
                try:
                    for (window, load), cell in measure(deployment, rounds=rounds).items():
                        report["cells"].append({
                            "storage": storage, "instances": instances, "workers": workers, "window": window,
                            "load": load, "share": admitted_share(cell), "over": over_admitted(cell, window),
                            "failed": sum(one.failed for one in cell), "rounds": [one._asdict() for one in cell]})
                        print(f"{storage:8} {instances}x{workers} window {window:2}s load {load:3}: admitted "
                              f"{report['cells'][-1]['share']:.3f} of allowed, over {report['cells'][-1]['over']}",
                              flush=True)
                    # Last on the cluster: the killed master's replica serves its slots from then on.
                    if storage == "cluster" and (storage, instances, workers) == FAILOVER_DEPLOYMENT:
                        with concurrent.futures.ThreadPoolExecutor(LIMIT) as pool:
                            whole, back = failover(deployment, pool)
                        report["failover"] = {**whole._asdict(), "back": back, "errors": deployment.errors,
                                              "over": max(0, whole.admitted - LIMIT)}
                        print("failover:", report["failover"], flush=True)
                finally:
                    deployment.close()
    finally:
        postgres.close()
    return report


def chart(report, path):
    """Admitted ÷ allowed for every cell, one panel a storage, and the failover's cell."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    storages_run = list(dict.fromkeys(cell["storage"] for cell in report["cells"]))
    figure, axes = plt.subplots(1, len(storages_run), figsize=(4 * len(storages_run), 4.6), sharex=True,
                                squeeze=False)
    # Each cell of a deployment on a line of its own inside the deployment's row.
    kinds = [(window, load) for window in WINDOWS for load in LOADS]
    markers = {(window, load): (marker, colour) for window, marker in zip(WINDOWS, "os")
               for load, colour in zip(LOADS, ("#4c72b0", "#55a868", "#c44e52"))}
    for axis, storage in zip(axes[0], storages_run):
        cells = [cell for cell in report["cells"] if cell["storage"] == storage]
        rows = list(dict.fromkeys((cell["instances"], cell["workers"]) for cell in cells))
        for cell in cells:
            marker, colour = markers[cell["window"], cell["load"]]
            offset = (kinds.index((cell["window"], cell["load"])) - (len(kinds) - 1) / 2) * 0.13
            axis.plot(cell["share"], rows.index((cell["instances"], cell["workers"])) + offset, marker,
                      color=colour, label=f"{cell['window']} s window, {cell['load']}x the allowance")
        failed = report.get("failover")
        if storage == "cluster" and failed:
            share = failed["admitted"] / LIMIT
            axis.plot(share, len(rows), "X", color="#222222", markersize=9)
            axis.annotate(f"master killed ({FAILOVER_DEPLOYMENT[1]} x {FAILOVER_DEPLOYMENT[2]}): "
                          f"{failed['over']} over, {failed['failed']} x 503", (share, len(rows)),
                          xytext=(8, 0), textcoords="offset points", va="center", fontsize=8)
            rows.append(("killed", ""))
        axis.axvline(1.0, color="#222222", linewidth=0.8)
        axis.set_xlim(0.5, 1.5)
        axis.set_yticks(range(len(rows)), [f"{instances} x {workers}" if workers else "failover"
                                           for instances, workers in rows])
        axis.set_title(storage, fontsize=10)
        axis.set_xlabel("admitted / allowed")
        axis.invert_yaxis()
        axis.grid(axis="x", alpha=0.3)
    axes[0][0].set_ylabel("instances x workers")
    handles, labels = axes[0][0].get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    figure.legend(unique.values(), unique.keys(), loc="lower center", ncol=3, fontsize=8)
    figure.suptitle("Admitted / allowed per cell (1.0: exact; over 1.0: over-admission)", fontsize=11)
    figure.text(0.01, 0.01, f"{report['date']}: {report['command']}", fontsize=7, color="#555555")
    figure.tight_layout(rect=(0, 0.12, 1, 0.95))
    figure.savefig(path, dpi=110)


def markdown(report):
    """docs/accuracy.md from a report."""
    lines = [
        "# Accuracy of the limits",
        "",
        "How exactly a key's allowance holds when its requests arrive at once on several instances and",
        "workers, on each limit storage. Each cell sends bursts of 0.5, 1 and 3 times the allowance",
        f"({LIMIT} requests a window) at once, round-robin over the instances, each burst on a fresh key so",
        "that it is one window of its own, and counts the 200s against what the window allows. The",
        "promise: **no over-admission while every node is up, on every storage**; `tests/live/test_accuracy.py`",
        "runs a few cells of this in the suite and asserts it.",
        "",
        f"Made by `{report['command']}` on {report['date']} ({report['machine']}), {report['rounds']} bursts a cell; "
        "the servers are the",
        "Procfile's gunicorn on a private PostgreSQL, pinned to core 1, the clients on core 0. Windows are",
        "1 s and 60 s: the tiers' periods are a second, a minute, an hour and a day, so there is no 10 s cell.",
        "",
        "![Admitted / allowed per cell](accuracy.png)",
        "",
        "| storage | instances x workers | window | load | admitted / allowed | over-admitted | not 200 or 429 |",
        "|---|---|---|---|---|---|---|",
    ]
    for cell in report["cells"]:
        lines.append(f"| {cell['storage']} | {cell['instances']} x {cell['workers']} | {cell['window']} s | "
                     f"{cell['load']}x | {cell['share']:.3f} | {cell['over']} | {cell['failed']} |")
    over = sum(cell["over"] for cell in report["cells"])
    lines += ["", f"Over-admitted in all, every node up: **{over}** requests in {len(report['cells'])} cells."]
    failed = report.get("failover")
    if failed:
        lines += [
            "",
            "## A master killed in the middle of a window",
            "",
            f"On the cluster with {FAILOVER_DEPLOYMENT[1]} instances of {FAILOVER_DEPLOYMENT[2]} workers: half of a "
            "60-second key's allowance used,",
            f"then the master holding its window SIGKILLed, then {failed['offered'] - LIMIT // 2} more requests, "
            "one every 0.1 s.",
            f"Requests got 503 until the replica took over, {failed['back']:.1f} s after the kill; "
            f"{failed['failed']} answered other than 200 or 429,",
            f"{failed['errors']} of them 500. The window admitted {failed['admitted']} of its {LIMIT}: "
            f"**{failed['over']} over-admitted**,",
            "the counts the replica had not received when its master died (Redis replicates asynchronously:",
            "at most the last second's counts are lost, see [Scaling](scaling.md#failures)).",
        ]
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="bursts per cell (each on a fresh key)")
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/ as it is")
    arguments = parser.parse_args()
    # A stop (SIGTERM) unwinds as Ctrl-C does, so the servers and private databases stop with the run.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    servers.use_client_core()
    report = run(arguments.rounds, DEPLOYMENTS)
    report["rounds"] = arguments.rounds
    report["command"] = "python -m bench.accuracy" + "".join(
        f" {word}" for word in sys.argv[1:] if word != "--no-write")
    report["date"] = datetime.date.today().isoformat()
    report["machine"] = f"{os.cpu_count()} cores, Python {sys.version.split()[0]}"
    print(markdown(report))
    if not arguments.no_write:
        chart(report, DOCS / "accuracy.png")
        (DOCS / "accuracy.md").write_text(markdown(report))


if __name__ == "__main__":
    main()
