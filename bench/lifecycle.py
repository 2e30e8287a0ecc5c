"""Benchmark of the data life cycle, run by hand. Prints markdown tables.

    python bench/lifecycle.py year    # a simulated year of traffic, pruned daily: rows and key-page time
    python bench/lifecycle.py p99     # protected/test's p99 alone and while `db prune` deletes 1M rows

year: KEYS keys, each with traffic on two endpoints (a 200 and a 429) every hour, written day by day
on a fast-forwarded clock into a fresh SQLite file as the flush would write them (an hourly and a
daily row per key, endpoint and status), and a few keys revoked and replaced each day. After each
simulated day the prune runs with the default retention (90 days of hours, 400 of days, revoked keys
90 days); at the end of each month the row counts and the key page's reads (24 hours and 30 days of
one key, median of 20) are printed.
"""

import argparse
import datetime
import itertools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if not __package__:
    # Run as a script, Python put bench/ first on the path, where this file would shadow the
    # service's lifecycle module: import from the project root instead.
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench import servers, wrk

KEYS = 200
COMBINATIONS = (("/api/v1/protected/test", 200), ("/api/v1/protected/test", 429))
REPLACED_PER_DAY = 2
DAYS = 365
PRUNE_ROWS = 1_000_000


def simulated_year(workdir):
    os.environ.update(servers.service_env(workdir))
    import models
    from app import create_app
    from metering import analytics, lifecycle

    app = create_app()
    start = datetime.datetime(2026, 1, 1)
    print(f"\nA simulated year: {KEYS} keys, {len(COMBINATIONS)} endpoint-status pairs each every hour, "
          f"{REPLACED_PER_DAY} keys revoked and replaced a day, pruned daily with the default retention\n")
    print("| month | keys | hourly rows | daily rows | key page: 24 h read ms | key page: 30 d read ms | prune s |")
    print("|---|---|---|---|---|---|---|")
    rows = []
    with app.app_context():
        database = models.db.obj
        user = models.User.create(username="year", email="year@example.com", password_hash="-")
        models.create_personal_organisation(user)  # where its keys belong
        numbers = itertools.count()
        keys = [new_key(user, start, next(numbers)) for _ in range(KEYS)]
        hourly_sql = ("INSERT INTO usage_hours (api_key_id, hour, endpoint, status, requests) VALUES (?, ?, ?, ?, ?)")
        daily_sql = ("INSERT INTO usage_days (api_key_id, day, endpoint, status, requests) VALUES (?, ?, ?, ?, ?)")
        prune_seconds = 0.0
        for day in range(DAYS):
            moment = start + datetime.timedelta(days=day)
            with database.atomic():
                database.cursor().executemany(hourly_sql, [
                    (key, moment + datetime.timedelta(hours=hour), endpoint, status, 10)
                    for key in keys for hour in range(24) for endpoint, status in COMBINATIONS])
                database.cursor().executemany(daily_sql, [
                    (key, moment.date(), endpoint, status, 240) for key in keys for endpoint, status in COMBINATIONS])
                for _ in range(REPLACED_PER_DAY):
                    gone = keys.pop(0)
                    models.ApiKey.update(revoked_at=moment).where(models.ApiKey.id == gone).execute()
                    keys.append(new_key(user, moment, next(numbers)))
            end_of_day = moment + datetime.timedelta(days=1)
            started = time.perf_counter()
            lifecycle.prune(app.config, now=end_of_day)
            prune_seconds += time.perf_counter() - started
            if end_of_day.day == 1 or day == DAYS - 1:
                key = keys[KEYS // 2]  # about 50 days old once keys are being replaced: 30 full days
                row = {
                    "month": moment.strftime("%Y-%m"),
                    "keys": models.ApiKey.select().count(),
                    "hourly": models.UsageHour.select().count(),
                    "daily": models.UsageDay.select().count(),
                    "hours_ms": median_ms(lambda: analytics.hourly([key], now=end_of_day)),
                    "days_ms": median_ms(lambda: analytics.daily([key], now=end_of_day)),
                    "prune_s": prune_seconds,
                }
                rows.append(row)
                prune_seconds = 0.0
                print(f"| {row['month']} | {row['keys']:,} | {row['hourly']:,} | {row['daily']:,} "
                      f"| {row['hours_ms']:.2f} | {row['days_ms']:.2f} | {row['prune_s']:.1f} |", flush=True)
    return rows


def new_key(user, moment, n):
    import models

    return models.ApiKey.create(org=models.personal_organisation(user.id), user=user, name=f"key {n}",
                                key_type="development", display_prefix="sk_test_year",
                                key_hash=f"{n:064x}", created_at=moment).id


def median_ms(read, times=20):
    durations = []
    for _ in range(times):
        started = time.perf_counter()
        read()
        durations.append((time.perf_counter() - started) * 1000)
    return statistics.median(durations)


def p99_during_prune(workdir):
    env = servers.service_env(workdir)
    secret = servers.seed_keys(env, 1)[0]
    import models

    with models.db.atomic():
        key = models.ApiKey.get().id
        old = datetime.datetime(2020, 1, 1)
        models.db.obj.cursor().executemany(
            "INSERT INTO usage_hours (api_key_id, hour, endpoint, status, requests) VALUES (?, ?, ?, ?, ?)",
            [(key, old + datetime.timedelta(hours=n // 400), f"/e{n % 400}", 200, 1) for n in range(PRUNE_ROWS)])
        # The server's own background prune stays out of the way: `db prune` alone does the work.
        models.MaintenanceLock.create(name="prune", until=datetime.datetime(2100, 1, 1))
    models.db.close()
    server = servers.service(env)
    try:
        url = server.base + "/api/v1/protected/test"
        headers = [f"X-API-Key: {secret}"]
        wrk.run(url, headers=headers, seconds=3)  # warm-up
        alone = wrk.run(url, headers=headers)
        # On the server's core, as the background prune would run: it takes the server's CPU, not wrk's.
        prune = subprocess.Popen(["taskset", "-c", servers.SERVER_CORE, sys.executable, "-m", "flask", "--app", "app",
                                  "db", "prune"], cwd=servers.ROOT, env=env, stdout=subprocess.PIPE, text=True)
        during = wrk.run(url, headers=headers)
        printed = prune.communicate(timeout=600)[0].strip()
    finally:
        server.stop()
    print(f"\n`GET /api/v1/protected/test`, 1 key, {wrk.CONNECTIONS} connections, {wrk.SECONDS} s; "
          f"`db prune` deleting {PRUNE_ROWS:,} hourly rows ({printed})\n")
    print("| | req/s | p50 ms | p99 ms | non-2xx |")
    print("|---|---|---|---|---|")
    for name, result in (("alone", alone), ("while db prune runs", during)):
        print(f"| {name} | {result['rps']:.0f} | {result['p50']:.2f} | {result['p99']:.2f} | {result['non_2xx']} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("part", choices=["year", "p99"])
    args = parser.parse_args()
    print(f"{datetime.date.today()}, {os.cpu_count()} cores, Python {sys.version.split()[0]}")
    with tempfile.TemporaryDirectory(prefix="bench-lifecycle-") as workdir:
        (simulated_year if args.part == "year" else p99_during_prune)(Path(workdir))


if __name__ == "__main__":
    main()
