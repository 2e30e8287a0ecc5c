"""Benchmark of `keys import`, run by hand: a file of LINES keys, a quarter of each hash scheme,
imported by the command line into an organisation on a fresh SQLite file and on a fresh PostgreSQL
database (the local server, 127.0.0.1:5432), RUNS times each; the wall time of the whole command
(its start included) is printed per run. The target (docs/performance.md): 10,000 lines within
30 s on each database. Then a probe of the refusals a stranger can time: a wrong secret with a
lookup prefix over its 10 failed checks a minute against one with no known start, PROBES of each
through the served API, alternating, their medians printed.

    python -m bench.keyimports [--lines 10000] [--runs 3] [--probes 400]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if not __package__:
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench import servers
from bench.sharedstores import drop_database, fresh_database

ROOT = Path(__file__).resolve().parent.parent
PASSWORD = "a long bench password"
POSTGRES_DATABASE = "bench_keyimports"


def write_file(path, lines):
    """The import file: sha256-hex, sha256-base64, bcrypt (cost 4) and argon2id (the least memory) in turn."""
    sys.path.insert(0, str(ROOT / "tests" / "support"))
    from importfiles import argon2id_line, bcrypt_line, made_secret, sha256_base64, sha256_hex

    makers = [(sha256_hex, "acme_live_"), (sha256_base64, "acme_live_"), (bcrypt_line, "rails_tok_"),
              (argon2id_line, "argon_tok_")]
    with path.open("w") as file:
        for number in range(lines):
            make, start = makers[number % 4]
            file.write(json.dumps(make(made_secret(start), name=f"customer {number}", external_id=f"cus_{number}"))
                       + "\n")


def flask(env, *args, stdin=None):
    return subprocess.run([sys.executable, "-m", "flask", "--app", "app", *args], cwd=ROOT, env=env, input=stdin,
                          capture_output=True, text=True, check=True)


def import_once(database_url, path):
    env = {**os.environ, "DATABASE_URL": database_url, "SECRET_KEY": "bench", "FLASK_SKIP_DOTENV": "1"}
    flask(env, "users", "create", "acme", "--email", "acme@example.com", "--password-stdin", stdin=PASSWORD)
    started = time.monotonic()
    done = flask(env, "keys", "import", str(path), "--org", "acme")
    seconds = time.monotonic() - started
    assert done.stdout.splitlines()[-1].startswith(f"{lines_of(path)} of {lines_of(path)} lines imported"), done.stdout
    return seconds


def lines_of(path):
    return sum(1 for _ in path.open())


def probe(workdir, probes):
    """(median ms of a wrong secret whose lookup prefix is over its allowance, median ms of one with no known start)."""
    import requests

    database = f"sqlite:///{workdir}/probe.db"
    env = {**os.environ, "DATABASE_URL": database, "SECRET_KEY": "bench", "FLASK_SKIP_DOTENV": "1",
           "PUBLIC_RATE_LIMIT": "off"}
    flask(env, "users", "create", "acme", "--email", "acme@example.com", "--password-stdin", stdin=PASSWORD)
    sys.path.insert(0, str(ROOT / "tests" / "support"))
    from importfiles import bcrypt_line, jsonl, made_secret

    secret = made_secret("rails_tok_")
    (workdir / "one.jsonl").write_bytes(jsonl(bcrypt_line(secret)))
    flask(env, "keys", "import", str(workdir / "one.jsonl"), "--org", "acme")
    known, unknown = secret[:-2] + "zz", made_secret("other_tok_")
    server = servers.service(env)
    try:
        with requests.Session() as session:
            def timed(value):
                started = time.perf_counter()
                answer = session.get(server.base + "/api/v1/protected/test", headers={"X-API-Key": value})
                assert answer.status_code == 401
                return (time.perf_counter() - started) * 1000

            for _ in range(12):
                timed(known)  # past the 10 checks a minute: from here on refused without a check
            pairs = [(timed(known), timed(unknown)) for _ in range(probes)]
    finally:
        server.stop()
    return statistics.median(pair[0] for pair in pairs), statistics.median(pair[1] for pair in pairs)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--probes", type=int, default=400)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-keyimports-") as workdir:
        workdir = Path(workdir)
        path = workdir / "keys.jsonl"
        write_file(path, args.lines)
        print(f"`keys import` of {args.lines:,} lines (a quarter of each scheme), wall seconds per run")
        print("| database | runs | median |")
        print("|---|---|---|")
        for name in ("sqlite", "postgresql"):
            runs = []
            for run in range(args.runs):
                if name == "sqlite":
                    runs.append(import_once(f"sqlite:///{workdir}/import-{run}.db", path))
                    continue
                try:
                    runs.append(import_once(fresh_database(POSTGRES_DATABASE), path))
                finally:
                    drop_database(POSTGRES_DATABASE)
            print(f"| {name} | {' / '.join(f'{s:.1f}' for s in runs)} | {statistics.median(runs):.1f} |")
        known, unknown = probe(workdir, args.probes)
        print(f"Refusal, median of {args.probes} each, alternating: a lookup prefix past its allowance "
              f"{known:.2f} ms, no known start {unknown:.2f} ms")


if __name__ == "__main__":
    main()
