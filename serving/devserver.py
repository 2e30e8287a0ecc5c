"""`python app.py` where gunicorn cannot run (Windows): the app in this one process under gevent's WSGI
server, with what gunicorn and gunicorn.conf.py give the gevent worker.

- A body refused as too large (413), or any chunked one, is not read to its end before the next
  request: the connection closes after a short linger, as gunicorn.conf.py's post_request does.
- A request's head arrives within KEEPALIVE_SECONDS and within gunicorn's size limits, or the
  connection is closed or refused (414, 431, 400) in the contract's JSON error shape, with the API's
  headers and a request id, as gunicorn.conf.py's write_json_error answers.
- The access log in gunicorn.conf.py's access_log_format (or with LOG_FORMAT=json its JSON object),
  secrets redacted; a yield after each request, as its post_request.
- WebSockets run through ws/wsserver.py as under gunicorn (outbox bounds, stall timeout), with the same
  socket caps; a connection that became a WebSocket ends with it.
- SIGINT (Ctrl-C), SIGTERM and, on Windows, SIGBREAK (Ctrl-Break) stop gracefully: no new
  connections, open sockets closed with 1001, requests under way finished (GRACEFUL_SECONDS at
  most), and the pending usage counts written.

It reaches into gevent.pywsgi.WSGIHandler's hooks (`read_requestline`, `read_request`,
`MessageClass`, `handle_one_request`, `handle_one_response`, `_handle_client_error`,
`_send_error_response_if_possible`, `handle_error`, `log_request`, `run_application`) and its
input's `_discard`;
tests/live/test_devserver.py fails if a new version of gevent moves them.
"""

import io
import json
import logging
import os
import re
import signal
import socket
import sys

import gevent
import gevent.event
from gevent import pywsgi
from gevent.pool import Pool
from werkzeug.exceptions import default_exceptions

import sockets
from ops import logs, metrics, services
from serving import lingering, startup, warmup

log = logging.getLogger(__name__)
access_log = logging.getLogger(f"{__name__}.access")
# LOG_FORMAT=json makes each access line gunicorn.conf.py's JSON object; set by prepare_access_log.
access_json = False

# gunicorn.conf.py's settings and serving/accesslog.py's format (which imports gunicorn, as this
# module may not), kept equal to these by tests/live/test_devserver.py.
KEEPALIVE_SECONDS = 5
GRACEFUL_SECONDS = 20
WORKER_CONNECTIONS = 10_000
ACCESS_LOG_FORMAT = '%(h)s "%(m)s %(U)s %(H)s" %(s)s %(b)s %(M)sms %({x-request-id}o)s'
# gunicorn's defaults, which its gevent worker enforces on every request.
LIMIT_REQUEST_LINE = 4094
LIMIT_REQUEST_FIELDS = 100
LIMIT_REQUEST_FIELD_SIZE = 8190

STOP_SIGNALS = ("SIGINT", "SIGTERM", "SIGBREAK")
TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
# As gunicorn: control characters other than the tab are refused in a header's value, and anything
# but visible ASCII in the request target.
INVALID_IN_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
INVALID_IN_TARGET = re.compile(r"[^\x21-\x7e]")
CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f-\x9f]")
DIGITS = re.compile(r"[0-9]+")
# The server's own answers, in gunicorn.conf.py's words: (reason phrase, error code).
REFUSALS = {
    400: ("Bad Request", "bad_request"),
    414: ("URI Too Long", "uri_too_long"),
    431: ("Request Header Fields Too Large", "request_header_fields_too_large"),
    500: ("Internal Server Error", "internal_error"),
}


class Refusal(ValueError):
    """A request the server answers itself, as gunicorn would: an HTTP status and why (never a
    quote of the request, which may carry a key)."""

    def __init__(self, status, detail):
        super().__init__(detail)
        self.status = status
        self.detail = detail


def refusal_headers(status, request_id, body):
    return [("Content-Type", "application/json"), ("Cache-Control", "no-store"),
            ("X-Content-Type-Options", "nosniff"), (logs.REQUEST_ID_HEADER, request_id),
            ("Content-Length", str(len(body))), ("Connection", "close")]


