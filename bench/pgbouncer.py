"""Run by hand: the service behind PgBouncer in transaction mode (`pool_mode = transaction`, 4
server connections for the worker's pool of 10), with psycopg's prepared statements as they are by
default and with `?prepare_threshold=none` in DATABASE_URL: 3,000 keyed requests with one key and
3,000 with a new key each, 10 at once, then whether `total_requests` holds every one of them.
docs/scaling.md has the figures. Needs pgbouncer (Debian: apt-get install pgbouncer),
PostgreSQL on 127.0.0.1:5432 (its database pgbouncer_bench is made afresh) and redis-server.

    python -m bench.pgbouncer [--json FILE]
"""

import asyncio
import os
import shutil
import subprocess
import tempfile
import time

from bench import capacity, servers, sharedstores, suite

POSTGRES_DATABASE = "pgbouncer_bench"
REQUESTS = 3000
SERVER_CONNECTIONS = 4
URLS = {"psycopg's default (prepared after 5 runs)": "", "`?prepare_threshold=none`": "?prepare_threshold=none"}


class PgBouncer:
    """pgbouncer in transaction mode on a free port, in front of POSTGRES_DATABASE."""

    def __init__(self):
        program = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
        if not os.path.exists(program):
            raise SystemExit("bench.pgbouncer needs pgbouncer (Debian: apt-get install pgbouncer)")
        self.port = servers.free_port()
        self.folder = tempfile.mkdtemp(prefix="bench-pgbouncer-")
        with open(f"{self.folder}/users.txt", "w") as users:
            users.write('"postgres" ""\n')
        with open(f"{self.folder}/pgbouncer.ini", "w") as config:
            config.write(f"[databases]\n{POSTGRES_DATABASE} = host=127.0.0.1 port=5432 dbname={POSTGRES_DATABASE} "
                         f"user=postgres\n\n[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {self.port}\n"
                         f"auth_type = trust\nauth_file = {self.folder}/users.txt\npool_mode = transaction\n"
                         f"default_pool_size = {SERVER_CONNECTIONS}\nmax_client_conn = 1000\nunix_socket_dir =\n"
                         f"logfile = {self.folder}/pgbouncer.log\n")
        # pgbouncer refuses to run as root.
        user = ["-u", "postgres"] if os.geteuid() == 0 else []
        if user:
            shutil.chown(self.folder, "postgres")
        self.process = subprocess.Popen([program, *user, f"{self.folder}/pgbouncer.ini"],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.version = subprocess.run([program, "--version"], capture_output=True, text=True).stdout.split("\n")[0]
        time.sleep(1)

    def stop(self):
        self.process.terminate()
        self.process.wait(timeout=10)
        shutil.rmtree(self.folder, ignore_errors=True)


def measure(workdir, options):
    import psycopg

    bouncer, redis_server = PgBouncer(), sharedstores.PrivateRedis()
    results = {}
    try:
        for name, query in URLS.items():
            direct_url = sharedstores.fresh_database(POSTGRES_DATABASE)
            env = dict(servers.service_env(workdir), RATELIMIT_STORAGE_URL=redis_server.url,
                       DATABASE_URL=f"postgresql://postgres@127.0.0.1:{bouncer.port}/{POSTGRES_DATABASE}{query}")
            secrets = servers.seed_keys(env, 1 + REQUESTS)
            server = servers.service(env)
            try:
                statuses = {}
                for keys, sent in (("one key", [secrets[0]] * REQUESTS), ("a new key each", secrets[1:])):
                    answered = asyncio.run(capacity.send_requests(
                        server.port, [capacity.request_bytes(secret) for secret in sent], 10))
                    statuses[keys] = dict(answered)
                time.sleep(3)  # the last usage flush
                with psycopg.connect(direct_url) as connection:
                    counted = int(connection.execute("SELECT sum(total_requests) FROM api_keys").fetchone()[0] or 0)
            finally:
                server.stop()
            results[name] = {"statuses": statuses, "total_requests": counted}
    finally:
        redis_server.stop()
        bouncer.stop()
    print(f"\n{bouncer.version}, pool_mode = transaction, {SERVER_CONNECTIONS} server connections; one worker (a pool "
          f"of 10); {REQUESTS:,} `GET {capacity.PATH}` with one key, then {REQUESTS:,} with a new key each, 10 at "
          "once\n")
    print("| DATABASE_URL | one key: statuses | a new key each: statuses | total_requests after (of the 200s) |")
    print("|---|---|---|---|")
    for name, result in results.items():
        statuses = result["statuses"]
        layout = {keys: ", ".join(f"{count:,} x {status}" for status, count in sorted(answered.items()))
                  for keys, answered in statuses.items()}
        ok = sum(answered.get(200, 0) for answered in statuses.values())
        print(f"| {name} | {layout['one key']} | {layout['a new key each']} | {result['total_requests']:,} "
              f"({ok:,}) |")
    return {"pgbouncer": bouncer.version, "server_connections": SERVER_CONNECTIONS, "requests": REQUESTS,
            "urls": results}


if __name__ == "__main__":
    suite.main("python -m bench.pgbouncer", {"pgbouncer": measure}, __doc__)
