"""The text access line (serving/accesslog.py's AccessAtoms): the line gunicorn's own atoms would give,
escaped one line per request, whatever access_log_format names, with the fields made only as the
line reads them. The live suites read the served line (tests/live/test_server.py, tests/live/test_edges.py)."""

import datetime
import runpy

import pytest
from gunicorn.glogging import Logger
from liveserver import ROOT
from loggers import gunicorn_handlers_alone

from ops import logs
from serving.accesslog import AccessAtoms, ServiceLogger, service_line, shown

conf = runpy.run_path(str(ROOT / "gunicorn.conf.py"))

FORMATS = [
    conf["access_log_format"],
    # gunicorn's default, and one naming a request header, an environ entry and the other fields.
    '%(h)s %(l)s %(u)s "%(r)s" %(s)s %(b)s "%(f)s" "%(a)s"',
    "%(U)s %(q)s %(B)s %(T)s %(D)s %(L)s %(p)s %({User-Agent}i)s %({X-REQUEST-ID}o)s %({remote_addr}e)s %(nothing)s",
]


class Response:
    status = "200 OK"
    sent = 38
    headers = [("Content-Type", "application/json"), ("X-Request-ID", "first"), ("x-request-id", "abc123")]


class Request:
    headers = [("USER-AGENT", 'curl "8"\x1b[31m'), ("X-API-KEY", "sk_test_" + "k" * 40)]


ENVIRON = {"REMOTE_ADDR": "127.0.0.1", "REQUEST_METHOD": "GET", "RAW_URI": "/api/v1/status?x=1",
           "PATH_INFO": '/api/v1/a\nb\\c"d', "QUERY_STRING": "x=1", "SERVER_PROTOCOL": "HTTP/1.1",
           "HTTP_USER_AGENT": 'curl "8"\x1b[31m'}


def stock_line(access_format, logger, environ, request_time):
    """What the line was with gunicorn's atoms(): a missing field "-", header names in any case,
    control characters and double quotes escaped."""
    atoms = Logger.atoms(logger, Response(), Request(), environ, request_time)

    class Escaped(dict):
        def __getitem__(self, name):
            value = atoms.get(name.lower() if name.startswith("{") else name, "-")
            if not isinstance(value, str):
                return value
            return logs.escape_controls(value).replace('"', '\\"')

    return access_format % Escaped()


@pytest.mark.parametrize("access_format", FORMATS)
@pytest.mark.parametrize("environ", [ENVIRON, {"PATH_INFO": "/", "RAW_URI": "/", "REQUEST_METHOD": "HEAD",
                                               "SERVER_PROTOCOL": "HTTP/1.0"}])
def test_the_line_is_the_one_gunicorn_s_own_atoms_give(access_format, environ):
    logger = Logger.__new__(Logger)  # atoms() needs no set-up
    request_time = datetime.timedelta(seconds=2, microseconds=345_678)
    line = access_format % AccessAtoms(logger, Response(), Request(), environ, request_time)
    assert line == stock_line(access_format, logger, environ, request_time)
    assert "\n" not in line and "\x1b" not in line


def test_the_service_s_line_reads_no_field_gunicorn_would_build_them_all_for(monkeypatch):
    def every_field(*args):
        raise AssertionError("the service's line built all of gunicorn's atoms")

    monkeypatch.setattr(Logger, "atoms", every_field)
    atoms = AccessAtoms(Logger.__new__(Logger), Response(), Request(), ENVIRON, datetime.timedelta(milliseconds=7))
    assert conf["access_log_format"] % atoms == (
        '127.0.0.1 "GET /api/v1/a\\x0ab\\\\c\\"d HTTP/1.1" 200 38 7ms abc123')


