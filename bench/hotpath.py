"""Benchmark, run by hand: the CPU time of one `GET /api/v1/protected/test` through the whole app
(Flask's test client, one process, SQLite, limits in memory), this checkout against another, in
alternating rounds. CPU time rather than wall time, so that other work on a shared machine counts
for less; the test client's own cost is in both.

    python bench/hotpath.py --against ../before [--rounds 6] [--requests 5000]
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Run inside the checkout being measured: prints the CPU microseconds per request.
MEASURE = """
import os, sys, time
sys.path.insert(0, os.getcwd())
os.environ.update(DATABASE_URL="sqlite:///" + sys.argv[1], SECRET_KEY="bench", RATE_LIMIT_TIERS="free=1000000000/hour")
import accounts, auth
from app import create_app
app = create_app()
with app.app_context():
    user = accounts.create_user("bench", "bench@example.com", "bench password")
    _, secret = auth.issue_key(user, "bench", "development")
client = app.test_client()
headers = {"X-API-Key": secret}
for _ in range(500):
    client.get("/api/v1/protected/test", headers=headers)
count = int(sys.argv[2])
started = time.process_time()
for _ in range(count):
    assert client.get("/api/v1/protected/test", headers=headers).status_code == 200
print((time.process_time() - started) / count * 1e6)
app.extensions["usage"].close()
"""


def measure(checkout, requests):
    with tempfile.TemporaryDirectory(prefix="bench-hotpath-") as workdir:
        output = subprocess.run(["taskset", "-c", "1", sys.executable, "-c", MEASURE, f"{workdir}/bench.db",
                                 str(requests)], cwd=checkout, capture_output=True, text=True, check=True).stdout
    return float(output.split()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--against", type=Path, required=True, metavar="DIR")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--requests", type=int, default=5000)
    args = parser.parse_args()
    checkouts = {"this": ROOT, "other": args.against.resolve()}
    results = {name: [] for name in checkouts}
    for round_ in range(args.rounds):
        order = list(checkouts) if round_ % 2 == 0 else list(reversed(checkouts))
        for name in order:
            results[name].append(measure(checkouts[name], args.requests))
    ratios = [this / other for this, other in zip(results["this"], results["other"])]
    print(f"CPU us per protected/test, {args.rounds} rounds of {args.requests} requests, order alternating")
    print("| checkout | median us | each round |")
    print("|---|---|---|")
    for name, path in checkouts.items():
        runs = " / ".join(f"{value:.0f}" for value in results[name])
        print(f"| {path.name} ({name}) | {statistics.median(results[name]):.0f} | {runs} |")
    print(f"this ÷ other, each round: {', '.join(f'{ratio:.3f}' for ratio in ratios)}; "
          f"median {statistics.median(ratios):.3f}")
    print(json.dumps({"this": results["this"], "other": results["other"], "ratios": ratios}))


if __name__ == "__main__":
    main()
