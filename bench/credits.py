"""Benchmark, run by hand: what one credit spend costs where credits could live, from the caller's
side: the service's conditional UPDATE ... RETURNING (metering/credits.py) on SQLite and on
PostgreSQL, beside one Lua script call on Redis that does the same (decrement when positive), in
rounds whose order rotates. One process, one connection each, no gevent: the cost of the round
trip and of the write, which is what a request with credits adds. docs/scaling.md has the figures.

    python bench/credits.py [--spends 2000] [--rounds 5]

BENCH_POSTGRES_URL and BENCH_REDIS_URL pick the servers (a scratch database and Redis database:
the benchmark's table and key are made and dropped).
"""

import argparse
import datetime
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from peewee import PostgresqlDatabase, SqliteDatabase  # noqa: E402

from store.connections import SQLITE_PRAGMAS  # noqa: E402
from store.statements import Statements  # noqa: E402

POSTGRES_URL = os.environ.get("BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/14")
TABLE = ("CREATE TABLE api_keys (id INTEGER PRIMARY KEY, credits_remaining BIGINT, credits_granted BIGINT, "
         "credits_refill_amount BIGINT, credits_refill_interval VARCHAR(8), credits_refilled_for TIMESTAMP)")
SPEND = "if tonumber(redis.call('get', KEYS[1]) or '0') > 0 then return redis.call('decr', KEYS[1]) end return -1"


def database_spender(database):
    database.execute_sql("DROP TABLE IF EXISTS api_keys")
    database.execute_sql(TABLE)
    database.execute_sql("INSERT INTO api_keys (id, credits_remaining) VALUES (1, 1000000000)")
    statement = Statements(database).spend_credit
    day = datetime.datetime.now(datetime.UTC).replace(tzinfo=None, hour=0, minute=0, second=0, microsecond=0)
    params = [day.replace(day=1), day] * 4 + [1, day.replace(day=1), day]

    def spend():
        if isinstance(database, SqliteDatabase):
            with database.atomic("IMMEDIATE"):
                return database.execute_sql(statement, params).fetchone()
        return database.execute_sql(statement, params).fetchone()

    return spend


def redis_spender():
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    client.set("bench-credits", 1_000_000_000)
    script = client.register_script(SPEND)
    return lambda: script(keys=["bench-credits"])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spends", type=int, default=2000, help="per round")
    parser.add_argument("--rounds", type=int, default=5)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        sqlite = SqliteDatabase(f"{folder}/credits.db", pragmas=SQLITE_PRAGMAS)
        postgres = PostgresqlDatabase(POSTGRES_URL.rsplit("/", 1)[1], host="127.0.0.1", user="postgres")
        spenders = {"SQLite UPDATE ... RETURNING": database_spender(sqlite),
                    "PostgreSQL UPDATE ... RETURNING": database_spender(postgres),
                    "Redis Lua script": redis_spender()}
        results = {name: [] for name in spenders}
        names = list(spenders)
        for round_number in range(options.rounds):
            for name in names[round_number % len(names):] + names[:round_number % len(names)]:
                started = time.perf_counter()
                for _ in range(options.spends):
                    spenders[name]()
                results[name].append((time.perf_counter() - started) / options.spends * 1e6)
        postgres.execute_sql("DROP TABLE api_keys")
    print(f"\none credit spent, µs per spend: {options.rounds} rounds of {options.spends}, the order rotated\n")
    print("| where | median µs | each round |")
    print("|---|---|---|")
    for name, rounds in results.items():
        print(f"| {name} | {statistics.median(rounds):.0f} | {' / '.join(f'{value:.0f}' for value in rounds)} |")


if __name__ == "__main__":
    main()
