"""Every status under /api/v1 carries the API's headers, OPTIONS answers 204, and browsers get HTML
error pages everywhere outside the API: on the live server in both run modes."""

import socket

import pytest
import requests

BROWSER = {"Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"}
HANDSHAKE = {"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
             "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}


def assert_api_headers(response):
    assert response.headers["Cache-Control"] == "no-store"
    assert response.headers["X-Content-Type-Options"] == "nosniff"


@pytest.mark.parametrize("method, path, headers, status", [
    ("GET", "/api/v1/no-such-thing", {}, 404),
    ("GET", "/api/v1/no-such-thing", BROWSER, 404),
    ("POST", "/api/v1/status", {}, 405),
    ("DELETE", "/api/v1/protected/test", {}, 405),
    ("GET", "/api/v1/ws/time", {}, 426),
    ("GET", "/api/v1/ws/echo", BROWSER, 426),
    ("GET", "/api/v1/ws/time?api_key=sk_live_nope", HANDSHAKE, 401),
    ("GET", "/api/v1/ws/time", HANDSHAKE, 401),
    ("GET", "/api/v1/protected/test", {}, 401),
    # Werkzeug routes a path with leading slashes doubled to the same views.
    ("GET", "//api/v1/protected/test", {}, 401),
    ("GET", "/api/v1/ws/echo", {name: value for name, value in HANDSHAKE.items() if name != "Sec-WebSocket-Key"}, 400),
    ("GET", "/api/v1/ws/echo", dict(HANDSHAKE, **{"Sec-WebSocket-Version": "8"}), 426),
])
def test_every_api_error_carries_the_api_headers_and_json(live, method, path, headers, status):
    server, _ = live
    response = requests.request(method, server.base + path, headers=headers, timeout=10)
    assert response.status_code == status
    assert_api_headers(response)
    assert response.headers["Content-Type"] == "application/json"
    assert set(response.json()["error"]) == {"code", "message"}


@pytest.mark.parametrize("path", ["/api/v1/status", "/api/v1/protected/test", "/api/v1/ws/time", "/"])
def test_options_answers_204_with_allow_and_no_body(live, path):
    server, _ = live
    response = requests.options(server.base + path, timeout=10)
    assert response.status_code == 204
    assert response.content == b""
    assert "OPTIONS" in response.headers["Allow"] and "GET" in response.headers["Allow"]
    if path.startswith("/api/"):
        assert_api_headers(response)


def test_a_request_the_server_refuses_itself_carries_the_api_headers(live):
    server, _ = live
    host, port = server.base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as connection:
        connection.sendall(b"GET /api/v1/status HTTP/1.1\r\nHost: x\r\nX-Bad: a\x00b\r\n\r\n")
        head = connection.recv(65536).decode("latin-1")
    assert head.startswith("HTTP/1.1 400")
    assert "Cache-Control: no-store\r\n" in head and "X-Content-Type-Options: nosniff\r\n" in head


@pytest.mark.parametrize("method, path, status", [
    ("GET", "/no-such-page", 404),
    ("GET", "/settings/nope", 404),
    ("GET", "/static/nope.css", 404),
    ("GET", "/logout", 405),
])
def test_browsers_get_html_error_pages_outside_the_api(live, method, path, status):
    server, _ = live
    page = requests.request(method, server.base + path, headers=BROWSER, timeout=10)
    assert page.status_code == status
    assert page.headers["Content-Type"] == "text/html; charset=utf-8"
    for part in ('<html lang="en">', "<title>", "<main", "<h1>"):
        assert part in page.text
    other = requests.request(method, server.base + path, timeout=10)
    assert other.status_code == status
    assert other.headers["Content-Type"] == "application/json"


def test_pages_name_an_icon_and_a_description_and_the_icon_is_served(live):
    server, _ = live
    page = requests.get(server.base + "/", headers=BROWSER, timeout=10).text
    assert '<meta name="description" content="' in page
    assert 'rel="icon" href="/static/favicon.svg"' in page
    icon = requests.get(server.base + "/static/favicon.svg", timeout=10)
    assert icon.status_code == 200 and icon.headers["Content-Type"].startswith("image/svg+xml")
