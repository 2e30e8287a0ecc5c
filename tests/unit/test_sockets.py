"""The socket handshake gate and helpers, through Flask's test client (no upgrade happens here)."""

import json
import threading

import pytest
import redis
import services
from wsproto.frame_protocol import Opcode
from wsservers import Client, open_server, socket_pair

import sockets
from accounts import users
from keys import keyformat
from models import ApiKey, utcnow
from orgs import keyactions
from store.rediswindows import RedisWindows
from ws import slots, wsserver
from ws.outbox import Outbox

UPGRADE = {"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
           "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}


def error_code(response):
    assert response.mimetype == "application/json"
    return response.get_json()["error"]["code"]


@pytest.mark.parametrize("query, code", [("", "missing_api_key"), ("?api_key=%20", "missing_api_key"),
                                         ("?api_key=sk_test_bad", "invalid_api_key")])
def test_time_handshake_refusals(client, query, code):
    response = client.get("/api/v1/ws/time" + query, headers=UPGRADE)
    assert response.status_code == 401
    assert error_code(response) == code
    assert response.headers["WWW-Authenticate"].startswith("ApiKey")


def test_missing_key_message_names_the_query_parameter(client):
    response = client.get("/api/v1/ws/time", headers=UPGRADE)
    assert "api_key query parameter" in response.get_json()["error"]["message"]


def test_revoked_key_is_refused(client, api_key):
    keyactions.revoke_key(ApiKey.get(ApiKey.key_hash == keyformat.hash_key(api_key)))
    response = client.get(f"/api/v1/ws/time?api_key={api_key}", headers=UPGRADE)
    assert (response.status_code, error_code(response)) == (401, "invalid_api_key")


def test_refused_handshake_is_not_counted(app, client, api_key):
    client.get(f"/api/v1/ws/time?api_key={api_key}x", headers=UPGRADE)
    assert app.extensions["usage"].pending == {}


def test_a_kept_key_revoked_elsewhere_is_refused_as_revoked_even_with_its_sockets_all_open(make_app):
    """On Redis a worker keeps keys until the key generation moves; the handshake's slot is taken only
    for a key read afresh, so a revoked one is a 401, never "too many sockets", and not recorded."""
    app = make_app({"DATABASE_URL": services.postgres_url(), "RATELIMIT_STORAGE_URL": services.redis_url(),
                    "RATE_LIMIT_TIERS": "free=100/minute", "TESTING": True, "TIME_SOCKETS_PER_KEY": 1})
    client = app.test_client()
    with app.app_context():
        user = users.create_user("lee", "lee@example.com", "correct horse battery")
        key, secret = keyactions.issue_key(user, "k", "production")
        assert client.get("/api/v1/protected/test", headers={"X-API-Key": secret}).status_code == 200
        slot = app.extensions["socket_slots"].take(key.id)
        # Revoked by another process: the row changes and the generation moves, as keyactions.revoke_key does there.
        ApiKey.update(revoked_at=utcnow()).where(ApiKey.id == key.id).execute()
        RedisWindows(app.extensions["ratelimit"].storage).announce_key_change()
        response = client.get(f"/api/v1/ws/time?api_key={secret}", headers=UPGRADE)
        assert (response.status_code, error_code(response)) == (401, "invalid_api_key")
        app.extensions["socket_slots"].give_back(key.id, slot)
        assert [entry[1] for entry in app.extensions["usage"].pending] == ["/api/v1/protected/test"]


def test_socket_slots_cap_and_release():
    owners = slots.SocketSlots(per_owner=2)
    first, _ = owners.take(7), owners.take(7)
    with pytest.raises(slots.TooManyConnections) as raised:
        owners.take(7)
    assert (raised.value.code, raised.value.error_code) == (429, "too_many_connections")
    other = owners.take(8)
    owners.give_back(7, first)
    owners.take(7)
    for key_id, token in ((7, first), (7, first), (8, other)):
        owners.give_back(key_id, token)
    assert owners.open == {}


def test_shared_slots_given_back_at_once_are_all_freed():
    """Sockets closed together (a network cut) give back their slots at once: with one ZREM each,
    a worker whose Redis client allows 100 connections freed ~210 of 2,500 (bench/capacity.py), and
    the rest kept their keys at the cap for up to 90 s. Here the client allows 2, for 200 slots."""
    client = redis.Redis.from_url(services.redis_url(), max_connections=2)
    shared = slots.SharedSocketSlots(client, per_key=1_000, redis_errors=redis.RedisError)
    taken = [(key_id, shared.take(key_id)) for key_id in range(1, 201)]
    start = threading.Barrier(len(taken))

    def close(key_id, token):
        start.wait()
        shared.give_back(key_id, token)

    threads = [threading.Thread(target=close, args=slot) for slot in taken]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        assert [key_id for key_id, _ in taken if client.zcard(shared.name(key_id))] == []
    finally:
        client.delete(*(shared.name(key_id) for key_id, _ in taken))
        client.close()


def test_plain_http_to_a_socket_path_is_426_upgrade_required(client):
    response = client.get("/api/v1/ws/echo")
    assert response.status_code == 426
    assert response.headers["Upgrade"] == "websocket"
    assert error_code(response) == "upgrade_required"


def test_time_update_names_its_second():
    message = json.loads(sockets.time_update(1_795_315_403))
    assert list(message) == ["type", "formatted", "timestamp"]
    assert message["type"] == "time_update"
    assert message["formatted"] == "2026-11-22 02:43:23 UTC"


def test_echo_slots_refuse_with_their_own_sentence():
    owners = slots.SocketSlots(1, "This IP address already has 1 open echo sockets; close one first.")
    owners.take("10.0.0.1")
    with pytest.raises(slots.TooManyConnections, match="IP address"):
        owners.take("10.0.0.1")
    owners.take("10.0.0.2")


def test_an_upgrade_to_a_plain_path_keeps_its_400(client):
    response = client.get("/api/v1/status", headers=UPGRADE)
    assert response.status_code == 400
    assert "Upgrade" not in response.headers


@pytest.mark.parametrize("value", ["0", "-1", "soon", "nan", "inf"])
def test_a_bad_send_timeout_stops_start_up_with_a_sentence(value):
    from app import load_config

    with pytest.raises(ValueError, match=f"WS_SEND_TIMEOUT must be a number of seconds above 0, not '{value}'"):
        load_config({"SECRET_KEY": "x", "WS_SEND_TIMEOUT": value})


class FakeConnection:
    """A client's connection under a real Outbox: it takes every frame, or fails each with failure;
    on_send runs first, as whatever yields during a tick would."""

    def __init__(self, failure):
        self.failure = failure
        self.sent = []
        self.on_send = None

    def gettimeout(self):
        return None

    def settimeout(self, timeout):
        pass

    def send(self, frame):
        if self.on_send:
            self.on_send()
        if self.failure:
            raise self.failure
        self.sent.append(frame)
        return len(frame)

    def close(self):
        pass


class FakeSocket:
    def __init__(self, failure=None):
        self.connection = FakeConnection(failure)
        self.outbox = Outbox(self.connection, wsserver.OUTPUT_LIMIT, stall_timeout=5, on_stall=pytest.fail)
        self.closed_with = None

    def close(self, code, reason):
        self.closed_with = code


def follow(ticker, ws):
    """What Ticker.add does for ws, without starting the ticker's threads: the test ticks itself."""
    ticker.sockets[ws] = (1, 1)
    ticker.secrets[ws] = "secret hash"
    ticker.outboxes[ws.outbox] = ws


def test_one_failing_socket_costs_only_itself_its_tick(caplog):
    ticker = sockets.Ticker(slots.SocketSlots(10), 5)
    broken, gone, healthy = FakeSocket(RuntimeError("boom")), FakeSocket(BrokenPipeError()), FakeSocket()
    for ws in (broken, gone, healthy):
        follow(ticker, ws)
    ticker.tick(1_795_315_403)
    ticker.tick(1_795_315_404)
    assert len(healthy.connection.sent) == 2
    assert list(ticker.sockets) == list(ticker.outboxes.values()) == [healthy]
    assert broken.closed_with == sockets.INTERNAL_ERROR and gone.closed_with is None
    # The unexpected failure is logged with its traceback; the closed connection is not logged.
    [logged] = [record for record in caplog.records if record.getMessage() == "A time socket failed; closing it."]
    assert logged.exc_text.endswith("RuntimeError: boom")


def test_a_socket_its_handler_let_go_of_during_a_tick_costs_the_others_nothing():
    # Whatever yields during a tick (a log handler writing to a socket) lets the handler of a
    # socket later in the tick let go of it.
    ticker = sockets.Ticker(slots.SocketSlots(10), 5)
    waiting, let_go, healthy = FakeSocket(), FakeSocket(BrokenPipeError()), FakeSocket()
    for ws in (waiting, let_go, healthy):
        follow(ticker, ws)
    waiting.connection.on_send = lambda: ticker.discard(let_go)
    ticker.tick(1_795_315_403)
    assert len(healthy.connection.sent) == 1
    assert list(ticker.sockets) == [waiting, healthy]


def test_a_tick_reaches_each_open_socket_follows_no_close_frame_and_cuts_off_a_client_a_limit_behind():
    pairs = [socket_pair() for _ in range(3)]
    healthy, closed, behind = (open_server(server_sock, ping_interval=None) for server_sock, _ in pairs)
    closed.close(4401, "The API key was revoked.")
    # Its client reads nothing: past what the kernel holds, twice the limit waits in the outbox.
    behind.outbox.send(b"x" * wsserver.OUTPUT_LIMIT)
    behind.outbox.send(b"x" * wsserver.OUTPUT_LIMIT)
    ticker = sockets.Ticker(slots.SocketSlots(10), 5)
    for ws in (healthy, closed, behind):
        follow(ticker, ws)
    ticker.tick(1_795_315_403)
    assert list(ticker.sockets) == list(ticker.outboxes.values()) == [healthy]
    assert behind.outbox.closed and not behind.connected
    healthy.close(1000, "done")
    frames = {ws: list(Client(client_sock).receive(30)) for ws, (_, client_sock) in zip((healthy, closed), pairs)}
    assert [frame.opcode for frame in frames[healthy]] == [Opcode.TEXT, Opcode.CLOSE]
    assert json.loads(frames[healthy][0].payload)["formatted"] == "2026-11-22 02:43:23 UTC"
    assert [frame.opcode for frame in frames[closed]] == [Opcode.CLOSE]
    for server_sock, client_sock in pairs:
        server_sock.close()
        client_sock.close()


def test_a_tick_to_a_socket_closed_a_limit_behind_leaves_its_queued_close_frame_to_go_out():
    server_sock, client_sock = socket_pair()
    ws = open_server(server_sock, ping_interval=None)
    # Its client reads nothing yet: past what the kernel holds, more than the limit waits.
    half = wsserver.text_frame("x" * (wsserver.OUTPUT_LIMIT // 2))
    for _ in range(3):
        ws.outbox.send(half)
    ws.close(4401, "The API key was revoked.")
    ticker = sockets.Ticker(slots.SocketSlots(10), 5)
    follow(ticker, ws)
    ticker.tick(1_795_315_403)
    assert not ticker.sockets and not ticker.outboxes and not ws.outbox.closed
    # wsproto hands a large frame over in parts as its bytes arrive.
    frames = [frame for frame in Client(client_sock).receive(30) if frame.frame_finished]
    assert [frame.opcode for frame in frames] == [Opcode.TEXT] * 3 + [Opcode.CLOSE]
    assert frames[-1].payload == (4401, "The API key was revoked.")
    server_sock.close()
    client_sock.close()


def test_the_ticker_starts_with_its_first_socket_and_its_threads_end_with_close():
    ticker = sockets.Ticker(slots.SocketSlots(10), 5)
    assert ticker.threads is None
    ticker.add(FakeSocket(), (1, 1), "secret hash")
    assert [thread.is_alive() for thread in ticker.threads] == [True, True, True]
    ticker.close()
    for thread in ticker.threads:
        thread.join(timeout=5)
    assert [thread.is_alive() for thread in ticker.threads] == [False, False, False]


def test_a_handshake_without_a_key_is_400_and_another_version_426_naming_13(client):
    without_key = {name: value for name, value in UPGRADE.items() if name != "Sec-WebSocket-Key"}
    response = client.get("/api/v1/ws/echo", headers=without_key)
    assert response.status_code == 400 and "Sec-WebSocket-Key" in response.json["error"]["message"]
    response = client.get("/api/v1/ws/echo", headers=dict(UPGRADE, **{"Sec-WebSocket-Version": "8"}))
    assert response.status_code == 426 and response.headers["Sec-WebSocket-Version"] == "13"
