"""The two WebSockets: a public echo, and a stream of the server time for a valid API key."""

import functools
import json
import logging
import math
import threading
import time
import weakref
from json.encoder import encode_basestring_ascii as encode_string

import flask_sock
import simple_websocket
from flask import Blueprint, current_app, g, request
from limits.storage import RedisStorage
from werkzeug.exceptions import BadRequest, HTTPException
from werkzeug.routing import WebsocketMismatch
from wsproto.utilities import LocalProtocolError

import auth
import models
import ratelimit
from keys import keyformat, lookup
from metering import usage
from ops import clientaddress, metrics, note as request_note, services
from ws import freezer, outbox as outbox_module, slots, wsserver

log = logging.getLogger(__name__)

SHUTDOWN = 1001
UNSUPPORTED_DATA = 1003
INTERNAL_ERROR = 1011
MESSAGE_TOO_BIG = 1009
KEY_REVOKED = 4401


# flask-sock looks the server class up by this module-level name on every connection.
flask_sock.Server = wsserver.Server
sock = flask_sock.Sock()
bp = Blueprint("sockets", __name__, url_prefix="/api/v1/ws")

open_sockets = weakref.WeakSet()
shutting_down = threading.Event()


class UpgradeRequired(HTTPException):
    """A plain HTTP request to a socket path (HTTP 426)."""

    code = 426
    error_code = "upgrade_required"
    description = "This path is a WebSocket: connect with a WebSocket client."

    def get_headers(self, environ=None, scope=None):
        return [*super().get_headers(environ, scope), ("Upgrade", "websocket")]


def init_app(app):
    """Configure the socket server and register the sockets blueprint."""
    app.config.setdefault("SOCK_SERVER_OPTIONS", {"max_message_size": 65536, "ping_interval": 25,
                                                  "send_timeout": app.config["WS_SEND_TIMEOUT"]})
    app.config.setdefault("TIME_SOCKETS_PER_KEY", 10)
    app.config.setdefault("REVOCATION_CHECK_SECONDS", 5)
    app.config.setdefault("ECHO_SOCKETS_PER_IP", 50)
    storage = app.extensions["ratelimit"].storage
    per_key = app.config["TIME_SOCKETS_PER_KEY"]
    if isinstance(storage, RedisStorage):
        time_slots = slots.SharedSocketSlots(storage.get_connection(), per_key, storage.base_exceptions)
    else:
        time_slots = slots.SocketSlots(per_key)
    app.extensions["socket_slots"] = time_slots
    per_ip = app.config["ECHO_SOCKETS_PER_IP"]
    app.extensions["echo_slots"] = slots.SocketSlots(
        per_ip, f"This IP address already has {per_ip} open echo sockets; close one first.")
    ticker = app.extensions["ticker"] = Ticker(time_slots, app.config["REVOCATION_CHECK_SECONDS"])
    services.register(app, "ticker", ticker)
    app.register_blueprint(bp)
    app.register_error_handler(WebsocketMismatch, refuse_plain_http)


def refuse_plain_http(error):
    """A plain request to a socket path: 426 rather than Werkzeug's 400, which blames "the
    browser (or proxy)". An upgrade to a plain path keeps the 400."""
    if request.method == "OPTIONS":
        return current_app.make_default_options_response()
    upgrade = request.headers.get("Upgrade", "").lower() == "websocket"
    return current_app.handle_http_exception(BadRequest() if upgrade else UpgradeRequired())


class WebSocketVersionRequired(UpgradeRequired):
    """A handshake for a WebSocket version other than RFC 6455's 13 (HTTP 426, naming 13)."""

    description = "This server speaks WebSocket version 13: send Sec-WebSocket-Version: 13."

    def get_headers(self, environ=None, scope=None):
        return [*super().get_headers(environ, scope), ("Sec-WebSocket-Version", "13")]


@bp.before_request
def admit_socket():
    # flask-sock completes the upgrade before the handler runs, so refusals happen here,
    # where they are still plain HTTP responses. wsproto would refuse these two inside the
    # handler, as an error (a 500 and a traceback for any client that leaves them out).
    if request.headers.get("Sec-WebSocket-Version") != "13":
        raise WebSocketVersionRequired()
    if not request.headers.get("Sec-WebSocket-Key"):
        raise BadRequest("A WebSocket handshake needs a Sec-WebSocket-Key header.")
    if request.endpoint == "sockets.echo":
        ratelimit.limit_client_ip()
        g.echo_slot = current_app.extensions["echo_slots"].take(clientaddress.client_identity(request.remote_addr))
    elif request.endpoint == "sockets.time_stream":
        secret = request.args.get("api_key")
        # The request lives as long as its socket: no parsed query string (~0.5 KiB) kept past this read.
        del request.args
        key = auth.admit(secret, "time:stream", request_note.of(request.environ), "the api_key query parameter",
                         hold=take_socket_slot)
        g.socket_secret_hash = keyformat.hash_key(secret.strip())
        g.api_key = key
        usage.record_handshake(key)


