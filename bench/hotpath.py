"""Benchmark, run by hand: the CPU time of one `GET /api/v1/protected/test` through the whole app
(Flask's test client, one process, SQLite, limits in memory), this checkout against another, in
alternating rounds. CPU time rather than wall time, so that other work on a shared machine counts
for less; the test client's own cost is in both.

With --instructions, valgrind's callgrind counts the CPU instructions of one request through the
WSGI app (no server, no test client), for this checkout, the other and bench/bare.py's route, each
with one hash seed (with a random one, a count moved by up to ~5 % between runs of the same code;
with one seed, the bare route's repeats and the service's, whose usage flusher runs beside it,
moves by up to ~0.7 %). The machine's load counts only through that flusher, which runs once a
second of wall time and makes the next request read the key generation again: with the test
suite running beside it, a count was 0.9-1.4 % higher. Count on a quiet machine.

With --served, callgrind counts the instructions of the gunicorn worker itself (gevent, parsing,
the app, the access line, writing; the kernel's work is not counted) per request from one
keep-alive client, for the same three, each parsing with gunicorn's Python parser (valgrind
cannot run the C parser's SSE 4.2 code). Under callgrind the worker runs ~50 times slower, so its
once-a-second work (usage flush, metrics fold) weighs ~50 times more per request than at full
speed: on the service's side the count is a little high.

    python bench/hotpath.py --against ../before [--rounds 6] [--requests 5000]
    python bench/hotpath.py --against ../before --instructions [--requests 200]   # apt-get install valgrind
    python bench/hotpath.py --against ../before --served [--requests 500]

With --imported (and --instructions), this checkout alone: a key imported by its SHA-256 hash
(docs/importing-keys.md) against one made here, each counted as above. With --keyed-paths, each
keyed GET of this checkout (protected/test, user/me, usage/stats, usage/history) with one key.

    python bench/hotpath.py --imported --instructions [--requests 200]
    python bench/hotpath.py --keyed-paths --instructions [--requests 200]
"""

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTECTED = "/api/v1/protected/test"
KEYED_PATHS = (PROTECTED, "/api/v1/user/me", "/api/v1/usage/stats", "/api/v1/usage/history")

# Run inside the checkout being measured: prints the CPU microseconds per request.
MEASURE = """
import os, sys, time
sys.path.insert(0, os.getcwd())
os.environ.update(DATABASE_URL="sqlite:///" + sys.argv[1], SECRET_KEY="bench", RATE_LIMIT_TIERS="free=1000000000/hour")
try:
    from orgs import keyactions
except ImportError:  # a checkout from before orgs/keyactions.py
    import auth as keyactions
from app import create_app
try:
    from accounts import users
except ImportError:  # a checkout from before the accounts/ room
    from web import accounts as users
app = create_app()
try:
    from ops import services
    services.start(app)  # the usage flusher runs while measured, as in a served process
except ImportError:
    pass  # a checkout from before ops/services.py: its first request starts the flusher
with app.app_context():
    user = users.create_user("bench", "bench@example.com", "bench password")
    _, secret = keyactions.issue_key(user, "bench", "development")
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


# Run under callgrind inside the checkout being measured (argv: database, requests, the bare app's
# folder or ""): 300 unmeasured requests, then the measured ones (count_instructions takes the
# difference of two runs' main threads).
COUNT_INSTRUCTIONS = """
import itertools, os, sys
sys.path.insert(0, os.getcwd())
os.environ.update(DATABASE_URL="sqlite:///" + sys.argv[1], SECRET_KEY="bench", RATE_LIMIT_TIERS="free=1000000000/hour")
from werkzeug.test import EnvironBuilder
if sys.argv[3]:
    sys.path.insert(0, sys.argv[3])
    from bare import app
    environ = EnvironBuilder(path="/bare").get_environ()
else:
    try:
        from orgs import keyactions
    except ImportError:  # a checkout from before orgs/keyactions.py
        import auth as keyactions
    from metering import lifecycle
    try:
        from accounts import users
    except ImportError:  # a checkout from before the accounts/ room
        from web import accounts as users
    lifecycle.FIRST_TRY_SECONDS = (1e9, 1e9)  # no prune in the middle of the count
    from app import create_app
    app = create_app()
    try:
        from ops import services
        services.start(app)  # the usage flusher runs while measured, as in a served process
    except ImportError:
        pass  # a checkout from before ops/services.py: its first request starts the flusher
    with app.app_context():
        user = users.create_user("bench", "bench@example.com", "bench password")
        if os.environ.get("BENCH_IMPORTED_KEY"):
            import hashlib, json
            from orgs import keyimports
            secret = "acme_live_" + "Bq7x" * 8
            line = {"hash": hashlib.sha256(secret.encode()).hexdigest(), "hash_scheme": "sha256-hex",
                    "prefix": "acme_live_", "name": "bench", "type": "development"}
            [imported] = keyimports.import_keys(users.personal_organisation_id(user), json.dumps(line).encode())
            assert imported.refused is None, imported.refused
        else:
            _, secret = keyactions.issue_key(user, "bench", "development")
    environ = EnvironBuilder(path=os.environ["BENCH_PATH"], headers={"X-API-Key": secret}).get_environ()

