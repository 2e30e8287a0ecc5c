"""What the logs never hold: the token of a mailed link in a request's path, whichever line writes
the path (the access line in text or JSON, an error's line), while MAIL_URL=console's mail lines
keep their links whole. The live suite reads a served log (tests/live/test_email_address.py)."""

import logging

import pytest

from ops import logs

TOKEN = "p35RUWdmc33HkH6hnXICtPHkvszEJ0uFA4n8sojl-eo"


@pytest.mark.parametrize("path", logs.MAILED_LINK_PATHS)
@pytest.mark.parametrize("line, redacted", [
    ('10.0.0.1 "GET {path}{token} HTTP/1.1" 200 1234 3ms abc', '10.0.0.1 "GET {path}[redacted] HTTP/1.1" 200 1234 3ms abc'),
    ("{path}{token}", "{path}[redacted]"),
    ("Unhandled error on POST {path}{token}", "Unhandled error on POST {path}[redacted]"),
    ("GET /{path}{token}/more?next=1", "GET /{path}[redacted]?next=1"),
    ("/login?next={path}{token}", "/login?next={path}[redacted]"),
    ("Invalid request line: 'GET {path}{token} HTTP/9'", "Invalid request line: 'GET {path}[redacted] HTTP/9'"),
])
def test_a_mailed_links_token_never_reaches_a_line(path, line, redacted):
    assert logs.redact(line.format(path=path, token=TOKEN)) == redacted.format(path=path)
    upper = line.format(path=path.upper(), token=TOKEN)
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
