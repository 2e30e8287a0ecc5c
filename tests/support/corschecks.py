"""What a browser's script of another origin may read of a response (CORS), for the in-process and
the live tests alike."""

ALLOWED = "https://app.example.com"
EXPOSED = {"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "RateLimit-Policy", "RateLimit",
           "Retry-After", "X-Request-ID"}
PREFLIGHT = {"Access-Control-Request-Method": "GET", "Access-Control-Request-Headers": "x-api-key"}


def cors_headers(response):
    return {name: value for name, value in response.headers.items() if name.lower().startswith("access-control-")}


def names(value):
    return {name.strip() for name in value.split(",")}


def assert_readable_by(response, origin, expected=None):
    """The response lets a script of `origin` read it and the headers it needs, without credentials."""
    assert response.headers["Access-Control-Allow-Origin"] == (expected or origin)
    assert "Origin" in names(response.headers["Vary"])
    assert names(response.headers["Access-Control-Expose-Headers"]) == EXPOSED
    assert "Access-Control-Allow-Credentials" not in response.headers


def assert_preflight_answered(response, origin):
    assert response.status_code == 204
    assert (response.data if hasattr(response, "data") else response.content) == b""
    assert_readable_by(response, origin)
    assert "GET" in names(response.headers["Access-Control-Allow-Methods"])
    assert "x-api-key" in {name.lower() for name in names(response.headers["Access-Control-Allow-Headers"])}
