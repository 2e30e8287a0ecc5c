"""What the logs hold: each line as text or (LOG_FORMAT=json) one JSON object, every line of a
request carrying its request id, and never an API key (wherever in a request a client put it) nor
the token of a mailed link in a request's path."""

import contextvars
import datetime
import logging
import os
import re

from pythonjsonlogger.json import JsonFormatter

from ops import note as request_note

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"

# A key with its prefix in any case, an api_key value, and any run of 32 or more letters and
# digits: a key's body on its own (after an encoded or mangled prefix) is still a key.
SECRET = re.compile(r"(api_key=)[^&\s']*|((?i:sk_(?:live|test)_))[A-Za-z0-9]+|[A-Za-z0-9]{32,}")
# The paths of the links mailed to people, each ending in the link's token: a request's path that
# starts with one is logged without the rest. Not right after a host: MAIL_URL=console writes each
# mail's links whole, as it promises. A pass of its own (~0.3 us a line): as one more alternative
# of SECRET it costs every line ~1.5 us.
MAILED_LINK_PATHS = ("/password/reset/", "/email/verify/", "/email/change/", "/invitations/")
MAILED_LINK = re.compile(r"/(?<![A-Za-z0-9.\]-]/)((?i:" + "|".join(re.escape(path[1:]) for path in MAILED_LINK_PATHS)
                         + r"))[^\s\"'?#]+")
# The same path percent-encoded in a query string (a log-in page's `next=%2Finvitations%2F<TOKEN>`):
# looked for only in a line that holds an encoded slash.
ENCODED_MAILED_LINK = re.compile(r"(?i:%2F)((?i:" + "|".join(re.escape(path[1:]).replace("/", "%2F")
                                                              for path in MAILED_LINK_PATHS) + r"))[^\s\"'&#]+")
# A run of hex digits alone is not a key's body (base62: all 32 characters hex by chance is
# under 1 in 10^14) but is a common request or trace id, which must stay readable.
HEX_RUN = re.compile(r"[0-9A-Fa-f]+")

# What could end a line or hide text in a terminal (C0, DEL, C1), and the backslash that escapes them.
CONTROL_OR_BACKSLASH = re.compile(r"[\x00-\x1f\x7f-\x9f\\]")

REQUEST_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
REQUEST_ID_HEADER = "X-Request-ID"
# The id of an answer given outside the app (gunicorn's or the fallback server's to a request it
# cannot parse): a request the app serves keeps its id in its note (request_id_now). gevent gives
# every connection's greenlet its own context.
current_request_id = contextvars.ContextVar("request_id", default=None)


def redact(text):
    text = MAILED_LINK.sub(r"/\1[redacted]", text)
    if "%2" in text:
        text = ENCODED_MAILED_LINK.sub(r"%2F\1[redacted]", text)
    return SECRET.sub(redacted, text)


def redacted(match):
    if match[1] or match[2]:
        return (match[1] or match[2]) + "[redacted]"
    return match[0] if HEX_RUN.fullmatch(match[0]) else "[redacted]"


def escape_controls(text):
    """text with control characters as \\xHH and a backslash as \\\\: one line, readable, unambiguous."""
    return CONTROL_OR_BACKSLASH.sub(escaped, text)


def escaped(match):
    character = match[0]
    return "\\\\" if character == "\\" else f"\\x{ord(character):02x}"


def request_id_of(environ):
    """The id the envelope gave a request (its note's), else the current one: gunicorn's own answer's."""
    note = request_note.of(environ)
    return note.request_id if note is not None else current_request_id.get()


def request_id_for(header):
    """The client's X-Request-ID when it is 1-64 characters of [A-Za-z0-9._-] and nothing the
    logs would redact (an id that looks like a key is not kept); else a new one."""
    if header and REQUEST_ID.fullmatch(header) and redact(header) == header:
        return header
    # 32 random hex digits, as nginx's $request_id: a fifth of uuid4()'s cost. Not the random
    # module: 156 ids would give away its state, and with it every id to come, which a client
    # could then send as its own to mix its lines into another's.
    return os.urandom(16).hex()