TOKEN = "Zx9" * 12
# Fields a client writes, each with what the logs must not show or must escape.
HOSTILE = [
    "127.0.0.1", "GET", "HTTP/1.1", "-", None, "/api/v1/protected/test", f"/api/v1/sk_live_{'k' * 40}",
    f"/{'a1' * 20}", "/" + "f" * 32, f"/password/reset/{TOKEN}", f"/Email/Verify/{TOKEN}?x", f"/x/invitations/{TOKEN}",
    f"/login%2Finvitations%2F{TOKEN}", 'a"b\\c\nd\x1b[31m', "sk_test_", f"SK_TEST_{'Q' * 10}", "é\u2028",
]


class KeyedResponse(Response):
    def __init__(self, status, sent, request_id):
        self.status, self.sent = status, sent
        self.headers = [("Content-Type", "application/json")] + ([("X-Request-ID", request_id)] if request_id else [])


@pytest.mark.parametrize("address", ["127.0.0.1", HOSTILE[6]])
@pytest.mark.parametrize("method", ["GET", None, 'P"\\'])
@pytest.mark.parametrize("path", HOSTILE + [HOSTILE[6].encode(), 5])
@pytest.mark.parametrize("request_id", [None, "0" * 32, HOSTILE[13]])
def test_the_service_s_own_line_is_its_atoms_line_redacted(address, method, path, request_id):
    """service_line, which ServiceLogger writes for the service's own format, redacts field by field:
    it must give exactly the line that AccessAtoms and write_line's pass over the whole line give."""
    environ = {"REMOTE_ADDR": address, "REQUEST_METHOD": method, "PATH_INFO": path, "SERVER_PROTOCOL": "HTTP/1.1"}
    for status in ("200 OK", 101, f"{HOSTILE[6][5:]} OK", '2"0\n0 OK'):
        resp = KeyedResponse(status, 38 if status != 101 else None, request_id)
        request_time = datetime.timedelta(seconds=1, microseconds=2_999)
        expected = logs.redact(conf["access_log_format"] % AccessAtoms(Logger.__new__(Logger), resp, Request(),
                                                                       environ, request_time))
        assert service_line(resp, environ, request_time) == expected


def service_logger(access_format, accesslog="-"):
    from gunicorn.config import Config

    config = Config()
    config.set("accesslog", accesslog)
    config.set("access_log_format", access_format)
    return ServiceLogger(config)


SERVED = dict(ENVIRON, PATH_INFO=f"/password/reset/{TOKEN}")


def test_the_service_s_logger_writes_its_own_format_field_by_field_and_any_other_through_the_atoms(monkeypatch):
    import io

    def served(access_format):
        made = service_logger(access_format)
        with gunicorn_handlers_alone(made) as access_log:
            stream = io.StringIO()
            access_log.handlers[0].setStream(stream)
            made.access(KeyedResponse("200 OK", 38, "abc"), Request(), SERVED, datetime.timedelta(0))
        return stream.getvalue()

    made_by_fields = []
    monkeypatch.setitem(service_line.__globals__, "shown",
                        lambda value: made_by_fields.append(value) or shown(value))
    assert served(conf["access_log_format"]) == '127.0.0.1 "GET /password/reset/[redacted] HTTP/1.1" 200 38 0ms abc\n'
    assert made_by_fields
    made_by_fields.clear()
    assert served("%(U)s %(s)s") == "/password/reset/[redacted] 200\n"
    assert not made_by_fields


def test_a_log_file_that_failed_to_reopen_gets_the_next_lines_all_the_same(tmp_path):
    """gunicorn's reopen_files (USR1) leaves a file it could not open without a stream; logging's
    own write opens it again, so the line must go that way rather than be lost."""
    path = tmp_path / "access.log"
    made = service_logger(conf["access_log_format"], str(path))
    with gunicorn_handlers_alone(made) as access_log:
        [handler] = access_log.handlers
        handler.close()
        handler.stream = None
        made.access(KeyedResponse("200 OK", 38, "abc"), Request(), SERVED, datetime.timedelta(0))
        handler.close()
    assert path.read_text() == '127.0.0.1 "GET /password/reset/[redacted] HTTP/1.1" 200 38 0ms abc\n'