def request(_):
    answer = []
    body = app(dict(environ), lambda status, headers, exc_info=None: answer.append(status))
    b"".join(body)
    getattr(body, "close", lambda: None)()
    return answer == ["200 OK"]

assert all(request(None) for _ in range(300))
assert len(list(itertools.takewhile(request, range(int(sys.argv[2]))))) == int(sys.argv[2])
"""


def count_instructions(checkout, requests, bare=False, imported=False, path=PROTECTED):
    """Instructions per request of a keyed GET (protected/test) in checkout, or of bench/bare.py's route: the main
    thread's count for 3n requests less its count for n, over 2n, so that start-up and the usage
    flusher's thread (valgrind's --separate-threads) are left out and no symbol names are needed."""
    totals = []
    for measured in (requests, 3 * requests):
        with tempfile.TemporaryDirectory(prefix="bench-hotpath-") as workdir:
            out = f"{workdir}/callgrind.out"
            subprocess.run(["valgrind", "--tool=callgrind", "--separate-threads=yes", f"--callgrind-out-file={out}",
                            sys.executable, "-c", COUNT_INSTRUCTIONS, f"{workdir}/bench.db", str(measured),
                            str(ROOT / "bench") if bare else ""], cwd=checkout, capture_output=True, check=True,
                           env={**os.environ, "BENCH_IMPORTED_KEY": "1" if imported else "", "BENCH_PATH": path,
                                # One hash seed for every count: with a random one, the same code's
                                # count moved by up to ~5 % between runs; with this one, by ~0.7 %.
                                "PYTHONHASHSEED": "0"})
            main_thread = Path(f"{out}-01").read_text().splitlines()
            totals.append(int(next(line for line in main_thread
                                   if line.startswith(("summary:", "totals:"))).split()[1]))
    return (totals[1] - totals[0]) / (2 * requests)


# Run inside the checkout being measured (argv: database): a user and a key; prints the secret.
SEED = """
import os, sys
sys.path.insert(0, os.getcwd())
os.environ.update(DATABASE_URL="sqlite:///" + sys.argv[1], SECRET_KEY="bench")
try:
    from orgs import keyactions
except ImportError:  # a checkout from before orgs/keyactions.py
    import auth as keyactions
from app import create_app
try:
    from accounts import users
except ImportError:  # a checkout from before the accounts/ room
    from web import accounts as users
app = create_app()
with app.app_context():
    user = users.create_user("bench", "bench@example.com", "bench password")
    print(keyactions.issue_key(user, "bench", "development")[1])
