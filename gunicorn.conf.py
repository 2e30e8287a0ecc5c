"""gunicorn settings for both run modes. gunicorn reads this before the app exists: here, in the
master, every setting is checked (settings/), and PORT and WEB_CONCURRENCY are read."""

import json
import os
import re
import shutil
import signal
import sys
import tempfile
from importlib import metadata

import gevent
from gunicorn import util
from gunicorn.http import message
from werkzeug.exceptions import default_exceptions

# `python app.py` runs gunicorn from any folder: make this project's modules importable here.
ROOT = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, ROOT)
import settings  # noqa: E402
from ops import logs, services  # noqa: E402
from serving import lingering, startup, warmup  # noqa: E402
from serving.accesslog import SERVICE_FORMAT, ServiceLogger  # noqa: E402

# Before anything here reads the environment; a variable set in the real environment wins.
startup.read_env_file()
# Before any worker is forked: a bad setting ends gunicorn on its sentence (exit 2), where workers
# failing to boot would log a traceback each. gunicorn lets SystemExit out of reading this file.
try:
    SETTINGS = settings.load(os.environ)
except settings.ConfigError as error:
    settings.exit_with(error)
METRICS_FILE = re.compile(r"(counter|histogram|summary|gauge_[a-z]+)_[0-9]+\.db")
# The workers a reload replaces, oldest first, while they run; and those no new worker has taken on
# yet, which pre_fork hands out (the master's state, which the workers it forks inherit).
replaced_workers = []
unassigned_workers = []

bind = f"0.0.0.0:{SETTINGS['PORT']}"
workers = SETTINGS["WEB_CONCURRENCY"]
# gunicorn's gevent worker, sending each response's head with its body (serving/worker.py).
worker_class = "serving.worker.Worker"
# The default of 1,000 would silently cap open connections (and sockets) per worker.
worker_connections = 10_000
# Never preload: it imports the app before gevent patches threading, and peewee's
# per-thread state would then be shared by every greenlet.
preload_app = False
# A second instance would take over the control socket's path.
control_socket_disable = True
# Below the 30 s most platforms wait between SIGTERM and SIGKILL.
graceful_timeout = 20
keepalive = 5
accesslog = "-"
access_log_format = SERVICE_FORMAT
# X-Forwarded-* is trusted only behind TRUSTED_PROXIES proxies, and then by the app's ProxyFix,
# which counts the hops; gunicorn's default would trust it from any local client.
forwarded_allow_ips = ""


logger_class = ServiceLogger


def write_json_error(sock, status, reason, message):
    """Answer a request gunicorn refuses itself (one it cannot parse, or one too large) in the
    contract's JSON error shape instead of gunicorn's HTML page. gunicorn's own message is left
    out: it can quote the request line, and with it an api_key."""
    code = "internal_error" if status == 500 else reason.lower().replace(" ", "_")
    sentence = default_exceptions[status].description if status in default_exceptions else reason + "."
    body = json.dumps({"error": {"code": code, "message": sentence}}, separators=(",", ":")).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\nConnection: close\r\nContent-Type: application/json\r\n"
            "Cache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\n"
            f"{logs.REQUEST_ID_HEADER}: {logs.current_request_id.get() or logs.request_id_for(None)}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n")
    util.write_nonblock(sock, head.encode("latin-1") + body)


# gunicorn's workers look this up on the module at each error, so replacing it here is enough.
util.write_error = write_json_error


def on_starting(server):
    """Start the metrics afresh, make SIGINT a graceful stop, and warn when several workers would
    each keep their own limits, or instances their own session secret, or the secret is weak."""
    # On the arbiter, not in this module: a reload reads this file again, and its globals anew.
    server.private_metrics_dir = prepare_metrics_dir()
    # gunicorn's SIGINT is a quick stop that cuts sockets and can interrupt the last usage flush;
    # Ctrl-C should stop the service as gracefully as SIGTERM does.
    server.handle_int = server.handle_term
    storage = os.environ.get("RATELIMIT_STORAGE_URL") or "memory://"
    if server.cfg.workers > 1 and storage.startswith("memory://"):
        server.log.warning(
            "RATELIMIT_STORAGE_URL is memory://, so each of the %d workers keeps its own rate limits "
            "and time-socket caps; set a redis:// URL to share them.", server.cfg.workers)
    # The worker count gunicorn settled on: -w and GUNICORN_CMD_ARGS override WEB_CONCURRENCY.
    warning = startup.secret_key_warning(os.environ, server.cfg.workers)
    if warning:
        server.log.warning(warning)
    server.log.info(http_parser_in_use(server.cfg))


def http_parser_in_use(cfg):
    """Say which parser reads requests: gunicorn's C parser (gunicorn_h1c, pinned in
    requirements.txt) when it is installed and no setting turns it off, else gunicorn's own Python
    one, which costs each request several times as much (docs/bench/hot-path.md) and falls back silently."""
    # gunicorn decides per request with this function, from the same settings.
    if message._check_fast_parser(cfg):
        return f"Parsing requests with gunicorn's C parser (gunicorn_h1c {metadata.version('gunicorn_h1c')})"
    return ("Parsing requests with gunicorn's Python parser: gunicorn_h1c is not installed, or "
            "http_parser, permit_obsolete_folding or strip_header_spaces turns the C parser off")


