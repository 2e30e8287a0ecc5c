"""What the logs never hold: the token of a mailed link in a request's path, whichever line writes
the path (the access line in text or JSON, an error's line), while MAIL_URL=console's mail lines
keep their links whole. The live suite reads a served log (tests/live/test_email_address.py). And
the text access line written straight to its streams: the line logging would write, or logging."""

import logging

import pytest

from ops import logs

TOKEN = "p35RUWdmc33HkH6hnXICtPHkvszEJ0uFA4n8sojl-eo"


@pytest.mark.parametrize("path", logs.MAILED_LINK_PATHS)
@pytest.mark.parametrize("line, redacted", [
    ('10.0.0.1 "GET {path}{token} HTTP/1.1" 200 1234 3ms abc',
     '10.0.0.1 "GET {path}[redacted] HTTP/1.1" 200 1234 3ms abc'),
    ("{path}{token}", "{path}[redacted]"),
    ("Unhandled error on POST {path}{token}", "Unhandled error on POST {path}[redacted]"),
    ("GET /{path}{token}/more?next=1", "GET /{path}[redacted]?next=1"),
    ("/login?next={path}{token}", "/login?next={path}[redacted]"),
    ("/login?next={encoded}{token}&email=a%40b.example", "/login?next={encoded}[redacted]&email=a%40b.example"),
    ("Invalid request line: 'GET {path}{token} HTTP/9'", "Invalid request line: 'GET {path}[redacted] HTTP/9'"),
])
def test_a_mailed_links_token_never_reaches_a_line(path, line, redacted):
    encoded = path.replace("/", "%2F")
    assert logs.redact(line.format(path=path, encoded=encoded, token=TOKEN)) == redacted.format(path=path,
                                                                                              encoded=encoded)
    upper = line.format(path=path.upper(), encoded=encoded.lower(), token=TOKEN)
    assert TOKEN not in logs.redact(upper)


@pytest.mark.parametrize("text", [
    "Mail to bob@example.com | https://api.example.com/email/verify/{token}",
    "Mail to bob@example.com | http://127.0.0.1:8000/email/change/{token}",
    "Mail to bob@example.com | http://[::1]:8000/password/reset/{token}",
    "Mail to bob@example.com | http://localhost/email/verify/{token}",
])
def test_console_mails_keep_their_links(text):
    # A token with no run of 32 letters and digits: such a run is redacted anywhere as a key's body
    # may be (SECRET), links included.
    text = text.format(token="p35RUWdmc33HkH6hnXICtPH-kvszEJ0uFA4n8sojl_eo")
    assert logs.redact(text) == text


@pytest.mark.parametrize("path", ["/email/verify/", "/email/change", "/email/verified/x", "/api/v1/status"])
def test_other_paths_are_left_alone(path):
    assert logs.redact(path) == path


def test_the_filter_redacts_a_record_s_arguments():
    logger = logging.getLogger("tests.logs")
    seen = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    logger.addHandler(handler)
    logs.prepare_handlers(logger, "text")
    try:
        logger.warning("GET %s %s", "/email/verify/" + TOKEN, 200)
    finally:
        logger.removeHandler(handler)
    assert seen == ["GET /email/verify/[redacted] 200"]


def plain_logger(name, stream):
    """A logger set up as gunicorn's text access log: its message alone, this module's filters."""
    logger = logging.getLogger(f"tests.access.{name}")
    logger.handlers.clear()
    logger.filters.clear()
    logger.propagate = False
    logger.setLevel(logging.INFO)
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    logs.prepare_handlers(logger, "text")
    return logger


class Atoms(dict):
    """A mapping for the line's % format, as AccessAtoms is."""


def test_a_line_written_directly_is_the_one_logging_writes():
    import io

    fmt = '%(h)s "%(m)s %(U)s %(H)s" %(s)s'
    atoms = Atoms(h=f"sk_live_{'k' * 40}", m="GET", U=f"/password/reset/{TOKEN}", H="HTTP/1.1", s="200")
    through_logging, direct = io.StringIO(), io.StringIO()
    plain_logger("logging", through_logging).info(fmt, atoms)
    handlers = logs.direct_writes(plain_logger("direct", direct))
    assert handlers is not None
    logs.write_line(handlers, fmt % atoms)
    assert direct.getvalue() == through_logging.getvalue() == (
        'sk_live_[redacted] "GET /password/reset/[redacted] HTTP/1.1" 200\n')


@pytest.mark.parametrize("change", ["json", "foreign filter", "propagate", "other handler", "level", "logger filter"])
def test_a_logger_that_would_do_more_with_a_record_is_written_through_logging(change):
    import io
    import logging.handlers

    logger = plain_logger(change.replace(" ", "-"), io.StringIO())
    handler = logger.handlers[0]
    if change == "json":
        logs.prepare_handlers(logger, "json")
    elif change == "foreign filter":
        handler.addFilter(logging.Filter("elsewhere"))
    elif change == "propagate":
        logger.propagate = True
    elif change == "other handler":
        logger.addHandler(logging.handlers.MemoryHandler(10))
    elif change == "level":
        handler.setLevel(logging.WARNING)
    else:
        logger.addFilter(logging.Filter("elsewhere"))
    assert logs.direct_writes(logger) is None


def test_gunicorns_access_log_as_the_service_sets_it_up_is_written_directly():
    """A change to gunicorn's set-up that turned the direct writes off would go unseen otherwise."""
    from gunicorn.config import Config
    from loggers import gunicorn_handlers_alone

    from serving.accesslog import ServiceLogger

    config = Config()
    config.set("accesslog", "-")
    service_logger = ServiceLogger(config)
    with gunicorn_handlers_alone(service_logger) as access_log:
        assert logs.direct_writes(access_log) == access_log.handlers != []