def take_socket_slot(key):
    """One of the key's TIME_SOCKETS_PER_KEY places, given back when the socket ends (or its
    handshake is refused)."""
    g.socket_slot = (key.id, current_app.extensions["socket_slots"].take(key.id))


@bp.teardown_request
def release_socket_slot(exc=None):
    slot = g.pop("socket_slot", None)
    if slot is not None:
        current_app.extensions["socket_slots"].give_back(*slot)
    echo_owner = g.pop("echo_slot", None)
    if echo_owner is not None:
        current_app.extensions["echo_slots"].give_back(echo_owner, echo_owner)


def tracked(handler):
    """Register the socket for the shutdown close and in the metrics, and log its life without the key."""
    name = handler.__name__.removesuffix("_stream")

    @functools.wraps(handler)
    def run(ws):
        models.release_connection()
        request_note.of(request.environ).socket_route = request.url_rule.rule
        if shutting_down.is_set():
            ws.close(SHUTDOWN, "The server is shutting down.")
            return
        open_sockets.add(ws)
        opened_in = freezer.FREEZER.socket_opened()
        metrics.socket_opened(name)
        started = time.monotonic()
        try:
            handler(ws)
        except (simple_websocket.ConnectionClosed, OSError):
            pass
        except Exception:
            # After the upgrade Flask's error handlers can no longer reach the client.
            log.exception("%s failed", request.path)
            close_quietly(ws, INTERNAL_ERROR, "Something went wrong on our side.")
        finally:
            open_sockets.discard(ws)
            freezer.FREEZER.socket_closed(opened_in)
            metrics.socket_closed(name)
            # Let the reader see the client's answer to our close before gunicorn drops the
            # connection; otherwise the client may get a reset instead of the close code.
            ws.thread.join(timeout=wsserver.LINGER_SECONDS)
            log.info("%s closed after %.1f s", request.path, time.monotonic() - started)

    return run


def close_all_sockets():
    """Close every open socket with 1001 (called on SIGTERM/SIGINT from gunicorn.conf.py)."""
    shutting_down.set()
    for ws in list(open_sockets):
        close_quietly(ws, SHUTDOWN, "The server is shutting down.")
        ws.event.set()


def close_quietly(ws, code, reason):
    """Close with a code unless the connection is already gone or closing."""
    try:
        ws.close(code, reason)
    except (simple_websocket.ConnectionClosed, OSError, LocalProtocolError):
        pass


@sock.route("/echo", bp=bp)
@tracked
def echo(ws):
    limit = current_app.config["SOCK_SERVER_OPTIONS"].get("max_message_size")
    while True:
        message = ws.receive()
        if isinstance(message, bytes):
            ws.close(UNSUPPORTED_DATA, "Only text messages are echoed.")
            return
        # simple-websocket measures text in characters; the limit is in bytes.
        if limit and len(message.encode()) > limit:
            ws.close(MESSAGE_TOO_BIG, "Message is too big.")
            return
        ws.send(echo_reply(message, *models.now_strings()))
        metrics.messages_sent("echo")


def echo_reply(message, timestamp, server_time):
    """The echo's JSON reply, as json.dumps writes it, built around its three strings' own
    encodings: json.dumps of the whole dict cost a sixteenth of an echo round trip."""
    return (f'{{"type": "echo", "message": {encode_string(message)}, "timestamp": {encode_string(timestamp)}, '
            f'"server_time": {encode_string(server_time)}}}')


def time_update(second):
    """Return the time_update message for a whole second."""
    return json.dumps({
        "type": "time_update",
        "formatted": models.display_time(models.utc_from_epoch(second)),
        "timestamp": models.now_strings()[0],
    })


