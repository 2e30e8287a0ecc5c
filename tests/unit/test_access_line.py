"""The text access line (gunicorn.conf.py's AccessAtoms): the line gunicorn's own atoms would give,
escaped one line per request, whatever access_log_format names, with the fields made only as the
line reads them. The live suites read the served line (tests/live/test_server.py, tests/live/test_edges.py)."""

import datetime
import runpy

import pytest
from gunicorn.glogging import Logger
from liveserver import ROOT

from ops import logs

conf = runpy.run_path(str(ROOT / "gunicorn.conf.py"))
AccessAtoms = conf["AccessAtoms"]

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