app.extensions["usage"].close()
"""


def count_served(checkout, requests, bare=False):
    """Instructions of the gunicorn worker per protected/test of checkout, or per bench/bare.py's route."""
    with tempfile.TemporaryDirectory(prefix="bench-served-") as workdir:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        env = dict(os.environ, DATABASE_URL=f"sqlite:///{workdir}/bench.db", SECRET_KEY="bench",
                   RATE_LIMIT_TIERS="free=1000000000/hour", PORT=str(port), WEB_CONCURRENCY="1")
        if bare:
            app, config, path, headers = "bench.bare:app", ROOT / "bench" / "bare.conf.py", "/bare", {}
        else:
            secret = subprocess.run([sys.executable, "-c", SEED, f"{workdir}/bench.db"], cwd=checkout, env=env,
                                    capture_output=True, text=True, check=True).stdout.split()[-1]
            app, config, path, headers = "app:app", checkout / "gunicorn.conf.py", "/api/v1/protected/test", {
                "X-API-Key": secret}
        chdir = ROOT if bare else checkout
        server = subprocess.Popen(["valgrind", "--tool=callgrind", "--trace-children=yes",
                                   f"--callgrind-out-file={workdir}/callgrind.%p", sys.executable, "-m", "gunicorn",
                                   "-c", str(config), "--chdir", str(chdir), "--access-logfile", "/dev/null",
                                   # A worker ~50 times slower misses gunicorn's 30 s heartbeat on a
                                   # busy machine, and would be killed and booted again without end.
                                   "--timeout", "0",
                                   # valgrind (3.19) cannot run picohttpparser's SSE 4.2 PCMPESTRI: a
                                   # worker on gunicorn's C parser dies of SIGILL at its first request,
                                   # again and again. Both sides parse in Python here.
                                   "--http-parser", "python", app],
                                  cwd=chdir, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            connection = connect(port, server)
            worker = subprocess.check_output(["pgrep", "-P", str(server.pid)]).split()[0].decode()

            def serve(count):
                for _ in range(count):
                    connection.request("GET", path, headers=headers)
                    response = connection.getresponse()
                    response.read()
                    assert response.status == 200, response.status

            serve(300)
            subprocess.run(["callgrind_control", "--zero", worker], capture_output=True, check=True)
            serve(requests)
            subprocess.run(["callgrind_control", "--dump", worker], capture_output=True, check=True)
            dump = max(Path(workdir).glob(f"callgrind.{worker}.*"))
            total = next(line for line in dump.read_text().splitlines() if line.startswith(("summary:", "totals:")))
        finally:
            server.terminate()
            server.wait()
    return int(total.split()[1]) / requests


def connect(port, server):
    for _ in range(600):
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            connection.request("GET", "/")
            connection.getresponse().read()
            return connection
        except OSError:
            assert server.poll() is None, "the server under callgrind did not start"
            time.sleep(0.2)
    raise TimeoutError("the server under callgrind did not answer in 2 minutes")


def instructions(checkouts, requests, served=False):
    count = count_served if served else count_instructions
    counts = {"bare": count(ROOT, requests, bare=True)}
    counts |= {name: count(path, requests) for name, path in checkouts.items()}
    where = "the gunicorn worker, served" if served else "the WSGI app"
    print(f"Instructions per request through {where} (callgrind, {requests} requests after 300 unmeasured)")
    print("| | instructions | ÷ bare |")
    print("|---|---|---|")
    print(f"| bench/bare.py `GET /bare` | {counts['bare']:,.0f} | 1.00 |")
    for name, path in checkouts.items():
        print(f"| protected/test, {path.name} ({name}) | {counts[name]:,.0f} | {counts[name] / counts['bare']:.2f} |")
    print(f"this ÷ other: {counts['this'] / counts['other']:.3f}")
    print(json.dumps(counts))


def imported_against_native(requests):
    native = count_instructions(ROOT, requests)
    imported = count_instructions(ROOT, requests, imported=True)
    print(f"Instructions per request through the WSGI app (callgrind, {requests} requests after 300 unmeasured)")
    print("| key | instructions |")
    print("|---|---|")
    print(f"| made here (`sk_test_...`) | {native:,.0f} |")
    print(f"| imported by its SHA-256 hash (`acme_live_...`) | {imported:,.0f} |")
    print(f"imported ÷ native: {imported / native:.4f}")
    print(json.dumps({"native": native, "imported": imported}))


def keyed_paths(requests):
    """Each keyed GET of this checkout, counted as protected/test is, beside the bare route."""
    counts = {"bare": count_instructions(ROOT, requests, bare=True)}
    counts |= {path: count_instructions(ROOT, requests, path=path) for path in KEYED_PATHS}
    print(f"Instructions per request through the WSGI app (callgrind, {requests} requests after 300 unmeasured)")
    print("| | instructions | ÷ bare | ÷ protected/test |")
    print("|---|---|---|---|")
    for name, count in counts.items():
        print(f"| `{name}` | {count:,.0f} | {count / counts['bare']:.2f} | {count / counts[PROTECTED]:.2f} |")
    print(json.dumps(counts))


def measure(checkout, requests):
    with tempfile.TemporaryDirectory(prefix="bench-hotpath-") as workdir:
        output = subprocess.run(["taskset", "-c", "1", sys.executable, "-c", MEASURE, f"{workdir}/bench.db",
                                 str(requests)], cwd=checkout, capture_output=True, text=True, check=True).stdout
    return float(output.split()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--against", type=Path, metavar="DIR")
    parser.add_argument("--imported", action="store_true",
                        help="with --instructions: an imported key against a native one")
    parser.add_argument("--keyed-paths", action="store_true",
                        help="with --instructions: each keyed GET of this checkout, beside the bare route")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--requests", type=int, help="per round (default 5000), or counted (default 200; served 500)")
    parser.add_argument("--instructions", action="store_true", help="count instructions under callgrind instead")
    parser.add_argument("--served", action="store_true", help="count the served worker's instructions instead")
    args = parser.parse_args()
    if args.imported:
        return imported_against_native(args.requests or 200)
    if args.keyed_paths:
        return keyed_paths(args.requests or 200)
    if args.against is None:
        parser.error("--against DIR is required, unless --imported or --keyed-paths")
    checkouts = {"this": ROOT, "other": args.against.resolve()}
    if args.instructions or args.served:
        return instructions(checkouts, args.requests or (500 if args.served else 200), args.served)
    args.requests = args.requests or 5000
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