class Ticker:
    """One greenlet per worker sends each whole second's time_update to every open time socket:
    one timer and one message build a second instead of one per socket. Two more greenlets close
    the sockets of revoked keys and renew the shared socket slots, so neither waits on the other
    or on a slow client. They start with the first time socket and stop with the app's services."""

    def __init__(self, socket_slots, check_every):
        self.slots = socket_slots
        self.check_every = check_every
        self.sockets = {}
        self.secrets = {}
        # Each socket's by its outbox, which is what a tick writes to.
        self.outboxes = {}
        self.threads = None
        self.stopped = threading.Event()

    def add(self, ws, slot, secret_hash):
        """Start sending ticks to ws, which holds slot (key id, token) and was opened with the
        secret of this hash."""
        self.sockets[ws] = slot
        self.secrets[ws] = secret_hash
        self.outboxes[ws.outbox] = ws
        # Started here rather than with the app's services: a worker that serves no time socket
        # wakes no greenlet every second, and a socket opened where services never start (an
        # in-process test) still gets its ticks.
        if self.threads is None:
            # The checks run half a second after the tick: at 10,000 sockets they take long
            # enough (a query per key, a pipeline per socket) to make the tick late.
            self.threads = [threading.Thread(target=self.every, args=(seconds, job, offset), name=name, daemon=True)
                            for name, seconds, job, offset in (
                                ("time-ticker", 1, self.tick, 0.0),
                                ("revocation-check", self.check_every, self.close_revoked, 0.5),
                                ("slot-heartbeat", slots.SharedSocketSlots.HEARTBEAT_SECONDS, self.renew_slots, 0.5))]
            for thread in self.threads:
                thread.start()

    def discard(self, ws):
        self.sockets.pop(ws, None)
        self.secrets.pop(ws, None)
        self.outboxes.pop(ws.outbox, None)

    def every(self, seconds, job, offset=0.0):
        """Run job(second) offset seconds after each whole second divisible by seconds, until close()."""
        second = math.floor(time.time())
        while True:
            # The next second comes from the clock, not from adding to the last one, so runs
            # never drift; a late run skips ahead rather than bursting.
            second = max(second + 1, math.floor(time.time()) + 1)
            second += -second % seconds
            if self.stopped.wait(max(0.0, second + offset - time.time())):
                return
            try:
                job(second)
            except Exception:
                log.exception("%s failed at %s.", job.__name__, second)

    def close(self):
        """Stop the ticks and the checks; the sockets themselves are closed by close_all_sockets."""
        self.stopped.set()

    def tick(self, second):
        frame = wsserver.text_frame(time_update(second))
        outboxes = list(self.outboxes)
        # Straight to each outbox, the one object of the socket's a tick reads: at 10,000 sockets
        # the kernel's work for each send evicts them from the cache, and reading the Server as
        # well cost a tenth of the tick (docs/bench/time-sockets.md).
        refused = outbox_module.send_to_each(outboxes, frame)
        for outbox, error in refused:
            self.let_go(outbox, error)
        metrics.messages_sent("time", len(outboxes) - len(refused))
        # A full collection now has the whole second before the next tick.
        collected = freezer.FREEZER.after_tick(len(open_sockets))
        if collected:
            metrics.socket_heap_collected(collected)

    def let_go(self, outbox, error):
        """Let go of the socket whose outbox refused a tick with error: a closed socket quietly,
        a client a limit behind with 1008, any other failure logged and closed with 1011."""
        ws = self.outboxes.get(outbox)
        if ws is None:
            return  # its handler let go of it while the tick yielded (a log handler writing to a socket)
        self.discard(ws)
        if isinstance(error, outbox_module.OutputFull):
            ws.give_up()
        elif not isinstance(error, OSError):
            log.error("A time socket failed; closing it.", exc_info=error)
            close_quietly(ws, INTERNAL_ERROR, "Something went wrong on our side.")

    def renew_slots(self, second):
        self.slots.refresh(list(self.sockets.values()))

    def close_revoked(self, second):
        """Close with 4401 the sockets whose secret no longer opens its key: the key was revoked or
        expired, or rolled and the secret's grace period is over."""
        active = {}
        for ws, secret_hash in list(self.secrets.items()):
            if secret_hash not in active:
                active[secret_hash] = secret_is_active(secret_hash)
            if not active[secret_hash]:
                self.discard(ws)
                close_quietly(ws, KEY_REVOKED, "The API key was revoked.")
                ws.event.set()


@sock.route("/time", bp=bp)
@tracked
def time_stream(ws):
    greet(ws, g.pop("api_key"))
    ticker = current_app.extensions["ticker"]
    ticker.add(ws, g.socket_slot, g.socket_secret_hash)
    try:
        # Client messages are ignored: this greenlet reads and drops them until the socket is
        # closed by either side, the ticker (revocation) or the shutdown.
        ws.read_until_closed()
    finally:
        ticker.discard(ws)


def greet(ws, key):
    """Tell the client which key opened the socket. Nothing keeps the key for the socket's life
    (its handshake read its own, ~1.7 KiB): the ticker needs only its slot and secret's hash."""
    log.info("time socket opened for key %s (%s...)", key.id, key.display_prefix)
    ws.send(json.dumps({"type": "auth_success", "api_key_name": key.name}))
    metrics.messages_sent("time")


def secret_is_active(secret_hash):
    try:
        return lookup.secret_is_active(secret_hash)
    finally:
        models.release_connection()
