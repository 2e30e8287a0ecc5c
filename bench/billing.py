"""Benchmark of the usage export to billing (docs/billing.md), run by hand, for each target (stripe,
lago, openmeter, cloudevents): the long proof that every hour reaches the billing system once, the
events a second it sends, and the time from an hour's close to its last event accepted. Prints
markdown tables; docs/bench/billing-export.md has the figures. A run of all four takes about 8 minutes.

    python -m bench.billing                               # every target, one run
    python -m bench.billing --runs 2                      # two runs, each on fresh servers and stores
    python -m bench.billing --targets lago stripe --parts speed --events 20000

Each part of each run starts a PostgreSQL cluster and a redis-server of its own
(tests/support/privateservers.py), free to run on both cores; a receiver that plays the vendor and
holds every request to the vendor's published description (tests/support/billingvendors.py), in
this process on core 0 with the load's threads (tests/support/keyload.py); and two instances of the
service, the Procfile's gunicorn with WEB_CONCURRENCY=2, pinned to core 1.

exact: 300 keys in 3 organisations (their owner's personal one and two more), each organisation with
a billing customer, every other key with credits. --rounds rounds of keyed load (--load-seconds in
all) on both instances, which are stopped after each; the round's usage rows are then moved back
3 + 3 x round + (key id mod 3) hours, as if served then: each key gets an hour a round, each
organisation six hours. The instances start again with the receiver failing its first 13 calls
(two answers held 12 s, past the sender's 10 s; two 429s; three closed connections; four 500s; two
400s) under a lighter load, and the first instance seen with a call to the receiver under way is
SIGKILLed (when it was the one closing, the rest of the hours wait for the closing's lock to lapse,
55 s, and the next close). Once every organisation's hours are closed and every event is accepted:
for each customer, key (Stripe: organisation), meter and hour, the sum the receiver accepted equals
the usage rows, which hold every request served; no identifier was accepted twice; the outbox holds
only sent events.

speed: 50 organisations of 4 keys; usage rows written straight into usage_hours for every key and
hour before the one just ended, --events events of them (--stripe-events for Stripe, which sends an
event a call and sums an organisation's keys), closed at once by the first close of freshly started
instances; a receiver that answers at once. From the close (the events' created_at) to the last
call accepted: events a second. The receiver's CPU is this process's over that time: near 100 %,
core 0 would be what limits.

lag: then the hour just ended, for those keys: its rows written and the organisations' positions
moved back to it while the instances are stopped, closed by their first close once started again.
The time from that close to the hour's last event accepted. An hour's end to its last event
accepted is at most 2 min (the close waits that long) + 60 s (the closing interval) + this.
"""

import argparse
import collections
import concurrent.futures
import contextlib
import datetime
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

if not __package__:
    # Run as a script, Python put bench/ first on the path, where this module would shadow the
    # service's billing package: import from the project root instead (as bench/run.py does).
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench import servers
from bench.billingstores import (
    ROWS,
    SHIFT,
    arrived,
    closed_usage,
    database_hour,
    execute,
    exported_from,
    outbox_states,
    query,
    setup,
    stores,
)

sys.path.insert(0, str(servers.ROOT / "tests" / "support"))

from billingreceiver import VendorReceiver
from keyload import Load
from liveserver import Server, children, free_port, procfile_command, service_env, wait_for

TARGETS = ["stripe", "lago", "openmeter", "cloudevents"]
HOUR = datetime.timedelta(hours=1)
TOKEN = "bench-billing-token"
RETRY_SCHEDULE = "1s,1s,2s,2s,3s,3s,5s,5s"
# The exactness part's organisations and keys, and how far back each round's rows go.
ORGS, KEYS_PER_ORG = 3, 100
HOURS_BACK, SPREAD = 3, 3
# The receiver's first answers in the exactness part, in this order.
FAILURES = [(2, ("slow", 12)), (2, ("429", 1)), (3, "close"), (4, 500), (2, 400)]
# The speed part's organisations and keys.
SPEED_ORGS, SPEED_KEYS_PER_ORG = 50, 4

