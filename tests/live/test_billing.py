"""The billing export's promise, in a short version of the benchmark's proof: two instances of two
workers on one PostgreSQL and one Redis of the test's own serve a keyed load; the receiver (an
OpenMeter held to its description, tests/support/billingvendors.py) fails, refuses, drops and
times out for a while, and one instance is killed in the middle of its sends. For each key, meter
and hour, what the receiver accepted equals the usage rows, and no identifier is accepted twice."""

import collections
import datetime
import os
import signal
import time

import psycopg
import pytest
from billingreceiver import VendorReceiver
from keyload import Load, make_keys
from liveserver import cli, service_env, start_instances, wait_for
from privateservers import PrivatePostgres, PrivateRedis

KEYS = 80
# Every hour of the load is moved this far back, as if it had been served then: the next close of a
# freshly started instance sends it (an hour closes 2 minutes after its end).
HOURS_BACK = 3

SHIFT = """
UPDATE usage_hours SET hour = hour - interval '{hours} hours';
UPDATE billing_customers SET since = since - interval '{hours} hours',
                             closed_through = closed_through - interval '{hours} hours';
UPDATE billing_periods SET starts = starts - interval '{hours} hours';
DELETE FROM maintenance_locks WHERE name = 'billing';
"""
USAGE = """
SELECT api_key_id, hour, sum(CASE WHEN status BETWEEN 200 AND 299 THEN requests ELSE 0 END), sum(credits)
FROM usage_hours WHERE hour < %s GROUP BY api_key_id, hour
"""


def usage_rows(url, before):
    """{(key id, meter, hour): value} of the usage rows before `before`, as the export names them."""
    rows = {}
    with psycopg.connect(url) as connection:
        for key_id, hour, requests, credits in connection.execute(USAGE, (before,)).fetchall():
            for meter, value in (("api_requests", requests), ("api_credits", credits)):
                if value:
                    rows[key_id, meter, hour] = value
    return rows


def outbox_states(url):
    with psycopg.connect(url) as connection:
        return dict(connection.execute("SELECT state, count(*) FROM billing_events GROUP BY state").fetchall())


def stored_requests(url):
    with psycopg.connect(url) as connection:
        return connection.execute("SELECT coalesce(sum(total_requests), 0) FROM api_keys").fetchone()[0]


@pytest.mark.timeout(300)
def test_each_hour_reaches_the_billing_system_once_through_failures_and_a_killed_instance(tmp_path):
    postgres, redis = PrivatePostgres(), PrivateRedis()
    servers, load = [], None
    try:
        with VendorReceiver("openmeter") as receiver:
            env = service_env(tmp_path, DATABASE_URL=postgres.url, RATELIMIT_STORAGE_URL=redis.url,
                              WEB_CONCURRENCY="2", RATE_LIMIT_TIERS="free=1000000/hour", MAX_KEYS_PER_USER="100",
                              BILLING_EXPORT="openmeter", BILLING_URL=receiver.url,
                              BILLING_API_KEY="test-billing-token", BILLING_RETRY_SCHEDULE="1s,1s,2s,2s,3s,3s,5s,5s")
            keys = make_keys(env, KEYS, credits=10**9)
            cli(env, "orgs", "billing", "carol", "--customer", "subject-carol")
            servers = start_instances(tmp_path, env)
            load = Load(servers, keys)
            time.sleep(6)
            calls = load.stop()
            served = sum(call.outcome == 200 for call in calls)
            wait_for(lambda: stored_requests(postgres.url) == served, seconds=10)
            for server in servers:
                server.stop()

            with psycopg.connect(postgres.url) as connection:
                connection.execute(SHIFT.format(hours=HOURS_BACK))
            now = datetime.datetime.now(datetime.UTC).replace(tzinfo=None)
            closed_before = now.replace(minute=0, second=0, microsecond=0) - datetime.timedelta(hours=HOURS_BACK - 1)
            expected = usage_rows(postgres.url, closed_before)
            assert sum(value for (_, meter, _), value in expected.items() if meter == "api_requests") == served

            # The receiver's first answers: two held past the sender's 10 s, a 429, two closed
            # connections, three 500s, a refusal; and meanwhile the load goes on.
            receiver.fail(2, ("slow", 12))
            receiver.fail(1, ("429", 1))
            receiver.fail(2, "close")
            receiver.fail(3, 500)
            receiver.fail(1, 400)
            servers = start_instances(tmp_path, env)
            load = Load(servers, keys, threads=2)
            wait_for(lambda: sum(outbox_states(postgres.url).values()) > 0, seconds=30)
            time.sleep(2)
            os.killpg(servers[0].process.pid, signal.SIGKILL)
            servers[0].process.wait()
            wait_for(lambda: set(outbox_states(postgres.url)) == {"sent"}, seconds=120)
            load.stop()
            accepted = list(receiver.accepted)
            states = outbox_states(postgres.url)
    finally:
        if load is not None:
            load.stop()
        for server in servers:
            server.stop()
        postgres.close()
        redis.close()

    assert receiver.invalid == []
    ids = [event["id"] for event in accepted]
    assert len(ids) == len(set(ids))
    arrived = collections.Counter()
    for event in accepted:
        arrived[int(event["key_id"]), event["meter"], event["time"].replace(tzinfo=None)] += event["value"]
    assert dict(arrived) == expected
    assert states == {"sent": len(expected)}
    print(f"\n{served} requests served, {len(expected)} events accepted once each; "
          f"{len(receiver.duplicates)} sent again and dropped as duplicates, {len(receiver.requests)} calls")
