"""The billing benchmark's stores (bench/billing.py): a PostgreSQL cluster and a redis-server of
its own, the organisations, customers and keys it sets up, and the usage rows and outbox it moves
and reads to check what the receiver accepted."""

import collections
import contextlib
import os
import subprocess
import sys

import psycopg

from bench import servers

sys.path.insert(0, str(servers.ROOT / "tests" / "support"))

from privateservers import PrivatePostgres, PrivateRedis

# Run in a process of its own against the bench's database: users, organisations (an owner makes
# at most 20), each with its billing customer and keys, every other one with credits; prints the
# keys' secrets.
SETUP = """
import sys
from accounts import users
from app import app
from billing import customers
from orgs import keyactions, members
orgs, keys, customer = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
with app.app_context():
    owners = [users.create_user(f"owner{n}", f"owner{n}@example.com", "a long bench password")
              for n in range(orgs // 20 + 1)]
    made = [(owners[0], users.personal_organisation_id(owners[0]))]
    made += [(owners[n // 20], members.create(f"Bench {n}", owners[n // 20]).id) for n in range(1, orgs)]
    for n, (owner, org_id) in enumerate(made):
        customers.set_customer(org_id, customer.format(n))
        for index in range(keys):
            credits = 10**9 if index % 2 else None
            print(keyactions.issue_key(owner, f"key {index}", "production", credits_given=credits, org=org_id)[1])
"""

# A round's usage rows moved back, as if served hours earlier: each key by its own amount, added
# to a row already there (none is, by construction, but a move never drops a count).
SHIFT = """
WITH moved AS (DELETE FROM usage_hours WHERE hour >= %(since)s
               RETURNING api_key_id, hour, endpoint, status, requests, credits)
INSERT INTO usage_hours (api_key_id, hour, endpoint, status, requests, credits)
SELECT api_key_id, hour - (%(back)s + api_key_id %% %(spread)s) * interval '1 hour', endpoint, status, requests,
       credits FROM moved
ON CONFLICT (api_key_id, hour, endpoint, status) DO UPDATE
SET requests = usage_hours.requests + excluded.requests, credits = usage_hours.credits + excluded.credits
"""
# The usage of the hours every customer's events cover, per key and hour, as the export reads it.
CLOSED_USAGE = """
SELECT p.customer, u.api_key_id, u.hour, sum(CASE WHEN u.status BETWEEN 200 AND 299 THEN u.requests ELSE 0 END),
       sum(u.credits)
FROM usage_hours u JOIN api_keys k ON k.id = u.api_key_id JOIN billing_customers c ON c.org_id = k.org_id
JOIN billing_periods p ON p.org_id = k.org_id AND u.hour >= p.starts AND (p.ends IS NULL OR u.hour < p.ends)
WHERE u.hour < c.closed_through GROUP BY p.customer, u.api_key_id, u.hour
"""
# Every organisation's export moved back to start at an hour: its position and its customer's period.
EXPORTED_FROM = ["UPDATE billing_customers SET since = %(h)s, closed_through = %(h)s",
                 "UPDATE billing_periods SET starts = %(h)s"]
ROWS = """
INSERT INTO usage_hours (api_key_id, hour, endpoint, status, requests, credits)
SELECT k.id, h, 'protected_test', 200, 1 + (k.id * 7 + extract(hour FROM h)::int) %% 97,
       1 + (k.id * 3 + extract(hour FROM h)::int) %% 89
FROM api_keys k CROSS JOIN generate_series(%(first)s::timestamp, %(last)s::timestamp, interval '1 hour') AS h
"""


@contextlib.contextmanager
def all_cores():
    """Children started meanwhile (PostgreSQL, Redis) may run on either core, not only the client's."""
    pinned = os.sched_getaffinity(0)
    os.sched_setaffinity(0, range(os.cpu_count()))
    try:
        yield
    finally:
        os.sched_setaffinity(0, pinned)


@contextlib.contextmanager
def stores():
    with all_cores():
        postgres = PrivatePostgres()
        try:
            redis = PrivateRedis()
        except BaseException:
            postgres.close()
            raise
    try:
        yield postgres, redis
    finally:
        redis.close()
        postgres.close()


def setup(env, orgs, keys, target):
    customer = "cus_Bench{}" if target == "stripe" else "bench-customer-{}"
    made = subprocess.run([sys.executable, "-c", SETUP, str(orgs), str(keys), customer], cwd=servers.ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr
    return made.stdout.split()


def query(url, sql, params=None):
    with psycopg.connect(url, autocommit=True) as connection:
        return connection.execute(sql, params).fetchall()


def execute(url, *statements):
    """The (sql, params) statements in one transaction."""
    with psycopg.connect(url) as connection:
        for sql, params in statements:
            connection.execute(sql, params)


def exported_from(hour):
    """The statements that move every export back to `hour`, and free the closing's lock."""
    return [(sql, {"h": hour}) for sql in EXPORTED_FROM] + [("DELETE FROM maintenance_locks WHERE name = 'billing'",
                                                             None)]


def database_hour(url):
    """The start of the database clock's hour (UTC, naive as the service stores it)."""
    return query(url, "SELECT date_trunc('hour', now() AT TIME ZONE 'UTC')")[0][0]


def outbox_states(url):
    return dict(query(url, "SELECT state, count(*) FROM billing_events GROUP BY state"))


def closed_usage(url, target):
    """{(customer, key id or None for Stripe, meter, hour): value} of the hours closed for each
    customer, as the target's events should add up."""
    expected = collections.Counter()
    for customer, key_id, hour, requests, credits in query(url, CLOSED_USAGE):
        for meter, value in (("api_requests", requests), ("api_credits", credits)):
            if value:
                expected[customer, None if target == "stripe" else key_id, meter, hour] += value
    return dict(expected)


def arrived(accepted, target):
    totals = collections.Counter()
    for event in accepted:
        key_id = None if target == "stripe" else int(event["key_id"])
        totals[event["customer"], key_id, event["meter"], event["time"].replace(tzinfo=None)] += event["value"]
    return dict(totals)