class StampedReceiver(VendorReceiver):
    """The vendor's receiver, with the wall time and this process's CPU time of each call it stored."""

    def __init__(self, vendor):
        super().__init__(vendor, token=TOKEN)
        self.stored = []  # (time.time(), time.process_time(), events in the call)

    def settle(self, events):
        answer = super().settle(events)
        if 200 <= answer.status < 300:
            self.stored.append((time.time(), time.process_time(), len(events)))
        return answer


def environment(workdir, postgres, redis, target, receiver):
    return service_env(workdir, DATABASE_URL=postgres.url, RATELIMIT_STORAGE_URL=redis.url, WEB_CONCURRENCY="2",
                       RATE_LIMIT_TIERS="free=1000000/hour", MAX_KEYS_PER_USER="200", BILLING_EXPORT=target,
                       BILLING_URL=receiver.url, BILLING_API_KEY=TOKEN, BILLING_RETRY_SCHEDULE=RETRY_SCHEDULE)


def instance(workdir, env):
    """The Procfile's web process on a free port, pinned to the server core."""
    port = free_port()
    settings, argv = procfile_command()
    return Server(["taskset", "-c", servers.SERVER_CORE, *argv], dict(env, **settings, PORT=str(port)), port,
                  workdir / f"gunicorn-{port}.log")


def instances(workdir, env):
    """Two instances, started at once."""
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        starting = [pool.submit(instance, workdir, env) for _ in range(2)]
        concurrent.futures.wait(starting)
    started = [future.result() for future in starting if future.exception() is None]
    if len(started) < 2:
        stop_all(started)
        raise next(future.exception() for future in starting if future.exception() is not None)
    return started


def calls_under_way(server, port):
    """The connections the instance's processes hold open to the receiver's port: its calls under way."""
    inodes = set()
    for pid in [server.process.pid, *children(server.process.pid)]:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if link.startswith("socket:["):
                        inodes.add(link[len("socket:["):-1])
    with open("/proc/net/tcp") as table:
        rows = [line.split() for line in list(table)[1:]]
    # Columns: sl, local address, remote address, state (01: established), ..., inode (the tenth).
    return sum(1 for row in rows if row[3] == "01" and int(row[2].split(":")[1], 16) == port and row[9] in inodes)


def stop_all(running):
    for server in running:
        server.stop()


