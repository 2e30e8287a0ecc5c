"""MAX_BODY_BYTES: a larger body, declared or sent in chunks, is refused with 413 before it is read,
as JSON under /api/v1/ and as the HTML error page for browsers elsewhere; a body within the limit
still works; with Flask's client (the live server: tests/live/test_body_limit.py)."""

import io

import pytest

from app import load_config

BROWSER = {"Accept": "text/html,application/xhtml+xml;q=0.9,*/*;q=0.8"}
LIMIT = 65536


def chunked(body):
    """Flask's client sends input_stream as it is: the environ of a chunked request, as gunicorn
    makes it, says the stream ends by itself."""
    return {"input_stream": io.BytesIO(body),
            "environ_overrides": {"HTTP_TRANSFER_ENCODING": "chunked", "wsgi.input_terminated": True}}


def test_the_limit_is_read_and_validated_at_start():
    assert load_config({})["MAX_BODY_BYTES"] == LIMIT
    assert load_config({"MAX_BODY_BYTES": "1048576"})["MAX_BODY_BYTES"] == 1048576
    for bad in ("0", "1023", "64k", "-1", "1e6"):
        with pytest.raises(ValueError, match="MAX_BODY_BYTES must be a whole number of at least 1024"):
            load_config({"MAX_BODY_BYTES": bad})


@pytest.mark.parametrize("sending", ["declared", "chunked"])
def test_a_large_api_body_is_a_json_413(client, api_key, sending):
    body = b"x" * (LIMIT + 1)
    options = {"data": body} if sending == "declared" else chunked(body)
    response = client.post("/api/v1/keys/revoke", headers={"X-API-Key": api_key}, **options)
    assert response.status_code == 413
    assert response.json == {"error": {"code": "payload_too_large",
                                       "message": f"The request body is larger than the {LIMIT} bytes this service "
                                                  "accepts."}}
    # Refused before the key was looked at: it still works.
    assert client.get("/api/v1/protected/test", headers={"X-API-Key": api_key}).status_code == 200


@pytest.mark.parametrize("sending", ["declared", "chunked"])
def test_a_large_form_is_a_413_page_for_a_browser(client, sending):
    body = b"username=a&password=" + b"p" * LIMIT
    options = {"data": body} if sending == "declared" else chunked(body)
    response = client.post("/login", headers=BROWSER, content_type="application/x-www-form-urlencoded", **options)
    assert response.status_code == 413
    assert response.content_type == "text/html; charset=utf-8"
    assert f"larger than the {LIMIT} bytes" in response.get_data(as_text=True)


def test_a_chunked_body_within_the_limit_reaches_the_form(client, user):
    body = b"username=alice&password=correct+horse+battery"
    response = client.post("/login", content_type="application/x-www-form-urlencoded", **chunked(body))
    assert response.status_code == 302
