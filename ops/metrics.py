"""Prometheus metrics and GET /metrics.

Under gunicorn, gunicorn.conf.py sets PROMETHEUS_MULTIPROC_DIR before any worker starts: each
worker then keeps its numbers in its own files there, and /metrics sums them over every worker
of the instance. Anywhere else (the CLI, tests with Flask's client) they live in the process.
Labels stay few: a route's rule, never the path a client sent, and never a key."""

import bisect
import collections
import hmac
import ipaddress
import itertools
import logging
import os
import time

from flask import Blueprint, abort, current_app, request
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, multiprocess
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, choose_encoder, generate_latest

from ops import note as request_note

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
STORAGE_FAILOPEN = Counter("ratelimit_storage_failopen", "Keyed requests admitted without counting them, "
                           "the limit storage unreachable (RATE_LIMIT_ON_STORAGE_FAILURE=open).")
SOCKETS = Gauge("websocket_connections", "Open WebSockets.", ["socket"], multiprocess_mode="livesum")
SOCKET_MESSAGES = Counter("websocket_messages_sent", "Messages sent on WebSockets.", ["socket"])
SOCKET_HEAP_COLLECTIONS = Counter("websocket_heap_collections", "Full garbage collections run right after a "
                                  "tick: a freeze of the WebSockets opened since, or a thaw of the whole heap.",
                                  ["kind"])
USAGE_PENDING = Gauge("usage_counts_pending", "Requests counted in memory and not yet written to the "
                      "database, as the last flush left them.", multiprocess_mode="livesum")
USAGE_FLUSH = Histogram("usage_flush_duration_seconds",
                        "Seconds each attempt to write the usage counts took, failed ones included.")
BILLING_SENT = Counter("billing_events_sent", "Billing events the billing system accepted.")
BILLING_FAILED = Counter("billing_events_failed", "Billing events given up after their retries.")
BILLING_OLDEST_PENDING = Gauge("billing_oldest_pending_hour_seconds",
                               "Seconds since the end of the oldest hour with a billing event not yet accepted "
                               "(0 with none).", multiprocess_mode="livemax")

METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
UNMATCHED = "unmatched"

log = logging.getLogger(__name__)
bp = Blueprint("metrics", __name__)


def init_app(app):
    app.register_blueprint(bp)




class Tally:
    """This worker's requests and echo messages since it started, counted in plain memory: a request
    pays a dictionary lookup and a few additions, where prometheus_client's multiprocess values
    take a lock and write a file page per observation (three per request). fold() adds what came
    since its last run to the metrics, once a second from the worker's folder greenlet and before
    every scrape, so /metrics lags this worker by at most a second.

    The numbers only ever grow, and fold() writes the difference from what it wrote last: a count
    made while a fold runs is folded the next time, never lost. Counting takes no lock: under
    gevent nothing here yields, and the threads of a test client each count in turn."""

    def __init__(self):
        # (endpoint, method, status) -> [requests, seconds, requests per duration bucket]
        self.requests = {}
        self.messages = collections.Counter()
        self.folded_requests = {}
        self.folded_messages = collections.Counter()

    def count(self, labels, seconds):
        counts = self.requests.get(labels)
        if counts is None:
            counts = self.requests[labels] = [0, 0.0, [0] * len(BUCKET_BOUNDS)]
        counts[0] += 1
        if seconds is not None:
            counts[1] += seconds
            counts[2][bisect.bisect_left(BUCKET_BOUNDS, seconds)] += 1

    def fold(self):
        for labels, (requests, seconds, buckets) in list(self.requests.items()):
            before_requests, before_seconds, before_buckets = self.folded_requests.get(labels) or (0, 0.0, ())
            if requests == before_requests:
                continue
            buckets = list(buckets)
            # Noted as folded first: a failure below loses this second's counts rather than adding
            # them again every second.
            self.folded_requests[labels] = requests, seconds, buckets
            counter, histogram = series.get(labels) or series_for(labels)
            counter.inc(requests - before_requests)
            if seconds != before_seconds:
                add_observations(histogram, seconds - before_seconds,
                                 [now - then for now, then in itertools.zip_longest(buckets, before_buckets,
                                                                                     fillvalue=0)])
        for socket, sent in list(self.messages.items()):
            before_sent = self.folded_messages[socket]
            if sent != before_sent:
                self.folded_messages[socket] = sent
                SOCKET_MESSAGES.labels(socket).inc(sent - before_sent)


BUCKET_BOUNDS = tuple(Histogram.DEFAULT_BUCKETS)


def add_observations(histogram, seconds, per_bucket):
    """Add many observations to a histogram child at once: their sum, and how many fell in each
    bucket (bounds as BUCKET_BOUNDS). prometheus_client observes one value at a time; this writes
    the same values it would (`_sum`, and `_buckets[i]`, the first bucket whose bound is at least
    the value). tests/unit/ops/test_operations.py fails if a new version moves them."""
    histogram._sum.inc(seconds)
    for bucket, count in zip(histogram._buckets, per_bucket):
        if count:
            bucket.inc(count)


tally = Tally()


def count(environ, status, seconds):
    """Count a response (seconds None: a WebSocket, whose lifetime is no latency) by its route."""
    endpoint = route(environ) or socket_route(environ) or UNMATCHED
    method = environ["REQUEST_METHOD"]
    tally.count((endpoint, method if method in METHODS else "OTHER", status), seconds)


def route(environ):
    """The rule a request was routed by (/api/v1/user/me), or None when no route matched."""
    # A request the fast lane served has no matched rule: the lane notes its route. Read without
    # request_note.of: this runs twice a request.
    note = environ.get(request_note.ENVIRON_KEY)
    if note is not None and note.route is not None:
        return note.route
    # Flask's request (and with it the matched rule) is in the environ until its response is sent.
    rule = getattr(environ.get("werkzeug.request"), "url_rule", None)
    return rule.rule if rule is not None else None


def socket_route(environ):
    """The rule of a WebSocket (it ends outside Flask's request), or None."""
    note = request_note.of(environ)
    return note.socket_route if note is not None else None


# Each (endpoint, method, status)'s children, found once: labels() costs as much as inc().
series = {}


def series_for(labels):
    endpoint, method, status = labels
    series[labels] = REQUESTS.labels(endpoint, method, str(status)), REQUEST_DURATION.labels(endpoint)
    return series[labels]


def fold_every_second():
    """Fold the tally into the metrics once a second, for ever (a gunicorn worker's greenlet)."""
    while True:
        time.sleep(FOLD_SECONDS)
        try:
            tally.fold()
        except Exception:
            log.exception("Could not fold the request counts into the metrics.")


FOLD_SECONDS = 1.0


def socket_opened(name):
    SOCKETS.labels(name).inc()


def socket_closed(name):
    SOCKETS.labels(name).dec()


def messages_sent(name, count=1):
    tally.messages[name] += count


def socket_heap_collected(kind):
    SOCKET_HEAP_COLLECTIONS.labels(kind).inc()


def rate_limited(policy):
    RATE_LIMITED.labels(policy).inc()


def storage_failopen():
    STORAGE_FAILOPEN.inc()


def usage_pending(count):
    USAGE_PENDING.set(count)


def usage_flushed(seconds):
    USAGE_FLUSH.observe(seconds)


def billing_sent(count):
    BILLING_SENT.inc(count)


def billing_failed(count):
    BILLING_FAILED.inc(count)


def billing_oldest_pending(seconds):
    BILLING_OLDEST_PENDING.set(seconds)


@bp.get("/metrics")
def scrape():
    if not scraper_allowed():
        abort(404)
    tally.fold()
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