def exactness(target, workdir, load_seconds, rounds):
    """The long proof for one target; a dict of what happened, its "result" "exact" or what differed."""
    with stores() as (postgres, redis), StampedReceiver(target) as receiver:
        url = postgres.url
        env = environment(workdir, postgres, redis, target, receiver)
        keys = setup(env, ORGS, KEYS_PER_ORG, target)
        running, load, served = [], None, 0
        try:
            for round_number in range(rounds):
                round_hour = database_hour(url)
                running = instances(workdir, env)
                load = Load(running, keys)
                time.sleep(load_seconds / rounds)
                served += sum(call.outcome == 200 for call in load.stop())
                load = None
                wait_for(lambda: query(url, "SELECT sum(total_requests) FROM api_keys")[0][0] == served, seconds=30)
                stop_all(running)
                execute(url, (SHIFT, {"since": round_hour, "back": HOURS_BACK + SPREAD * round_number,
                                      "spread": SPREAD}))
            first_hour = query(url, "SELECT min(hour) FROM usage_hours")[0][0]
            execute(url, *exported_from(first_hour))
            restart_hour = database_hour(url)
            moved, last_hour = query(url, "SELECT sum(CASE WHEN status BETWEEN 200 AND 299 THEN requests ELSE 0 END), "
                                          "max(hour) FROM usage_hours")[0]
            assert moved == served and last_hour < restart_hour - HOUR, (moved, served, last_hour, restart_hour)

            for times, how in FAILURES:
                receiver.fail(times, how)
            started = time.monotonic()
            running = instances(workdir, env)
            load = Load(running, keys, threads=2)
            # One instance killed in the middle of its sends: the first seen with a call under way.
            receiver_port = int(receiver.url.split(":")[2].split("/")[0])
            deadline = time.monotonic() + 60
            while not any(under_way := [calls_under_way(server, receiver_port) for server in running]):
                assert time.monotonic() < deadline, "no instance made a call in 60 s"
                time.sleep(0.02)
            victim = running[under_way.index(max(under_way))]
            under_way = max(under_way)
            leased = query(url, "SELECT count(*) FROM billing_events WHERE state = 'pending' "
                                "AND sending_until > now() AT TIME ZONE 'UTC'")[0][0]
            # Every moved row is in an hour before this one: closed once each position reaches it.
            closed_to = restart_hour - HOUR
            unclosed = "SELECT count(*) FROM billing_customers WHERE closed_through < %s"
            closing_at_kill = query(url, unclosed, (closed_to,))[0][0]
            os.killpg(victim.process.pid, signal.SIGKILL)
            victim.process.wait()
            closed_after = None

            def all_sent():
                nonlocal closed_after
                if closed_after is None and not query(url, unclosed, (closed_to,))[0][0]:
                    closed_after = time.monotonic() - started
                states = outbox_states(url)
                return (closed_after is not None and set(states) == {"sent"}
                        and states["sent"] == len(closed_usage(url, target)))

            wait_for(all_sent, seconds=300)
            all_sent_after = time.monotonic() - started
            load.stop()
            load = None
            stop_all(running)
            expected, states = closed_usage(url, target), outbox_states(url)
            created = query(url, "SELECT min(created_at) FROM billing_events")[0][0]
        finally:
            if load is not None:
                load.stop()
            stop_all(running)
        accepted = list(receiver.accepted)
        ids = [event["id"] for event in accepted]
        problems = []
        if receiver.invalid:
            problems.append(f"{len(receiver.invalid)} refused as invalid: {receiver.invalid[0]}")
        if len(ids) != len(set(ids)):
            problems.append(f"{len(ids) - len(set(ids))} identifiers accepted twice")
        got = arrived(accepted, target)
        if got != expected:
            wrong = {key for key in set(got) | set(expected) if got.get(key) != expected.get(key)}
            problems.append(f"{len(wrong)} of {len(expected)} sums differ, e.g. {sorted(wrong, key=str)[:3]}")
        if states != {"sent": len(expected)}:
            problems.append(f"outbox {states}, {len(expected)} events expected")
        closed = sum(value for (_, _, meter, hour), value in expected.items()
                     if meter == "api_requests" and hour < closed_to)
        if closed != served:
            problems.append(f"{closed} requests in the hours closed, {served} served")
        hours = {hour for (_, _, _, hour) in expected}
        return {"served": served, "events": len(expected), "hours": len(hours), "accepted": len(accepted),
                "duplicates": len(receiver.duplicates), "calls": len(receiver.requests),
                "failures": sum(times for times, _ in FAILURES), "leased": leased, "under_way": under_way,
                "closing_at_kill": closing_at_kill, "closed_after": closed_after,
                "first_to_last": receiver.stored[-1][0] - utc_seconds(created),
                "all_sent_after": all_sent_after,
                "at_once": max((receiver.concurrent_max(pair) for pair in {(e["customer"], e["meter"])
                                                                            for e in accepted}), default=0),
                "result": "; ".join(problems) or "exact"}


def utc_seconds(naive):
    return naive.replace(tzinfo=datetime.UTC).timestamp()


