"""Benchmark, run by hand: GitHub's worst report for this service, 1,000 entries that are all active
keys of one organisation with 10 webhook endpoints and an owner whose address is confirmed (each
revocation its log line, ten messages and a mail, up to the notices' cap), answered by the real
view through the WSGI app, on SQLite and on PostgreSQL. The contract's promise is 10 s.

    python -m bench.leakreports [--database sqlite|postgresql] [--runs 3]

PostgreSQL is the local server (postgresql://postgres@127.0.0.1:5432), in a database made and
dropped for each run.
"""

import argparse
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

from bench import sharedstores

ROOT = Path(__file__).resolve().parent.parent

# Run in a process of its own: prints the seconds the report took.
MEASURE = """
import json, sys, time
sys.path[:0] = [sys.argv[2], sys.argv[2] + "/tests/support"]
from githubscanning import Signer, report, serving_keys
from accounts import users
from app import create_app
from models import User, utcnow
from orgs import keyactions
from webhooks import endpoints
signer = Signer("a" * 64)
with serving_keys(signer) as keys:
    app = create_app({"DATABASE_URL": sys.argv[1], "RATELIMIT_STORAGE_URL": "memory://", "SECRET_KEY": "bench",
                      "PUBLIC_RATE_LIMIT": "off", "MAIL_URL": "console", "PUBLIC_URL": "https://api.example.com",
                      "WEBHOOK_ALLOW_PRIVATE": True, "MAX_KEYS_PER_USER": 1000, "GITHUB_SECRET_SCANNING": True,
                      "GITHUB_SECRET_SCANNING_KEYS_URL": keys.url})
    with app.app_context():
        owner = users.create_user("owner", "owner@example.com", "correct horse battery")
        User.update(email_verified_at=utcnow()).execute()
        for n in range(10):
            endpoints.add_endpoint(owner, f"http://127.0.0.1:9/hook{n}")
        secrets = [keyactions.issue_key(owner, f"key {n}", "production")[1] for n in range(1000)]
    body = report(*secrets)
    client = app.test_client()
    started = time.perf_counter()
    answer = client.post("/api/v1/integrations/github/secret-scanning", data=body, headers=signer.headers(body))
    seconds = time.perf_counter() - started
    assert answer.status_code == 200 and all(entry["label"] == "true_positive" for entry in answer.get_json())
    print(seconds)
"""


def run_once(database):
    """Seconds of one report on a fresh database."""
    with tempfile.TemporaryDirectory() as folder:
        if database == "sqlite":
            url, drop = f"sqlite:///{folder}/bench.db", None
        else:
            name = f"bench_leaks_{uuid.uuid4().hex[:8]}"
            url, drop = sharedstores.fresh_database(name), name
        try:
            result = subprocess.run([sys.executable, "-c", MEASURE, url, str(ROOT)], cwd=ROOT, check=True,
                                    capture_output=True, text=True)
            return float(result.stdout.split()[-1])
        finally:
            if drop:
                sharedstores.drop_database(drop)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database", choices=["sqlite", "postgresql"], action="append")
    parser.add_argument("--runs", type=int, default=3)
    options = parser.parse_args()
    for database in options.database or ["sqlite", "postgresql"]:
        seconds = [run_once(database) for _ in range(options.runs)]
        print(f"{database}: 1,000 active keys revoked in {statistics.median(seconds):.2f} s (median of "
              f"{options.runs}: {', '.join(f'{value:.2f}' for value in seconds)})")


if __name__ == "__main__":
    main()
