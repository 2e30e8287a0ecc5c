"""Hostile input, through Flask's test client and against the live server in both run modes: absurd
sizes, bytes that are not UTF-8, control characters, duplicate and misplaced keys, and floods of
unknown keys. None may yield a 500, a traceback, a leaked secret or state per unknown key."""

import json
import socket

import pytest
import requests

from contract import assert_conforms

PROTECTED = ["/api/v1/protected/test", "/api/v1/user/me", "/api/v1/usage/stats"]
HOSTILE_VALUES = [
    "sk_live_" + "a" * 100_000,
    "sk_live_\x00" + "a" * 40,
    "\x00" * 64,
    "sk_live_\x1b[31m" + "a" * 40,
    "sk_live_\t\v\f" + "a" * 40,
    "sk_live_\xff\xfe" + "a" * 40,
    "sk_live_Ð\x9aÐ»Ñ\x8e" + "a" * 40,
    "sk_live_" + "a" * 40 + "\x7f",
    "' OR 1=1 --",
    "%00%ff",
]


def assert_error(response, status, code):
    assert response.status_code == status
    assert assert_conforms(response)["error"]["code"] == code


@pytest.mark.parametrize("path", PROTECTED)
@pytest.mark.parametrize("value", HOSTILE_VALUES)
def test_hostile_key_headers_get_a_json_401(client, path, value):
    response = client.get(path, headers={"X-API-Key": value})
    assert_error(response, 401, "invalid_api_key")
    assert value not in response.get_data(as_text=True)


def test_hostile_key_headers_leave_status_public(client):
    for value in HOSTILE_VALUES[:4]:
        assert client.get("/api/v1/status", headers={"X-API-Key": value}).get_json()["authenticated"] is False


def test_huge_urls_get_json_errors(client):
    assert_error(client.get("/api/v1/" + "a" * 100_000), 404, "not_found")
    assert_error(client.get("/api/v1/protected/test?" + "a=b&" * 25_000), 401, "missing_api_key")
    assert_error(client.get("/api/v1/%ff%fe%00"), 404, "not_found")


def test_many_headers_do_not_matter(client, api_key):
    headers = [(f"X-Noise-{i}", "x" * 100) for i in range(1000)] + [("X-API-Key", api_key)]
    assert client.get("/api/v1/protected/test", headers=headers).status_code == 200


@pytest.mark.parametrize("second", ["same", "other"])
def test_duplicate_key_headers_are_refused(client, api_key, second):
    other = api_key if second == "same" else "sk_live_" + "b" * 40
    response = client.get("/api/v1/protected/test", headers=[("X-API-Key", api_key), ("X-API-Key", other)])
    assert_error(response, 401, "invalid_api_key")


@pytest.mark.parametrize("place", ["query", "query_header_name", "bearer", "cookie", "form"])
def test_keys_outside_the_header_count_as_missing(client, api_key, place):
    request = {
        "query": {"query_string": {"api_key": api_key}},
        "query_header_name": {"query_string": {"X-API-Key": api_key}},
        "bearer": {"headers": {"Authorization": f"Bearer {api_key}"}},
        "cookie": {"headers": {"Cookie": f"X-API-Key={api_key}; api_key={api_key}"}},
        "form": {"data": {"api_key": api_key, "X-API-Key": api_key}},
    }[place]
    response = client.get("/api/v1/protected/test", **request)
    assert_error(response, 401, "missing_api_key")
    assert api_key not in response.get_data(as_text=True)


def test_header_names_are_case_insensitive(client, api_key):
    assert client.get("/api/v1/protected/test", headers={"x-api-key": api_key}).status_code == 200


def test_socket_paths_without_an_upgrade_get_a_json_426(client, api_key):
    for path in ("/api/v1/ws/echo", f"/api/v1/ws/time?api_key={api_key}", "/api/v1/ws/time?api_key=%ff%00"):
        response = client.get(path)
        assert response.status_code == 426
        assert response.get_json()["error"]["code"] == "upgrade_required"
        assert api_key not in response.get_data(as_text=True)


def test_unknown_keys_create_no_limiter_or_usage_state(app, client, api_key):
    storage = app.extensions["ratelimit"].storage
    usage = app.extensions["usage"]
    client.get("/api/v1/status")
    before = (len(storage.storage), len(storage.expirations))
    for i in range(300):
        for value in (f"sk_live_{i:040d}", f"sk_test_{i:0>32}xyz", f"junk-{i}"):
            assert client.get(PROTECTED[i % 3], headers={"X-API-Key": value}).status_code == 401
            assert client.get(f"/api/v1/ws/time?api_key={value}").status_code == 426
    assert (len(storage.storage), len(storage.expirations)) == before
    assert not any(usage.pending.values())


