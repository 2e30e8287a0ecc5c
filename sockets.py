"""The two WebSockets: a public echo, and a stream of the server time for a valid API key."""

import collections
import functools
import json
import logging
import math
import threading
import time
import uuid
import weakref

import flask_sock
import redis
import simple_websocket
from flask import Blueprint, current_app, g, request
from limits.storage import RedisStorage
from werkzeug.exceptions import TooManyRequests

import auth
import models
import ratelimit

log = logging.getLogger(__name__)

SHUTDOWN = 1001
UNSUPPORTED_DATA = 1003
INTERNAL_ERROR = 1011
MESSAGE_TOO_BIG = 1009
KEY_REVOKED = 4401
LINGER_SECONDS = 1.0


class Server(simple_websocket.Server):
    """simple-websocket's server without permessage-deflate, and with a 1009 close that the
    client actually receives."""

    def __init__(self, environ, **options):
        # The handshake is answered from these environ keys: without the client's offer no
        # extension is agreed, which saves ~100 KiB of compression state per socket.
        environ.pop("HTTP_SEC_WEBSOCKET_EXTENSIONS", None)
        super().__init__(environ, **options)

    def _handle_events(self):
        keep_going = super()._handle_events()
        if not keep_going and self.max_message_size and self.incoming_message_len > self.max_message_size:
            # The library has just queued close 1009 and would close the socket with the rest
            # of the message unread, which resets the connection and loses the close frame.
            self.connected = False
            self.event.set()
            drain(self.sock, LINGER_SECONDS)
        return keep_going


def drain(sock, seconds):
    """Read and discard what the peer still sends, until it closes or the time is up."""
    deadline = time.monotonic() + seconds
    try:
        while (left := deadline - time.monotonic()) > 0:
            sock.settimeout(left)
            if not sock.recv(65536):
                return
    except OSError:
        pass


# flask-sock looks the server class up by this module-level name on every connection.
flask_sock.Server = Server
sock = flask_sock.Sock()
bp = Blueprint("sockets", __name__, url_prefix="/api/v1/ws")

open_sockets = weakref.WeakSet()
shutting_down = threading.Event()


class TooManyConnections(TooManyRequests):
    """The key already has its maximum of open time sockets (HTTP 429)."""

    error_code = "too_many_connections"


class SocketSlots:
    """Counts each owner's open sockets (a key's time sockets, an IP's echo sockets) in this process."""

    def __init__(self, per_owner, refusal=None):
        self.per_owner = per_owner
        self.refusal = refusal or f"This API key already has {per_owner} open time sockets; close one first."
        self.open = collections.Counter()

    def take(self, owner):
        """Reserve a slot for the owner and return its token, or raise TooManyConnections."""
        if self.open[owner] >= self.per_owner:
            raise TooManyConnections(self.refusal)
        self.open[owner] += 1
        return owner

    def give_back(self, owner, token):
        self.open[owner] -= 1
        if self.open[owner] <= 0:
            del self.open[owner]

    def refresh(self, slots):
        """Nothing to do: a process's own counts cannot outlive it."""


class SharedSocketSlots:
    """Counts each key's open time sockets in Redis, so the cap holds across workers and
    instances. A slot is a member of the key's sorted set, scored by its last heartbeat, so
    the slots of a worker that died expire instead of leaking."""

    STALE_SECONDS = 90
    HEARTBEAT_SECONDS = 30
    TAKE = """
        redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[2])
        if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then return 0 end
        redis.call('ZADD', KEYS[1], ARGV[1], ARGV[4])
        redis.call('EXPIRE', KEYS[1], ARGV[5])
        return 1
    """

    def __init__(self, client, per_key):
        self.client = client
        self.per_key = per_key
        self.take_script = client.register_script(self.TAKE)

    @staticmethod
    def name(key_id):
        return f"time-sockets:{key_id}"

    def take(self, key_id):
        """Reserve a slot for the key and return its token, or raise TooManyConnections."""
        token = uuid.uuid4().hex
        now = time.time()
        try:
            taken = self.take_script(keys=[self.name(key_id)],
                                     args=[now, now - self.STALE_SECONDS, self.per_key, token, self.STALE_SECONDS])
        except redis.RedisError as error:
            log.error("Socket slots unavailable in Redis: %s", error)
            raise ratelimit.LimitStorageUnavailable() from None
        if not taken:
            raise TooManyConnections(f"This API key already has {self.per_key} open time sockets; close one first.")
        return token

    def give_back(self, key_id, token):
        try:
            self.client.zrem(self.name(key_id), token)
        except redis.RedisError as error:
            log.warning("Could not free a socket slot (it expires by itself): %s", error)

    def refresh(self, slots):
        """Renew the heartbeat of this worker's open slots."""
        now = time.time()
        try:
            with self.client.pipeline(transaction=False) as pipe:
                for key_id, token in slots:
                    pipe.zadd(self.name(key_id), {token: now}, xx=True)
                    pipe.expire(self.name(key_id), self.STALE_SECONDS)
                pipe.execute()
        except redis.RedisError as error:
            log.warning("Could not renew socket slots: %s", error)