def prepare_metrics_dir():
    """Use PROMETHEUS_MULTIPROC_DIR when the operator set it, emptied of an earlier run's metric
    files (which would add their counts to this run's); else make a private folder in shared
    memory and return it, for on_exit to remove. Runs before any worker starts, so every worker
    imports prometheus_client with it set and picks the multiprocess mode."""
    chosen = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if chosen:
        os.makedirs(chosen, mode=0o700, exist_ok=True)
        for name in os.listdir(chosen):
            if METRICS_FILE.fullmatch(name):
                os.remove(os.path.join(chosen, name))
        return None
    # Not beside the database: prometheus_client writes through mmap, and on a full disk a worker
    # would die of SIGBUS instead of answering with the 503s a full disk otherwise brings.
    shared_memory = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    private = os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="apiservice-metrics-",
                                                                        dir=shared_memory)
    return private


def on_exit(server):
    startup.ignore_stop_signals()
    private = getattr(server, "private_metrics_dir", None)
    if private:
        shutil.rmtree(private, ignore_errors=True)


def on_reload(server):
    """Keep the old workers serving until their replacements have loaded the app. gunicorn would
    stop them as soon as the new ones are forked, and requests would wait the new workers' start
    (up to 2 s); instead each new worker stops the old one it was given (pre_fork) once it serves,
    and child_exit lowers the count as each old one leaves."""
    global replaced_workers, unassigned_workers
    replaced_workers = sorted(server.WORKERS, key=lambda pid: server.WORKERS[pid].age)
    unassigned_workers = list(replaced_workers)
    server.num_workers = server.cfg.workers + len(replaced_workers)


def pre_fork(server, worker):
    """After a reload, give each new worker the old one it replaces; the last of the new count takes
    any beyond it. A new worker that dies before it serves gives its old one back (child_exit)."""
    taking = 1 if len(server.WORKERS) + 1 - len(replaced_workers) < server.cfg.workers else len(unassigned_workers)
    worker.retires = unassigned_workers[:taking]
    del unassigned_workers[:taking]


def retire_replaced_workers(worker):
    """In a worker started by a reload, once it serves: stop the old workers it was given."""
    for pid in worker.retires:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


def post_worker_init(worker):
    """Make SIGTERM and SIGINT close every open WebSocket with 1001 and then stop the worker
    gracefully (gunicorn on its own would cut sockets after graceful_timeout with no close frame,
    and its SIGINT is a quick stop); fold the worker's request counts into /metrics every second;
    start the worker's background services (ops/services.py); open its database and Redis
    connections before it serves and retires the old worker it replaces (serving/warmup.py)."""
    from ops import metrics
    from sockets import close_all_sockets

    gevent.spawn(metrics.fold_every_second)
    services.start(worker.wsgi)
    warmup.open_connections(worker.wsgi)
    # A greenlet runs once the worker's servers listen, so the old worker stops after this one serves.
    gevent.spawn(retire_replaced_workers, worker)

    def chain(previous):
        def handler(signum, frame):
            # A signal handler may run in gevent's hub, which must not block: close in a greenlet.
            gevent.spawn(close_all_sockets)
            previous(signum, frame)

        return handler

    signal.signal(signal.SIGTERM, chain(signal.getsignal(signal.SIGTERM)))
    signal.signal(signal.SIGINT, chain(worker.handle_exit))
    signal.signal(signal.SIGQUIT, chain(signal.getsignal(signal.SIGQUIT)))
    signal.siginterrupt(signal.SIGTERM, False)
    signal.siginterrupt(signal.SIGINT, False)
    worker.handle_error = with_request_id(worker.handle_error)
    warmup.freeze_heap()


def with_request_id(handle_error):
    """gunicorn answers a request it cannot parse (or whose app failed outside Flask) itself: give
    that answer, and the lines it logs about it, a request id too."""

    def handle(req, client, addr, exc):
        logs.current_request_id.set(logs.request_id_for(None))
        try:
            handle_error(req, client, addr, exc)
        finally:
            logs.end_request()

    return handle


def post_request(worker, req, environ, resp):
    """Let the worker's other connections run before this one's next request; close the connection
    after a body refused as too large, or any chunked one, instead of reading the rest of it."""
    # A WebSocket's response never started, so it has no status_code.
    if getattr(resp, "status_code", None) == 413 or environ.get("HTTP_TRANSFER_ENCODING"):
        # gunicorn would otherwise read and discard the whole body before the next request: a
        # refused one, a chunked one that no view read (only a POST's is), or one that failed
        # to parse, after which the next request's start is unknown.
        lingering.linger(req.body)
        req.must_close = True
    # gevent reads without yielding when data is already waiting, so a keep-alive client that
    # always has its next request ready (or pipelines them) would otherwise hold the worker
    # alone: with 50 busy connections, p99 was 0.9 s for a bare Flask endpoint, 33 ms with this.
    gevent.sleep(0)


def worker_exit(server, worker):
    """Fold the worker's last request counts into /metrics, and stop its background services
    (ops/services.py): the usage counts still held in memory are written before the worker goes,
    and an attempt the webhook sender cuts is due again at once, for the next worker."""
    from ops import metrics

    metrics.tally.fold()
    app = getattr(worker, "wsgi", None)
    if app is not None:
        services.stop(app)


def child_exit(server, worker):
    """Drop a dead worker's gauges (open sockets, pending counts) from /metrics; its counters stay
    in the sums; after a reload, count one worker fewer for each old one that leaves. Runs in the
    master, so a worker killed outright is covered too."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid, os.environ["PROMETHEUS_MULTIPROC_DIR"])
    if worker.pid in replaced_workers:
        replaced_workers.remove(worker.pid)
        server.num_workers -= 1
    # A new worker gone before it served: its replacement, forked next, takes on its old ones.
    unassigned_workers[:0] = [pid for pid in getattr(worker, "retires", ()) if pid in replaced_workers]
