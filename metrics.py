"""Prometheus metrics and GET /metrics.

Under gunicorn, gunicorn.conf.py sets PROMETHEUS_MULTIPROC_DIR before any worker starts: each
worker then keeps its numbers in its own files there, and /metrics sums them over every worker
of the instance. Anywhere else (the CLI, tests with Flask's client) they live in the process.
Labels stay few: a route's rule, never the path a client sent, and never a key."""

import hmac
import ipaddress
import os
import time

from flask import Blueprint, abort, current_app, request
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, multiprocess
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, choose_encoder, generate_latest

MULTIPROCESS_DIR = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
if MULTIPROCESS_DIR:
    # prometheus_client opens its files there as soon as a metric exists.
    os.makedirs(MULTIPROCESS_DIR, mode=0o700, exist_ok=True)

REQUESTS = Counter("http_requests", "HTTP requests answered, by route, method and status.",
                   ["endpoint", "method", "status"])
REQUEST_DURATION = Histogram("http_request_duration_seconds",
                             "Seconds from a request reaching the app to its response headers, by route "
                             "(WebSockets excluded).", ["endpoint"])
RATE_LIMITED = Counter("rate_limited", "Requests refused with 429, by policy: a tier, public, login, "
                       "signup or key-creation.", ["policy"])
SOCKETS = Gauge("websocket_connections", "Open WebSockets.", ["socket"], multiprocess_mode="livesum")
SOCKET_MESSAGES = Counter("websocket_messages_sent", "Messages sent on WebSockets.", ["socket"])
USAGE_PENDING = Gauge("usage_counts_pending", "Requests counted in memory and not yet written to the "
                      "database, as the last flush left them.", multiprocess_mode="livesum")
USAGE_FLUSH = Histogram("usage_flush_duration_seconds",
                        "Seconds each attempt to write the usage counts took, failed ones included.")

METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
UNMATCHED = "unmatched"

bp = Blueprint("metrics", __name__)


def init_app(app):
    app.register_blueprint(bp)


class RequestMetrics:
    """WSGI middleware: count and time every response by route, method and status. A middleware
    rather than Flask hooks: per request it costs half as much."""

    def __init__(self, wsgi_app):
        self.wsgi_app = wsgi_app

    def __call__(self, environ, start_response):
        started = time.perf_counter()

        def start_counted(status, headers, exc_info=None):
            count(environ, int(status[:3]), time.perf_counter() - started)
            return start_response(status, headers, exc_info)

        try:
            return self.wsgi_app(environ, start_counted)
        except StopIteration:
            # How flask-sock ends a WebSocket under gunicorn, once it has closed. Its lifetime is
            # no latency: counted, not timed.
            count(environ, 101, None)
            raise


SOCKET_ENDPOINT = "metrics.socket_endpoint"


def count(environ, status, seconds):
    # Flask's request (and with it the matched rule) is in the environ until its response is sent.
    rule = getattr(environ.get("werkzeug.request"), "url_rule", None)
    endpoint = rule.rule if rule is not None else environ.get(SOCKET_ENDPOINT, UNMATCHED)
    method = environ["REQUEST_METHOD"]
    labels = (endpoint, method if method in METHODS else "OTHER", status)
    counter, histogram = series.get(labels) or series_for(labels)
    counter.inc()
    if seconds is not None:
        histogram.observe(seconds)


# Each (endpoint, method, status)'s children, found once: labels() costs as much as inc().
series = {}


def series_for(labels):
    endpoint, method, status = labels
    series[labels] = REQUESTS.labels(endpoint, method, str(status)), REQUEST_DURATION.labels(endpoint)
    return series[labels]


def socket_opened(name):
    SOCKETS.labels(name).inc()


def socket_closed(name):
    SOCKETS.labels(name).dec()


def messages_sent(name, count=1):
    SOCKET_MESSAGES.labels(name).inc(count)


def rate_limited(policy):
    RATE_LIMITED.labels(policy).inc()


def usage_pending(count):
    USAGE_PENDING.set(count)


def usage_flushed(seconds):
    USAGE_FLUSH.observe(seconds)


@bp.get("/metrics")
def scrape():
    if not scraper_allowed():
        abort(404)
    if MULTIPROCESS_DIR:
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, MULTIPROCESS_DIR)
    else:
        registry = REGISTRY
    # As prometheus_client's own exporter does: the text format, or what the scraper asks for.
    try:
        encode, content_type = choose_encoder(request.headers.get("Accept", ""))
    except (TypeError, ValueError):
        encode, content_type = generate_latest, CONTENT_TYPE_PLAIN_0_0_4
    return encode(registry), 200, {"Content-Type": content_type, "Cache-Control": "no-store"}


def scraper_allowed():
    """Loopback clients, and anyone with `Authorization: Bearer METRICS_TOKEN` when it is set."""
    # Behind TRUSTED_PROXIES, remote_addr comes from X-Forwarded-For, which a client that reaches
    # gunicorn directly writes itself: the connection must come from loopback as well.
    peer = request.environ.get("werkzeug.proxy_fix.orig", {}).get("REMOTE_ADDR", request.remote_addr)
    if is_loopback(request.remote_addr) and is_loopback(peer):
        return True
    token = current_app.config["METRICS_TOKEN"]
    scheme, _, credentials = request.headers.get("Authorization", "").partition(" ")
    return bool(token) and scheme.lower() == "bearer" and hmac.compare_digest(
        credentials.strip().encode(), token.encode())


def is_loopback(address):
    try:
        ip = ipaddress.ip_address(address or "")
    except ValueError:
        return False  # a unix socket's peer, or no address at all
    return ip.is_loopback or bool(getattr(ip, "ipv4_mapped", None) and ip.ipv4_mapped.is_loopback)
