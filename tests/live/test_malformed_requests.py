"""Hostile input against the live server in both run modes: bytes that are not UTF-8, control
characters, duplicate and misplaced keys, oversized and unparseable requests, and a flood of unknown
keys. None may yield a 500, a traceback or a leaked secret. The same input in-process:
tests/unit/test_malformed_requests.py."""

import json
import socket

import pytest
import requests
from contract import DOCUMENT, assert_conforms, assert_error

PROTECTED = ["/api/v1/protected/test", "/api/v1/user/me", "/api/v1/usage/stats"]
OPERATIONS = [(method.upper(), path) for path, item in DOCUMENT["paths"].items() for method in item
              if method in {"get", "post", "put", "patch", "delete"}]


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


@pytest.mark.parametrize("method, path", OPERATIONS)
def test_live_a_content_length_that_is_not_a_number_gets_the_documented_400(live, method, path):
    """The server refuses the head before the API sees it, on every operation, as openapi.json says
    (schemathesis sent such a head to POST /api/v1/keys/revoke)."""
    server, secret = live
    response = requests.request(method, server.base + path, timeout=10,
                                headers={"Content-Length": "sBA?cR*4", "X-API-Key": secret})
    assert_error(response, 400, "bad_request")


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
    (b"GET /api/v1/status HTTP/1.1" + b"".join(b"\r\nX-Noise-%d: x" % i for i in range(150)), 431,
     "request_header_fields_too_large"),
])
def test_live_oversized_requests_get_a_json_4xx_from_the_server_and_it_carries_on(live, head, status, code):
    server, _ = live
    answer, body = send_raw(server, head)
    assert answer == status
    assert json.loads(body) == {"error": {"code": code, "message": MESSAGES[status]}}
    assert requests.get(server.base + "/api/v1/status", timeout=10).status_code == 200


def test_live_a_head_past_the_c_parsers_own_cap_gets_a_json_4xx(live, run_mode):
    """picohttpparser holds at most 256 header lines and fails on more before gunicorn_h1c counts
    them against limit_request_fields, so gunicorn's C parser answers 400 where the fallback says
    431: a refusal either way, in the contract's shape, and the server carries on."""
    server, _ = live
    answer, body = send_raw(server, b"GET /api/v1/status HTTP/1.1"
                            + b"".join(b"\r\nX-Noise-%d: x" % i for i in range(500)))
    if run_mode == "gunicorn":
        assert "Parsing requests with gunicorn's C parser (gunicorn_h1c " in server.output()
        status, code = 400, "bad_request"
    else:
        status, code = 431, "request_header_fields_too_large"
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