def request_id_now():
    """The id of the request being served in this context: the app's (its note's), else that of an
    answer given outside the app, else None."""
    environ = request_note.current_environ.get(None)
    return current_request_id.get() if environ is None else environ[request_note.ENVIRON_KEY].request_id


def end_request():
    """Forget the id of an answer given outside the app once it is sent and logged."""
    current_request_id.set(None)


class RedactSecrets(logging.Filter):
    """Replace API keys in a log record's message (and its traceback) with [redacted], and escape
    control characters in the values a message quotes (a request's path, say): one record, one line."""

    def filter(self, record):
        if isinstance(record.args, tuple):
            record.args = tuple(escape_controls(arg) if isinstance(arg, str) else arg for arg in record.args)
        record.msg = redact(record.getMessage())
        record.args = ()
        if record.exc_info:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
            record.exc_info = None
        return True


class AddRequestId(logging.Filter):
    """Give a record logged while a request is served that request's id."""

    def filter(self, record):
        request_id = request_id_now()
        if request_id is not None and not hasattr(record, "request_id"):
            record.request_id = request_id
        return True


class JsonLines(JsonFormatter):
    """One JSON object per line: time (UTC, ISO 8601), level, logger, pid, message, and whatever
    the record carries besides (request_id; method, path, status, duration_ms for the access log)."""

    def __init__(self):
        super().__init__("{asctime}{levelname}{name}{process}{message}", style="{",
                         rename_fields={"asctime": "time", "levelname": "level", "name": "logger",
                                        "process": "pid"})

    def formatTime(self, record, datefmt=None):
        moment = datetime.datetime.fromtimestamp(record.created, datetime.UTC)
        return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def text_formatter():
    return logging.Formatter(TEXT_FORMAT, defaults={"request_id": "-"})


# What a handler may do to a record for direct_writes to write its line instead: nothing beyond these.
PLAIN_FILTERS = (RedactSecrets, AddRequestId)


def direct_writes(logger):
    """The handlers of a logger whose lines are its messages alone (gunicorn's access log in text:
    a formatter of %(message)s, this module's filters, a stream), or None when any handler, filter
    or level would do more with a record. A line written to them straight (write_line) is what
    logging would write, without its record, caller lookup and dispatch: a fifth of a served
    request's access line."""
    if logger.filters or logger.propagate or not logger.handlers or not logger.isEnabledFor(logging.INFO):
        return None
    for handler in logger.handlers:
        formatter = handler.formatter
        if (type(handler) not in (logging.StreamHandler, logging.FileHandler) or handler.level > logging.INFO
                or getattr(handler, "stream", None) is None or type(formatter) is not logging.Formatter
                or formatter._fmt != "%(message)s" or not isinstance(formatter._style, logging.PercentStyle)
                or any(type(existing) not in PLAIN_FILTERS for existing in handler.filters)):
            return None
    return list(logger.handlers)


def write_line(handlers, message):
    """Write one message as each handler's line, redacted as RedactSecrets would, under the
    handler's lock as Handler.handle takes it."""
    write_redacted_line(handlers, redact(message))


def write_redacted_line(handlers, line):
    """write_line for a line redacted already."""
    for handler in handlers:
        handler.acquire()
        try:
            handler.stream.write(line + handler.terminator)
            handler.flush()
        except Exception:
            handler.handleError(logging.makeLogRecord({"msg": line}))
        finally:
            handler.release()


def prepare_handlers(logger, format_name, formatter=None):
    """Make every handler of the logger (records of its children included) redact secrets and add
    the request id; with json, format each record as one JSON object; else use formatter, if any."""
    if format_name == "json":
        formatter = JsonLines()
    for handler in logger.handlers:
        for kind in (RedactSecrets, AddRequestId):
            if not any(isinstance(existing, kind) for existing in handler.filters):
                handler.addFilter(kind())
        if formatter is not None:
            handler.setFormatter(formatter)
