"""Benchmark of the dashboard's heaviest pages, run by hand. Prints a markdown table.

    python -m bench.dashboard                 # on a fresh SQLite file
    DATABASE_URL=postgresql://... python -m bench.dashboard   # on an empty PostgreSQL database

An organisation with KEYS keys (30 days of hourly and daily usage rows on the key shown) and one
webhook endpoint with MESSAGES messages, each with an attempt: each page is asked ROUNDS times
through the app (a logged-in test client, no network), and the median and the slowest are printed.
The target (docs/performance.md): the key's page with its charts and the message log within 300 ms.
"""

import datetime
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

if not __package__:
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench import servers

KEYS = 1000
MESSAGES = 10_000
ROUNDS = 20
PASSWORD = "a long bench password"


def build(app):
    """The organisation, its keys, usage and messages, written in bulk; return (key id, endpoint id,
    the oldest message's id, a message's webhook-id)."""
    import models
    from accounts import users
    from keys import keyformat
    from webhooks import signing
    from webhooks.models import WebhookAttempt, WebhookEndpoint, WebhookMessage

    user = users.create_user("dash", "dash@example.com", PASSWORD)
    org_id = users.personal_organisation_id(user)
    now = models.utcnow()
    with models.db.atomic():
        models.ApiKey.insert_many([
            {"org": org_id, "user": user.id, "name": f"key {number}", "key_type": "production",
             "display_prefix": f"sk_live_{number:04d}", "key_hash": keyformat.hash_key(f"bench-{number}"),
             "created_at": now} for number in range(KEYS)]).execute()
        key_id = models.ApiKey.select(models.ApiKey.id).order_by(models.ApiKey.id).first().id
        this_hour = now.replace(minute=0, second=0, microsecond=0)
        hours = [this_hour - datetime.timedelta(hours=hour) for hour in range(24 * 30)]
        database = models.db.obj
        mark = database.param
        for table, column, moments in (("usage_hours", "hour", hours),
                                       ("usage_days", "day", sorted({hour.replace(hour=0) for hour in hours}))):
            database.execute_sql(
                f"INSERT INTO {table} (api_key_id, {column}, endpoint, status, requests) VALUES "
                + ", ".join([f"({mark}, {mark}, {mark}, {mark}, {mark})"] * len(moments)),
                [value for moment in moments for value in (key_id, moment, "/api/v1/protected/test", 200, 7)])
        endpoint = WebhookEndpoint.create(org=org_id, url="https://hooks.example.com/dash", events="*",
                                          sealed_secret=signing.seal(signing.new_secret()))
        for start in range(0, MESSAGES, 1000):
            WebhookMessage.insert_many([
                {"endpoint": endpoint.id, "message_id": f"msg_bench{number:019d}", "event": "key.created",
                 "body": '{"type":"key.created","timestamp":"2026-11-27T00:00:00.000Z","data":{}}',
                 "created_at": now - datetime.timedelta(seconds=MESSAGES - number), "state": "delivered",
                 "attempts": 1} for number in range(start, start + 1000)]).execute()
        WebhookAttempt.insert_many([
            {"endpoint": endpoint.id, "message_id": f"msg_bench{number:019d}", "attempted_at": now,
             "event": "key.created", "number": 1, "status": 204, "duration_ms": 12, "answer": "ok"}
            for number in range(MESSAGES - 50, MESSAGES)
        ]).execute()
        oldest = WebhookMessage.select(WebhookMessage.id).order_by(WebhookMessage.id).first().id
    return key_id, endpoint.id, oldest, f"msg_bench{MESSAGES - 1:019d}"


def timed(client, path):
    """(median ms, slowest ms) of ROUNDS GETs of path, each answered 200."""
    spent = []
    for _ in range(ROUNDS):
        started = time.perf_counter()
        response = client.get(path)
        spent.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, (path, response.status_code)
    return statistics.median(spent), max(spent)


def main():
    workdir = tempfile.mkdtemp(prefix="bench-dashboard-")
    env = servers.service_env(workdir)
    if os.environ.get("DATABASE_URL", "").startswith("postgresql"):
        env["DATABASE_URL"] = os.environ["DATABASE_URL"]
    os.environ.update(env)
    from app import create_app

    # The pages as a browser gets them, but for the CSRF token a test client does not carry.
    app = create_app({"WTF_CSRF_ENABLED": False})
    with app.app_context():
        key_id, endpoint_id, oldest, message_id = build(app)
    client = app.test_client()
    assert client.post("/login", data={"username": "dash", "password": PASSWORD}).status_code == 302
    pages = [
        ("a key's page, 30 days of usage", f"/settings/security/keys/{key_id}"),
        (f"the Security tab, the first page of {KEYS} keys", "/settings/security"),
        ("the Webhooks tab", "/settings/webhooks"),
        (f"the message log, newest 20 of {MESSAGES}", f"/settings/webhooks/{endpoint_id}/messages"),
        ("the message log, its oldest page", f"/settings/webhooks/{endpoint_id}/messages?before={oldest + 21}"),
        ("the message log, failed only (none)", f"/settings/webhooks/{endpoint_id}/messages?state=failed"),
        ("a message with its attempt", f"/settings/webhooks/{endpoint_id}/messages/{message_id}"),
    ]
    database = "PostgreSQL" if env["DATABASE_URL"].startswith("postgresql") else "SQLite"
    print(f"\nThe dashboard on {database}: {KEYS} keys, {MESSAGES} messages; {ROUNDS} GETs each, in process\n")
    print("| page | median ms | slowest ms |")
    print("|---|---|---|")
    for name, path in pages:
        median, slowest = timed(client, path)
        print(f"| {name} | {median:.1f} | {slowest:.1f} |")


if __name__ == "__main__":
    main()