def init_app(app):
    """Configure the socket server and register the sockets blueprint."""
    app.config.setdefault("SOCK_SERVER_OPTIONS", {"max_message_size": 65536, "ping_interval": 25})
    app.config.setdefault("TIME_SOCKETS_PER_KEY", 10)
    app.config.setdefault("REVOCATION_CHECK_SECONDS", 5)
    app.config.setdefault("ECHO_SOCKETS_PER_IP", 50)
    storage = app.extensions["ratelimit"].storage
    per_key = app.config["TIME_SOCKETS_PER_KEY"]
    if isinstance(storage, RedisStorage):
        slots = SharedSocketSlots(storage.get_connection(), per_key)
    else:
        slots = SocketSlots(per_key)
    app.extensions["socket_slots"] = slots
    per_ip = app.config["ECHO_SOCKETS_PER_IP"]
    app.extensions["echo_slots"] = SocketSlots(
        per_ip, f"This IP address already has {per_ip} open echo sockets; close one first.")
    app.extensions["ticker"] = Ticker(slots, app.config["REVOCATION_CHECK_SECONDS"])
    app.register_blueprint(bp)


@bp.before_request
def admit_socket():
    # flask-sock completes the upgrade before the handler runs, so refusals happen here,
    # where they are still plain HTTP responses.
    if request.endpoint == "sockets.echo":
        ratelimit.limit_client_ip()
        g.echo_slot = current_app.extensions["echo_slots"].take(request.remote_addr)
    elif request.endpoint == "sockets.time_stream":
        key = auth.authenticate(request.args.get("api_key"), "the api_key query parameter")
        g.socket_slot = (key.id, current_app.extensions["socket_slots"].take(key.id))
        g.api_key = key
        ratelimit.count_request(key)


@bp.teardown_request
def release_socket_slot(exc=None):
    slot = g.pop("socket_slot", None)
    if slot is not None:
        current_app.extensions["socket_slots"].give_back(*slot)
    echo_owner = g.pop("echo_slot", None)
    if echo_owner is not None:
        current_app.extensions["echo_slots"].give_back(echo_owner, echo_owner)


def tracked(handler):
    """Register the socket for the shutdown close, and log its life without the key."""

    @functools.wraps(handler)
    def run(ws):
        models.release_connection()
        if shutting_down.is_set():
            ws.close(SHUTDOWN, "The server is shutting down.")
            return
        open_sockets.add(ws)
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
            # Let the reader see the client's answer to our close before gunicorn drops the
            # connection; otherwise the client may get a reset instead of the close code.
            ws.thread.join(timeout=LINGER_SECONDS)
            log.info("%s closed after %.1f s", request.path, time.monotonic() - started)

    return run


def close_all_sockets():
    """Close every open socket with 1001 (called on SIGTERM/SIGINT from gunicorn.conf.py)."""
    shutting_down.set()
    for ws in list(open_sockets):
        close_quietly(ws, SHUTDOWN, "The server is shutting down.")
        ws.event.set()


def close_quietly(ws, code, reason):
    """Close with a code unless the connection is already gone."""
    try:
        ws.close(code, reason)
    except (simple_websocket.ConnectionClosed, OSError):
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
        timestamp, server_time = models.now_strings()
        ws.send(json.dumps({"type": "echo", "message": message, "timestamp": timestamp, "server_time": server_time}))


def time_update(second):
    """Return the time_update message for a whole second."""
    return json.dumps({
        "type": "time_update",
        "formatted": models.display_time(models.utc_from_epoch(second)),
        "timestamp": models.now_strings()[0],
    })


class Ticker:
    """One greenlet per worker sends each whole second's time_update to every open time socket:
    one timer and one message build a second instead of one per socket."""

    def __init__(self, slots, check_every):
        self.slots = slots
        self.check_every = check_every
        self.sockets = {}
        self.thread = None

    def add(self, ws, slot):
        """Start sending ticks to ws, which holds slot (key id, token)."""
        self.sockets[ws] = slot
        if self.thread is None:
            self.thread = threading.Thread(target=self.run, name="time-ticker", daemon=True)
            self.thread.start()

    def discard(self, ws):
        self.sockets.pop(ws, None)

    def run(self):
        second = math.floor(time.time())
        while True:
            # The next whole second comes from the clock, not from adding a second, so ticks
            # never drift; a late tick skips ahead rather than bursting.
            second = max(second + 1, math.floor(time.time()) + 1)
            time.sleep(max(0.0, second - time.time()))
            try:
                self.tick(second)
            except Exception:
                log.exception("The time ticker failed at %s.", second)

    def tick(self, second):
        message = time_update(second)
        # A send blocks only when a client's socket buffer is full, which at ~100 bytes a
        # second takes hours; the ping timeout closes such a client long before.
        for ws in list(self.sockets):
            try:
                ws.send(message)
            except (simple_websocket.ConnectionClosed, OSError):
                self.discard(ws)
        if second % self.check_every == 0:
            self.close_revoked()
        if second % SharedSocketSlots.HEARTBEAT_SECONDS == 0:
            self.slots.refresh(list(self.sockets.values()))

    def close_revoked(self):
        """Close with 4401 the sockets whose key has been revoked."""
        active = {}
        for ws, (key_id, _) in list(self.sockets.items()):
            if key_id not in active:
                active[key_id] = key_is_active(key_id)
            if not active[key_id]:
                self.discard(ws)
                close_quietly(ws, KEY_REVOKED, "The API key was revoked.")
                ws.event.set()


@sock.route("/time", bp=bp)
@tracked
def time_stream(ws):
    key = g.api_key
    ticker = current_app.extensions["ticker"]
    log.info("time socket opened for key %s (%s...)", key.id, key.display_prefix)
    ws.send(json.dumps({"type": "auth_success", "api_key_name": key.name}))
    ticker.add(ws, g.socket_slot)
    try:
        while True:
            # Client messages are ignored; receive() raises once the socket is closed by
            # either side, the ticker (revocation) or the shutdown.
            ws.receive()
    finally:
        ticker.discard(ws)


def key_is_active(key_id):
    try:
        return models.key_is_active(key_id)
    finally:
        models.release_connection()
