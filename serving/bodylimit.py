"""The request body limit: MAX_BODY_BYTES for every request, or the larger limit a room gives one
path (GitHub's secret-scanning reports take 1 MiB), enforced before any body is read."""

import io
import logging
import time

from flask import current_app, request
from werkzeug.exceptions import BadRequest, RequestEntityTooLarge

from ops import note as request_note

log = logging.getLogger(__name__)


class PayloadTooLarge(RequestEntityTooLarge):
    """A request body larger than its path's limit (HTTP 413)."""

    error_code = "payload_too_large"


def init_app(app):
    """Werkzeug's own bounds for bodies read after refuse_large_bodies (a form or file part past them
    is a 413 too, never spooled to a temporary file, which starts at 500 KB); the hook first of all,
    so that nothing (the CSRF check's form parsing included) reads a body before it."""
    app.config["MAX_CONTENT_LENGTH"] = app.config["MAX_FORM_MEMORY_SIZE"] = app.config["MAX_BODY_BYTES"]
    app.extensions["body_limits"] = {}
    app.before_request(refuse_large_bodies)


def allow_larger_bodies(app, path, limit):
    """Let requests to exactly this path carry bodies up to limit bytes, whatever MAX_BODY_BYTES says."""
    app.extensions["body_limits"][path] = limit


def refuse_large_bodies():
    """Refuse a body larger than its limit before it is read: a declared one at once, a chunked one
    once that many bytes came (they are kept for the view, in memory). Only a POST's chunked body
    is read: no other view takes one, and the server closes the connection after it."""
    # Runs on every request: the environ without a context proxy (see ops/note.py).
    environ = request_note.current_environ.get()
    limit = current_app.extensions["body_limits"].get(environ.get("PATH_INFO"))
    if limit is None:
        limit = current_app.config["MAX_BODY_BYTES"]
    else:
        # Werkzeug's multipart parser also holds up to max_form_memory_size of a part between reads:
        # the default, MAX_BODY_BYTES, would refuse a file of many lines well under its path's limit.
        request.max_content_length = request.max_form_memory_size = limit
    if "chunked" in environ.get("HTTP_TRANSFER_ENCODING", "").lower():
        if request_note.request_method(environ) != "POST":
            return
        # Werkzeug would stop reading at the limit without a word, and the form would be cut short.
        body = read_chunked(environ["wsgi.input"], limit + 1)
        if len(body) > limit:
            raise PayloadTooLarge(body_limit_sentence(limit))
        environ["wsgi.input"] = io.BytesIO(body)
    elif environ.get("CONTENT_LENGTH") and (request.content_length or 0) > limit:
        raise PayloadTooLarge(body_limit_sentence(limit))


def read_chunked(stream, size):
    """Up to size bytes of a chunked body, fewer only where it ends; BadRequest when the server
    cannot parse it (gunicorn's and gevent's parsers raise errors of their own, with no common
    class but Exception)."""
    pieces, left = [], size
    try:
        while left > 0 and (piece := stream.read(min(left, 4096))):
            pieces.append(piece)
            left -= len(piece)
            # A body of one-byte chunks costs the parser far more than its size: let others run.
            time.sleep(0)
    except Exception as error:
        log.info("A chunked request body could not be read: %s", error)
        raise BadRequest("The chunked request body is malformed or was cut short.") from None
    return b"".join(pieces)


def body_limit_sentence(limit):
    return f"The request body is larger than the {limit} bytes this service accepts."
