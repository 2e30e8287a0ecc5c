"""Benchmark, run by hand: how often a keyed request reads its key from the database when it names
one of 10,000 keys at random, with the usage flush running as in a served worker (SQLite, limits in
memory, in one process through the WSGI app), and the CPU each request costs. For this checkout, and
another beside it.

    python bench/keyreads.py [--against ../before] [--seconds 15]
"""

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Run inside the checkout being measured: prints requests, key reads and CPU microseconds a request.
MEASURE = """
import os, random, sys, time
sys.path.insert(0, os.getcwd())
os.environ.update(DATABASE_URL="sqlite:///" + sys.argv[1], SECRET_KEY="bench", RATE_LIMIT_TIERS="free=1000000000/hour")
import models
try:
    from orgs import keyactions
except ImportError:  # a checkout from before orgs/keyactions.py
    import auth as keyactions
from app import create_app
from keys import keycache
from ops import services
from werkzeug.test import EnvironBuilder
app = create_app()
with app.app_context():
    secrets = []
    for account in range(500):  # 20 keys an account, the most one may hold
        user = models.User.create(username=f"bench{account}", email=f"bench{account}@example.com", password_hash="-")
        if hasattr(models, "create_personal_organisation"):  # a key belongs to an organisation
            models.create_personal_organisation(user)
        secrets += [keyactions.issue_key(user, f"key {number}", "development")[1] for number in range(20)]
services.start(app)
environs = {secret: EnvironBuilder(path="/api/v1/protected/test", headers={"X-API-Key": secret}).get_environ()
            for secret in secrets}
reads = 0
find = keycache.find_active_key
def counting_find(key_hash):
    global reads
    reads += 1
    return find(key_hash)
keycache.find_active_key = counting_find
def request(secret):
    answer = []
    b"".join(app(dict(environs[secret]), lambda status, headers, exc_info=None: answer.append(status)))
    assert answer[0].startswith("200"), answer
for secret in secrets:
    request(secret)
reads, count, ends, started = 0, 0, time.time() + float(sys.argv[2]), time.process_time()
while time.time() < ends:
    request(random.choice(secrets))
    count += 1
print(count, reads, (time.process_time() - started) / count * 1e6)
services.stop(app)
"""


def measure(checkout, seconds):
    with tempfile.TemporaryDirectory(prefix="bench-keyreads-") as workdir:
        output = subprocess.run([sys.executable, "-c", MEASURE, f"{workdir}/bench.db", str(seconds)], cwd=checkout,
                                capture_output=True, text=True, check=True).stdout
    count, reads, cpu = output.split()[-3:]
    return int(count), int(reads), float(cpu)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--against", type=Path, metavar="DIR")
    # Longer than the key cache's MAX_AGE, so that a key read again for its age counts too.
    parser.add_argument("--seconds", type=float, default=15.0)
    args = parser.parse_args()
    checkouts = {"this": ROOT} | ({"other": args.against.resolve()} if args.against else {})
    print(f"protected/test with one of 10,000 keys at random, {args.seconds:g} s, usage flush running")
    print("| checkout | requests | key reads | share | CPU µs a request |")
    print("|---|---|---|---|---|")
    for name, path in checkouts.items():
        count, reads, cpu = measure(path, args.seconds)
        print(f"| {path.name} ({name}) | {count:,} | {reads:,} | {reads / count:.1%} | {cpu:.0f} |")


if __name__ == "__main__":
    main()