# The server's own refusals (gunicorn's, or the fallback's) say what werkzeug's exceptions say, never a
# quote of the request.
MESSAGES = {
    400: "The browser (or proxy) sent a request that this server could not understand.",
    414: "The length of the requested URL exceeds the capacity limit for this server. The request cannot be processed.",
    431: "One or more header fields exceeds the maximum size.",
}


def send_raw(server, head):
    """Send one request (request line and headers, as bytes) and return (status, body)."""
    host, port = server.base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(head + b"\r\nHost: x\r\nConnection: close\r\n\r\n")
        reply = b""
        try:
            while chunk := sock.recv(65536):
                reply += chunk
        except ConnectionResetError:
            pass  # the server may close before reading all of an oversized request
    status_line, _, rest = reply.partition(b"\r\n")
    return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2]


def test_live_bytes_that_are_not_utf8_get_a_json_401(live):
    server, _ = live
    request_head = b"GET /api/v1/protected/test HTTP/1.1\r\nX-API-Key: sk_live_\xff\xfe\xc3" + b"a" * 40
    status, body = send_raw(server, request_head)
    assert status == 401
    assert b'"invalid_api_key"' in body


@pytest.mark.parametrize("value", [b"sk_live_\x00" + b"a" * 40, b"sk_live_\x1b[31m" + b"a" * 40,
                                   b"sk_live_\r\n " + b"a" * 40])
def test_live_control_characters_get_a_json_400_from_the_server(live, value):
    server, _ = live
    status, body = send_raw(server, b"GET /api/v1/protected/test HTTP/1.1\r\nX-API-Key: " + value)
    assert status == 400
    assert json.loads(body) == {"error": {"code": "bad_request", "message": MESSAGES[400]}}


def test_live_duplicate_key_headers_are_refused(live):
    server, secret = live
    key = secret.encode()
    status, body = send_raw(server, b"GET /api/v1/protected/test HTTP/1.1\r\nX-API-Key: " + key
                            + b"\r\nX-API-Key: " + key)
    assert status == 401
    assert b'"invalid_api_key"' in body


@pytest.mark.parametrize("header", ["X_API_KEY", "Authorization", "Cookie"])
def test_live_keys_outside_the_header_count_as_missing(live, header):
    server, secret = live
    value = f"Bearer {secret}" if header == "Authorization" else f"api_key={secret}" if header == "Cookie" else secret
    response = requests.get(server.base + f"/api/v1/protected/test?api_key={secret}", headers={header: value},
                            timeout=10)
    assert response.status_code == 401
    assert assert_conforms(response)["error"]["code"] == "missing_api_key"


@pytest.mark.parametrize("head, status, code", [
    (b"GET /api/v1/" + b"a" * 100_000 + b" HTTP/1.1", 414, "uri_too_long"),
    (b"GET /api/v1/status?api_key=" + b"a" * 8000 + b" HTTP/1.1", 414, "uri_too_long"),
    (b"GET /api/v1/status HTTP/1.1\r\nX-API-Key: " + b"a" * 100_000, 431, "request_header_fields_too_large"),
    (b"GET /api/v1/status HTTP/1.1" + b"".join(b"\r\nX-Noise-%d: x" % i for i in range(500)), 431,
     "request_header_fields_too_large"),
])
def test_live_oversized_requests_get_a_json_4xx_from_the_server_and_it_carries_on(live, head, status, code):
    server, _ = live
    answer, body = send_raw(server, head)
    assert answer == status
    assert json.loads(body) == {"error": {"code": code, "message": MESSAGES[status]}}
    assert requests.get(server.base + "/api/v1/status", timeout=10).status_code == 200


def test_live_unparseable_request_lines_keep_their_key_out_of_the_log(live):
    server, secret = live
    for head in (b"GET /api/v1/ws/time?api_key=" + secret.encode() + b"\xff HTTP/1.1",
                 b"GET /api/v1/status?api_key=" + secret.encode() + b" junk HTTP/1.1",
                 b"GET /api/v1/" + secret.encode() + b"\x01 HTTP/1.1"):
        status, body = send_raw(server, head)
        assert status == 400
        assert secret[8:].encode() not in body
    output = server.wait_for_output("Invalid request")
    assert secret[8:] not in output


def test_live_flood_of_unknown_keys(live):
    server, secret = live
    with requests.Session() as session:
        statuses = {session.get(server.base + PROTECTED[i % 3], headers={"X-API-Key": f"sk_live_{i:040d}"}).status_code
                    for i in range(500)}
        assert statuses == {401}
        assert session.get(server.base + "/api/v1/protected/test", headers={"X-API-Key": secret}).status_code == 200