def refusal_body(status):
    """The contract's JSON error for a status the server answers itself."""
    error = {"code": REFUSALS[status][1], "message": default_exceptions[status].description}
    return json.dumps({"error": error}, separators=(",", ":")).encode()


def raw_refusal(status, request_id):
    """A whole response (status line, headers, body) for a request the app never saw."""
    body = refusal_body(status)
    head = "".join(f"{name}: {value}\r\n" for name, value in refusal_headers(status, request_id, body))
    return f"HTTP/1.1 {status} {REFUSALS[status][0]}\r\n{head}\r\n".encode("latin-1") + body


def printable(text):
    """Text with its control characters escaped, so that one request stays one log line."""
    return CONTROL_CHARACTERS.sub(lambda match: f"\\x{ord(match[0]):02x}", text)


class Handler(pywsgi.WSGIHandler):
    """gevent's handler of one connection, holding each request to what the gevent worker allows."""

    refused = False

    def read_requestline(self):
        if self.server.stopping:
            return ""
        # Like gunicorn's keepalive, the deadline covers the whole head, not each read.
        self.head_deadline = gevent.Timeout.start_new(KEEPALIVE_SECONDS, socket.timeout("The head took too long."))
        self.server.waiting[self] = gevent.getcurrent()
        return self.rfile.readline(LIMIT_REQUEST_LINE + 3).decode("latin-1")

    def read_request(self, raw_requestline):
        try:
            line = raw_requestline.rstrip("\r\n")
            if len(line) > LIMIT_REQUEST_LINE:
                raise Refusal(414, f"the request line is longer than {LIMIT_REQUEST_LINE} bytes")
            if not raw_requestline.endswith("\n"):
                raise ConnectionAbortedError("The client closed the connection inside the request line.")
            parsed = super().read_request(raw_requestline)
            if not TOKEN.fullmatch(self.command) or INVALID_IN_TARGET.search(self.path):
                raise Refusal(400, "the method or the target holds characters HTTP does not allow")
            return parsed
        finally:
            self.stop_waiting()

    def MessageClass(self, rfile, *args):
        """Read the headers within gunicorn's limits, refusing what gunicorn refuses."""
        lines = []
        while (line := rfile.readline(LIMIT_REQUEST_FIELD_SIZE + 3)) not in (b"\r\n", b"\n"):
            if not line.endswith(b"\n"):
                if len(line) <= LIMIT_REQUEST_FIELD_SIZE:
                    raise ConnectionAbortedError("The client closed the connection inside the head.")
                raise Refusal(431, f"a header is longer than {LIMIT_REQUEST_FIELD_SIZE} bytes")
            if len(lines) == LIMIT_REQUEST_FIELDS:
                raise Refusal(431, f"more than {LIMIT_REQUEST_FIELDS} headers")
            name, colon, value = line.rstrip(b"\r\n").decode("latin-1").partition(":")
            # A line folded onto the one before (obs-fold) starts with a space: no token, refused.
            if not colon or not TOKEN.fullmatch(name) or INVALID_IN_VALUE.search(value):
                raise Refusal(400, "a header is malformed or holds control characters")
            lines.append(line)
        headers = pywsgi.headers_factory(io.BytesIO(b"".join(lines) + b"\r\n"))
        lengths = headers.get_all("Content-Length") or []
        if len(lengths) > 1 or (lengths and not DIGITS.fullmatch(lengths[0].strip())):
            raise Refusal(400, "Content-Length is repeated or not a number")
        encoding = headers.get("Transfer-Encoding")
        if encoding is not None and (lengths or encoding.strip().lower() != "chunked"):
            raise Refusal(400, "Transfer-Encoding is not chunked alone")
        return headers

    def stop_waiting(self):
        self.server.waiting.pop(self, None)
        deadline = self.__dict__.pop("head_deadline", None)
        if deadline is not None:
            deadline.close()

    def handle(self):
        try:
            super().handle()
        except OSError:
            pass  # the client went away while its refusal was being sent
        finally:
            self.stop_waiting()

    def handle_one_request(self):
        result = super().handle_one_request()
        if isinstance(result, tuple):
            self.refused = True
            logs.end_request()
        return result

    def _handle_client_error(self, ex):
        """Answer a request that cannot be served in JSON; close without a word on a client that
        went away or took too long over its head (as gunicorn does)."""
        if isinstance(ex, OSError) and not isinstance(ex, pywsgi._InvalidClientInput):
            return None
        status = ex.status if isinstance(ex, Refusal) else 400
        detail = ex.detail if isinstance(ex, Refusal) else "the request is malformed"
        request_id = logs.current_request_id.get() or logs.request_id_for(None)
        logs.current_request_id.set(request_id)
        log.warning("Invalid request from %s: %s (%d)", self.client_address[0], detail, status)
        return status, raw_refusal(status, request_id)

    def _send_error_response_if_possible(self, error_code):
        if self.response_length:
            self.close_connection = True
            return
        body = refusal_body(error_code)
        request_id = logs.current_request_id.get() or logs.request_id_for(None)
        try:
            self.start_response(f"{error_code} {REFUSALS[error_code][0]}",
                                refusal_headers(error_code, request_id, body))
            self.write(body)
        except OSError:
            self.close_connection = True

    def handle_error(self, t, v, tb):
        # Through logging, so the traceback is redacted like every other line.
        if not issubclass(t, gevent.GreenletExit):
            log.error("Error while serving %s %s", self.command, printable(self.environ.get("PATH_INFO", "-")),
                      exc_info=(t, v, tb))
        self._send_error_response_if_possible(500)

    def handle_one_response(self):
        try:
            super().handle_one_response()
            if self.status is None and self.environ.get("HTTP_UPGRADE", "").lower() == "websocket":
                # flask-sock returns no response once a WebSocket is over: the connection ends with
                # it, as under gunicorn, where it raises StopIteration.
                self.close_connection = True
        finally:
            logs.end_request()
        # gunicorn.conf.py's post_request: gevent reads without yielding when the next request is
        # already waiting, so a pipelining client would otherwise hold the process.
        gevent.sleep(0)

    def run_application(self):
        """After a body refused as too large, or any chunked one, linger briefly and close, as
        gunicorn.conf.py's post_request does: pywsgi would read whatever the app left of the body
        before the next request, however long."""
        try:
            super().run_application()
        finally:
            # The envelope has let go of the request: what pywsgi logs and answers after the app
            # (an error, a refused body) keeps the request's id.
            logs.current_request_id.set(logs.request_id_of(self.environ))
        if self.code == 413 or self.environ.get("HTTP_TRANSFER_ENCODING"):
            lingering.linger(self.wsgi_input)
            self.close_connection = True
            # pywsgi's _discard leaves a body alone once it is marked as in an unknown state.
            self.wsgi_input._chunked_input_error = True

    def log_request(self):
        environ = self.environ
        if self.refused:
            return
        if self.status is None:
            if environ.get("HTTP_UPGRADE", "").lower() == "websocket":
                metrics.count(environ, 101, None)
            return
        seconds = self.time_finish - self.time_start
        headers = dict(self.response_headers or ())
        request_id = headers.get(logs.REQUEST_ID_HEADER.encode(), b"-").decode("latin-1")
        write_access_line(environ, abs(self.code), self.body_length(), seconds, request_id)

    def body_length(self):
        """Bytes of the body sent (as gunicorn counts them: the head left out), or None."""
        if not self.headers_sent:
            return None
        head = len(b"HTTP/1.1 \r\n\r\n") + len(self.status) + sum(
            len(name) + len(value) + 4 for name, value in self.response_headers)
        return max(0, self.response_length - head)