def speed(target, workdir, events):
    """Events a second of a catch-up closed at once, and the time from the close of one hour to
    its last event accepted; a dict."""
    per_hour = SPEED_ORGS * 2 if target == "stripe" else SPEED_ORGS * SPEED_KEYS_PER_ORG * 2
    hours = max(1, round(events / per_hour))
    with stores() as (postgres, redis), StampedReceiver(target) as receiver:
        url = postgres.url
        env = environment(workdir, postgres, redis, target, receiver)
        setup(env, SPEED_ORGS, SPEED_KEYS_PER_ORG, target)
        now = datetime.datetime.now(datetime.UTC).replace(tzinfo=None)
        # The hour just ended, closed by a close from 2 minutes (and a margin) past its end: the lag
        # part's hour. The speed part's hours are those before it.
        lag_hour = (now - datetime.timedelta(minutes=3)).replace(minute=0, second=0, microsecond=0) - HOUR
        first = lag_hour - hours * HOUR
        execute(url, (ROWS, {"first": first, "last": lag_hour - HOUR}), *exported_from(first))
        expected = hours * per_hour
        running = []
        try:
            running = instances(workdir, env)
            deadline, all_written = time.monotonic() + 900, None
            while len(receiver.accepted) < expected:
                assert time.monotonic() < deadline, f"{len(receiver.accepted)} of {expected} events accepted in 900 s"
                if all_written is None and query(url, "SELECT count(*) FROM billing_events")[0][0] >= expected:
                    all_written = time.time()
                time.sleep(0.1)
            closed_at = utc_seconds(query(url, "SELECT min(created_at) FROM billing_events")[0][0])
            first_call, last_call = receiver.stored[0], receiver.stored[-1]
            catch_up = last_call[0] - closed_at
            closing = (all_written or last_call[0]) - closed_at
            receiver_cpu = (last_call[1] - first_call[1]) / max(last_call[0] - first_call[0], 1e-9)
            calls = len(receiver.requests)

            # The lag: the hour just ended, its rows written and the customers' position moved back
            # to it in one transaction while the instances are stopped, closed by their first close
            # once started again (the next periodic close would come a minute after the first).
            stop_all(running)
            execute(url, (ROWS, {"first": lag_hour, "last": lag_hour}),
                    ("UPDATE billing_customers SET closed_through = %(h)s", {"h": lag_hour}),
                    ("DELETE FROM maintenance_locks WHERE name = 'billing'", None))
            lag_events = per_hour
            running = instances(workdir, env)
            receiver.wait_for(expected + lag_events, seconds=180)
            closed_at = query(url, "SELECT min(created_at) FROM billing_events WHERE hour = %s", (lag_hour,))[0][0]
            lag = receiver.stored[-1][0] - utc_seconds(closed_at)
            sums = closed_usage(url, target)
        finally:
            stop_all(running)
        ids = [event["id"] for event in receiver.accepted]
        assert len(ids) == len(set(ids)) == len(sums) == expected + lag_events, (len(ids), len(set(ids)), len(sums))
        assert arrived(receiver.accepted, target) == sums, "the accepted sums differ from the usage rows"
        assert receiver.invalid == [], receiver.invalid[:3]
        return {"events": expected, "hours": hours, "seconds": catch_up, "per_second": expected / catch_up,
                "calls": calls, "closing": closing, "receiver_cpu": receiver_cpu, "lag_events": lag_events, "lag": lag}


