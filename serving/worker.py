"""gunicorn's gevent worker (gunicorn.conf.py's `worker_class`), writing each response's head
together with its first body bytes, straight to the socket.

gunicorn sends a response's head alone and then its body: two `sendall` calls, two system calls
and, for a small JSON answer, two packets; gevent's `sendall` also asks the kernel for the socket's
buffer size each time, and gunicorn formats the Date header anew for every response. Sending the
head with the body made a served keyed request about 6 % faster (docs/bench/hot-path.md). It also
checks each response header's name once rather than at every response, and keeps gunicorn's
settings once read (KeptConfig).
gunicorn lets a protocol bring its own response class to `wsgi.create`, but its worker does not
pass one, so `Worker.handle_async_request` is gunicorn's own with that one argument
added; tests/unit/serving/test_worker.py fails when a new gunicorn changes what these copies were
made from."""

import functools
import inspect
import socket
import sys
import time
import types
from datetime import datetime

import gevent
import gevent.socket
from gunicorn import util
from gunicorn.config import Config
from gunicorn.http import wsgi
from gunicorn.http.message import TOKEN_RE
from gunicorn.workers.ggevent import GeventWorker

from serving import patching

# Header names, each with whether gunicorn's checks take it as a plain header: a token, neither
# Content-Length nor hop-by-hop. Names come from the app's code, not from clients: a few dozen.
plain_header_names = {}
PLAIN_HEADER_NAMES_KEPT = 256


@functools.lru_cache(maxsize=1)
def http_date(second):
    return util.http_date(second)


class Response(wsgi.Response):
    """gunicorn's response, holding its head until the first body bytes (or the end) to send both
    in one write. A file sent with sendfile gets its head first, as gunicorn sends it."""

    holds_head = True
    held_head = b""
    # A larger first part is sent after the head rather than copied behind it.
    JOINED_BODY_LIMIT = 65536

    def process_headers(self, headers):
        """gunicorn's checks, with each name's checked once rather than at every response (a keyed
        answer has ten headers: 8.2 us of gunicorn's checks, 3.8 us this way). A value is checked
        every time; any header not plainly valid goes through gunicorn's own code, for its errors and
        its handling of Content-Length and hop-by-hop headers."""
        for name, value in headers:
            plain = plain_header_names.get(name) if type(name) is str else False
            if plain is None:
                plain = is_plain_header_name(name)
                if len(plain_header_names) < PLAIN_HEADER_NAMES_KEPT:
                    plain_header_names[name] = plain
            if plain and type(value) is str and wsgi.HEADER_VALUE_RE.fullmatch(value):
                self.headers.append((name, value.strip(" \t")))
            else:
                super().process_headers(((name, value),))

    def default_headers(self):
        """gunicorn's, with the Date header made once a second."""
        if self.upgrade:
            connection = "upgrade"
        elif self.should_close():
            connection = "close"
        else:
            connection = "keep-alive"
        headers = [
            "HTTP/%s.%s %s\r\n" % (self.req.version[0], self.req.version[1], self.status),
            "Server: %s\r\n" % self.version,
            "Date: %s\r\n" % http_date(int(time.time())),
            "Connection: %s\r\n" % connection,
        ]
        if self.chunked:
            headers.append("Transfer-Encoding: chunked\r\n")
        return headers

    def send_headers(self):
        if not self.holds_head:
            self.send_held_head()
            return super().send_headers()
        if self.headers_sent:
            return
        head = self.default_headers()
        # A list made at once, not a generator: 1.4 us for a keyed answer's head, not 3.2.
        head += [f"{name}: {value}\r\n" for name, value in self.headers]
        head.append("\r\n")
        self.held_head = "".join(head).encode("latin-1")
        self.headers_sent = True

    def send_held_head(self):
        if self.held_head:
            head, self.held_head = self.held_head, b""
            self.send(head)

    def write(self, arg):
        super().write(arg)
        # gunicorn's write() sends no body for a HEAD or 204/304 answer, nor an empty chunk: the
        # head goes now, as gunicorn's would (an app may push its head out with an empty part).
        self.send_held_head()

    def _emit_body(self, data):
        if self.chunked:
            self.send_held_head()
            super()._emit_body(data)
            return
        if self.held_head and len(data) <= self.JOINED_BODY_LIMIT:
            data, self.held_head = self.held_head + data, b""
        self.send_held_head()
        self.send(data)

    def send(self, data):
        """Write all of data: first with the real socket's own send, which takes a response
        that fits the kernel's buffer whole and never waits, then gevent's sendall for the rest.
        Not under TLS (gunicorn's --certfile), where the bytes must go through the SSL object."""
        sent = 0
        if type(self.sock) is gevent.socket.socket:
            try:
                sent = self.sock._sock.send(data)
            except BlockingIOError:
                pass
        if sent < len(data):
            util.write(self.sock, memoryview(data)[sent:] if sent else data)

    def sendfile(self, respiter):
        # sendfile writes its head, then the file, straight to the socket.
        self.holds_head = False
        return super().sendfile(respiter)

    def close(self):
        self.send_headers()
        self.send_held_head()
        super().close()