def write_access_line(environ, status, sent, seconds, request_id):
    """One access-log line: text in gunicorn.conf.py's access_log_format, or its JSON object."""
    method = logs.redact(printable(environ.get("REQUEST_METHOD", "-")))
    path = logs.redact(printable(environ.get("PATH_INFO", "-")))
    remote_addr = logs.redact(printable(environ.get("REMOTE_ADDR") or "-"))
    if access_json:
        access_log.info("%s %s %s", method, path, status, extra={
            "request_id": request_id, "method": method, "path": path, "status": status,
            "duration_ms": round(seconds * 1000, 3), "bytes": sent, "remote_addr": remote_addr})
        return
    access_log.info(ACCESS_LOG_FORMAT, {
        "h": remote_addr, "m": method, "U": path, "H": printable(environ.get("SERVER_PROTOCOL", "-")),
        "s": status, "b": "-" if sent is None else sent, "M": int(seconds * 1000),
        "{x-request-id}o": request_id})


def prepare_access_log(log_format):
    """Access lines go to stdout as gunicorn's do: bare text lines, or JSON objects."""
    global access_json
    access_json = log_format == "json"
    access_log.handlers.clear()
    access_log.addHandler(logging.StreamHandler(sys.stdout))
    access_log.setLevel(logging.INFO)
    access_log.propagate = False
    logs.prepare_handlers(access_log, log_format, logging.Formatter("%(message)s"))