def spread(rows, name, form):
    """Each run's figure, in run order."""
    return " / ".join(form.format(row[name]) for row in rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--targets", nargs="+", choices=TARGETS, default=TARGETS)
    parser.add_argument("--parts", nargs="+", choices=["exact", "speed"], default=["exact", "speed"],
                        help="speed includes the lag")
    parser.add_argument("--load-seconds", type=float, default=30, help="exact: the keyed load, all rounds")
    parser.add_argument("--rounds", type=int, default=2, help="exact: rounds of load, an hour per key each")
    parser.add_argument("--events", type=int, default=10_000, help="speed: events closed at once")
    parser.add_argument("--stripe-events", type=int, default=500,
                        help="speed: Stripe's events closed at once (one a call)")
    args = parser.parse_args()
    servers.use_client_core()
    results = collections.defaultdict(list)
    with tempfile.TemporaryDirectory(prefix="bench-billing-") as folder:
        for run in range(args.runs):
            for target in args.targets:
                workdir = Path(folder) / f"{run}-{target}"
                workdir.mkdir()
                if "exact" in args.parts:
                    results["exact", target].append(exactness(target, workdir, args.load_seconds, args.rounds))
                    print(f"run {run + 1}, {target}, exact: {results['exact', target][-1]}", file=sys.stderr,
                          flush=True)
                if "speed" in args.parts:
                    events = args.stripe_events if target == "stripe" else args.events
                    results["speed", target].append(speed(target, workdir, events))
                    print(f"run {run + 1}, {target}, speed: {results['speed', target][-1]}", file=sys.stderr,
                          flush=True)
    report(args, results)


def report(args, results):
    print(f"\nTwo instances (the Procfile's gunicorn, WEB_CONCURRENCY=2) on core {servers.SERVER_CORE}; receiver "
          f"and load on core {servers.CLIENT_CORE}; {args.runs} run(s)\n")
    if "exact" in args.parts:
        print(f"Exactness: {ORGS} organisations of {KEYS_PER_ORG} keys, {args.load_seconds:g} s of load in "
              f"{args.rounds} rounds, {sum(times for times, _ in FAILURES)} failed answers, one instance killed\n")
        print("| target | run | requests served | events (hours) | calls | sent again, dropped "
              "| the killed instance's calls under way; events leased; organisations not yet closed "
              "| from the restart: all closed; all accepted | most calls at once per customer and meter | result |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for target in args.targets:
            for run, row in enumerate(results["exact", target], 1):
                print(f"| {target} | {run} | {row['served']:,} | {row['events']:,} ({row['hours']}) | {row['calls']:,} "
                      f"| {row['duplicates']} | {row['under_way']}; {row['leased']}; {row['closing_at_kill']} "
                      f"| {row['closed_after']:.1f} s; {row['all_sent_after']:.1f} s "
                      f"| {row['at_once'] if target == 'stripe' else '-'} | {row['result']} |")
    if "speed" in args.parts:
        print(f"\nSpeed: {SPEED_ORGS} organisations of {SPEED_KEYS_PER_ORG} keys, the events of earlier hours closed "
              "at once by the first close of freshly started instances; each run's figure\n")
        print("| target | events (hours) | close to all written | close to last accepted | events/s | median "
              "| receiver's CPU (core 0) |")
        print("|---|---|---|---|---|---|---|")
        speeds = [(target, results["speed", target]) for target in args.targets if results["speed", target]]
        for target, rows in speeds:
            print(f"| {target} | {rows[0]['events']:,} ({rows[0]['hours']}) | {spread(rows, 'closing', '{:.1f} s')} "
                  f"| {spread(rows, 'seconds', '{:.1f} s')} | {spread(rows, 'per_second', '{:,.0f}')} "
                  f"| {statistics.median(row['per_second'] for row in rows):,.0f} "
                  f"| {spread(rows, 'receiver_cpu', '{:.0%}')} |")
        print("\nLag: then one more hour of those keys, the hour just ended, closed by the first close of the "
              "instances started again; each run's figure\n")
        print("| target | the hour's events | close to last accepted | an hour's end to its last event accepted, "
              "at most (2 min + 60 s + the slowest) |")
        print("|---|---|---|---|")
        for target, rows in speeds:
            slowest = max(row["lag"] for row in rows)
            print(f"| {target} | {rows[0]['lag_events']:,} | {spread(rows, 'lag', '{:.2f} s')} "
                  f"| {(120 + 60 + slowest) / 60:.2f} min ({120 + 60 + slowest:.0f} s) |")


if __name__ == "__main__":
    os.environ.setdefault("FLASK_SKIP_DOTENV", "1")
    main()