def is_plain_header_name(name):
    return TOKEN_RE.fullmatch(name) is not None and name.lower() != "content-length" and not util.is_hoppish(name)


class KeptConfig(Config):
    """gunicorn's settings, each kept as an attribute once read. gunicorn reads about 20 of them
    for every request (15 to parse one, 18 with the environ and the response), each through
    Config.__getattr__ and its setting's get(): 0.85 us a read. Settings are set in the master
    before the worker is forked, never after."""

    def __getattr__(self, name):
        value = super().__getattr__(name)
        self.__dict__[name] = value
        return value

    @classmethod
    def of(cls, cfg):
        kept = cls.__new__(cls)
        kept.__dict__.update(vars(cfg))
        return kept


class Worker(GeventWorker):
    """gunicorn's gevent worker, serving with the Response above and its settings kept once read."""

    def init_process(self):
        # In the worker, after the fork: the master's settings are its own to change on a reload.
        self.cfg = KeptConfig.of(self.cfg)
        super().init_process()

    def patch(self):
        """GeventWorker.patch of gunicorn 27.0.1, with gevent's patch reading the installed entry
        points once (serving/patching.py): the listening sockets wrapped as gevent's."""
        patching.patch_all()
        self.sockets = [gevent.socket.socket(listener.FAMILY, socket.SOCK_STREAM, fileno=listener.sock.detach())
                        for listener in self.sockets]

    def load_wsgi(self):
        super().load_wsgi()
        # An app object (Flask's) called through its bound __call__ runs in the worker's C frame
        # rather than in a new one, which each open WebSocket would keep on its saved stack.
        python_call = isinstance(inspect.getattr_static(type(self.wsgi), "__call__", None), types.FunctionType)
        self.call_app = self.wsgi.__call__ if python_call else self.wsgi

    def handle_request(self, listener_name, req, sock, addr):
        # GeventWorker.handle_request: a request's greenlet killed or timed out ends quietly.
        try:
            return self.handle_async_request(listener_name, req, sock, addr)
        except (gevent.GreenletExit, SystemExit):
            pass

    def handle_async_request(self, listener_name, req, sock, addr):
        """AsyncWorker.handle_request of gunicorn 27.0.1, with response_class=Response and the app
        called as call_app."""
        request_start = datetime.now()
        environ = {}
        resp = None
        try:
            self.cfg.pre_request(self, req)
            resp, environ = wsgi.create(req, sock, addr, listener_name, self.cfg, response_class=Response)
            environ["wsgi.multithread"] = True
            self.nr += 1
            if self.nr >= self.max_requests:
                if self.alive:
                    self.log.info("Autorestarting worker after current request.")
                    self.alive = False

            if not self.alive or not self.cfg.keepalive:
                resp.force_close()

            respiter = self.call_app(environ, resp.start_response)
            if self.is_already_handled(respiter):
                return False
            try:
                if isinstance(respiter, environ['wsgi.file_wrapper']):
                    resp.write_file(respiter)
                else:
                    for item in respiter:
                        resp.write(item)
                resp.close()
            finally:
                request_time = datetime.now() - request_start
                self.log.access(resp, req, environ, request_time)
                if hasattr(respiter, "close"):
                    respiter.close()
            if resp.should_close():
                raise StopIteration()
        except StopIteration:
            raise
        except OSError:
            util.reraise(*sys.exc_info())
        except (Exception, SystemExit):
            if resp and resp.held_head:
                # The answer failed before any of it reached the client: gunicorn's 500 (or, for a
                # timed-out request, its silence) takes its place.
                resp.held_head = b""
                resp.headers_sent = False
            if resp and resp.headers_sent:
                # A head already sent: a 500 written now would corrupt the answer.
                self.log.exception("Error handling request")
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                    sock.close()
                except OSError:
                    pass
                raise StopIteration() from None
            raise
        finally:
            try:
                self.cfg.post_request(self, req, environ, resp)
            except Exception:
                self.log.exception("Exception in post_request hook")
        return True