class Server(pywsgi.WSGIServer):
    """gevent's WSGI server with Handler, the gevent worker's connection cap and a graceful stop."""

    handler_class = Handler

    def __init__(self, address, app):
        super().__init__(address, app, spawn=Pool(WORKER_CONNECTIONS), log=None, error_log=log)
        # Handlers waiting for a request's head (the next one, on a kept-alive connection): a stop
        # ends them at once rather than after their KEEPALIVE_SECONDS.
        self.waiting = {}
        self.stopping = False

    def handle(self, sock, address):
        # As gunicorn does: without TCP_NODELAY, a response written in two sends on a kept-alive
        # connection waits for the client's delayed ACK, ~40 ms a request.
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass  # not a TCP socket
        super().handle(sock, address)

    def stop_gracefully(self):
        """Stop accepting, close open sockets with 1001, end idle connections, and give the requests
        under way GRACEFUL_SECONDS to finish before they are cut."""
        self.stopping = True
        self.close()
        sockets.close_all_sockets()
        for greenlet in list(self.waiting.values()):
            greenlet.kill(block=False)
        self.pool.join(timeout=GRACEFUL_SECONDS)
        if self.pool:
            log.warning("%d connections still busy after %d s; cutting them.", len(self.pool), GRACEFUL_SECONDS)
            self.pool.kill(block=True, timeout=1)


def serve(app, host, port, reason):
    """Serve the app at host:port in this process until a stop signal; then stop gracefully and
    write the pending usage counts."""
    prepare_access_log(app.config["LOG_FORMAT"])
    server = Server((host, port), app)
    try:
        server.start()
    except OSError as error:
        raise SystemExit(startup.cannot_listen(host, port, error)) from None
    stop = gevent.event.Event()

    def request_stop(signum, frame):
        # May run in gevent's hub, which must not block: the main greenlet does the stopping.
        log.info("Stopping on signal %d: finishing requests, closing sockets with 1001.", signum)
        stop.set()

    # SIGQUIT, SIGHUP and the other POSIX-only signals keep their default: Windows has none of them,
    # and gunicorn's meanings for them (reload, quick exit) have no use in one process.
    for name in STOP_SIGNALS:
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), request_stop)
    log.info("gunicorn is not available (%s): serving with gevent's WSGI server, one process, on http://%s:%d "
             "(pid %d)", reason, host, port, os.getpid())
    warning = startup.secret_key_warning(os.environ, workers=1)
    if warning:
        log.warning(warning)
    # As gunicorn.conf.py's post_worker_init.
    warmup.freeze_heap()
    services.start(app)
    stop.wait()
    server.stop_gracefully()
    services.stop(app)
    startup.ignore_stop_signals()
    log.info("Stopped; usage counts written.")
