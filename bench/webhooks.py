"""Benchmark of webhook delivery, run by hand. Prints a markdown table.

    python bench/webhooks.py            # 1,000 events to ten endpoints of a local receiver
    python bench/webhooks.py --runs 3

The service runs under gunicorn with one gevent worker pinned to the server core, on a fresh SQLite
file, WEBHOOK_ALLOW_PRIVATE=1; the receiver (a threaded http.server answering 204 at once) runs in
this process on the client core. 100 events to each of ten endpoints are written in one transaction,
as changes write them; the time is from that commit to the last delivery. "healthy": every endpoint
answers 204; "one failing": one of the ten answers 500, and the time is until the other 900 are
delivered and the failing endpoint has had its probe: a failing endpoint is sent one message at a
time, so its other 99 wait for that message's retry (an hour here).
"""

import argparse
import http.server
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

if not __package__:
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench import servers

ENDPOINTS = 10
EVENTS = 100

WRITE = """
import sys
from app import create_app
from models import db
from webhooks import outbox
app = create_app()
with app.app_context(), db.atomic():
    for n in range(int(sys.argv[1])):
        outbox.emit(1, "key.revoked", {"n": n})
"""

SETUP = """
import sys
from app import create_app
from accounts import users
from webhooks import endpoints
app = create_app()
with app.app_context():
    user = users.create_user("bench", "bench@example.com", "bench password")
    for n in range(int(sys.argv[2])):
        endpoints.add_endpoint(user, f"{sys.argv[1]}/{n}", ["key.revoked"])
"""


class Server(http.server.ThreadingHTTPServer):
    # A backlog for a sender's fifty attempts at once (http.server's default is 5).
    request_queue_size = 1024
    daemon_threads = True


class Receiver:
    def __init__(self, failing_path):
        self.count = 0
        self.lock = threading.Lock()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with receiver.lock:
                    receiver.count += 1
                self.send_response(500 if self.path == failing_path else 204)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


def measure_once(failing):
    """Seconds from the commit of 1,000 messages to their delivery (with one endpoint failing: to
    the 900 others' delivery and the failing endpoint's one attempt)."""
    receiver = Receiver("/0" if failing else None)
    with tempfile.TemporaryDirectory() as workdir:
        env = dict(servers.service_env(workdir), WEBHOOK_ALLOW_PRIVATE="1", WEBHOOK_RETRY_SCHEDULE="1h",
                   SECRET_KEY="bench-secret-key-for-webhooks-0123456789")
        subprocess.run([sys.executable, "-c", SETUP, receiver.url, str(ENDPOINTS)], cwd=servers.ROOT, env=env,
                       check=True)
        server = servers.service(env)
        try:
            subprocess.run([sys.executable, "-c", WRITE, str(EVENTS)], cwd=servers.ROOT, env=env, check=True)
            started = time.monotonic()
            expected = (ENDPOINTS - 1) * EVENTS + 1 if failing else ENDPOINTS * EVENTS
            while receiver.count < expected:
                assert time.monotonic() - started < 300, f"only {receiver.count} deliveries in 300 s"
                time.sleep(0.01)
            return time.monotonic() - started
        finally:
            server.stop()
            receiver.stop()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=1)
    runs = parser.parse_args().runs
    servers.use_client_core()
    print("| receiver | 1,000 messages (900 and a probe with one failing) delivered in (each run) "
          "| per second (median) |")
    print("|---|---|---|")
    for name, failing in [("healthy", False), ("one of ten endpoints failing", True)]:
        seconds = [measure_once(failing) for _ in range(runs)]
        delivered = (ENDPOINTS - 1) * EVENTS if failing else ENDPOINTS * EVENTS
        print(f"| {name} | {' / '.join(f'{s:.2f} s' for s in seconds)} | "
              f"{delivered / statistics.median(seconds):,.0f} |", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("FLASK_SKIP_DOTENV", "1")
    main()
