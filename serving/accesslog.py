"""The access log as gunicorn writes it for the service: ServiceLogger, gunicorn's logger minus
secrets and with each request's id, whose text line is made field by field (service_line) for the
service's own format and through AccessAtoms for any other; with LOG_FORMAT=json, one JSON object a
line. gunicorn.conf.py names it as the logger_class."""

import functools
import os
import traceback

from gunicorn.glogging import Logger

import settings
from ops import logs

# %(U)s is the path without the query string, which may carry the time socket's api_key; a key
# put in the path itself is redacted by ServiceLogger.
SERVICE_FORMAT = '%(h)s "%(m)s %(U)s %(H)s" %(s)s %(b)s %(M)sms %({x-request-id}o)s'


class AccessAtoms(dict):
    """The text access line's fields as gunicorn's SafeAtoms gives them (a missing one is "-",
    double quotes escaped), with control characters escaped too: a path holding %0a must not write
    a second, forged line.

    Made as the line reads them: gunicorn's own atoms() builds some fifty per request (a strftime,
    every request and response header, every environ entry), ~128,000 instructions (a tenth of a
    bare route's served request), for the eight the service's line prints. Those eight are made
    here directly; any other a custom access_log_format names comes from gunicorn's atoms(), built
    once for the line."""

    def __init__(self, logger, resp, req, environ, request_time):
        status = resp.status
        sent = getattr(resp, "sent", None)
        # Never empty: logging takes a single argument as the line's mapping only if it is truthy.
        super().__init__(
            h=environ.get("REMOTE_ADDR", "-"), m=environ.get("REQUEST_METHOD"), U=environ.get("PATH_INFO"),
            H=environ.get("SERVER_PROTOCOL"), s=status.split(None, 1)[0] if isinstance(status, str) else status,
            b="-" if sent is None else str(sent),
            M=request_time.seconds * 1000 + int(request_time.microseconds / 1000))
        self.line = (logger, resp, req, environ, request_time)
        self.all_atoms = None

    def __getitem__(self, name):
        value = self.raw(name.lower() if name.startswith("{") else name)
        if not isinstance(value, str):
            return value
        if not value.isprintable() or "\\" in value:
            value = logs.escape_controls(value)
        return value.replace('"', '\\"')

    def raw(self, key):
        if dict.__contains__(self, key):
            return dict.__getitem__(self, key)
        if key.startswith("{") and key.endswith("}o"):
            header = key[1:-2]
            # gunicorn keeps the last of repeated headers.
            return next((value for name, value in reversed(self.line[1].headers) if name.lower() == header), "-")
        if self.all_atoms is None:
            logger, *line = self.line
            self.all_atoms = Logger.atoms(logger, *line)
        return self.all_atoms.get(key, "-")


def service_line(resp, environ, request_time):
    """The line of the service's own access_log_format, as `access_log_format % AccessAtoms(...)`
    gives it and logs.write_line redacts it, made without the mapping and the pass over the whole
    line (together a tenth of a served keyed request's instructions): each field is redacted
    alone, a text once for each value seen lately. The same line, as spaces, quotes and the line's
    end, which no secret or mailed link holds, stand between the fields; the one pattern that runs
    over a quote, an `api_key=`'s value, could only join the protocol to the status, and gunicorn
    writes the protocol itself."""
    status = resp.status
    sent = getattr(resp, "sent", None)
    request_id = next((value for name, value in reversed(resp.headers) if name.lower() == "x-request-id"), "-")
    return (f'{shown(environ.get("REMOTE_ADDR", "-"))} "{shown(environ.get("REQUEST_METHOD"))} '
            f'{shown(environ.get("PATH_INFO"))} {shown(environ.get("SERVER_PROTOCOL"))}" '
            f'{shown(status.split(None, 1)[0] if isinstance(status, str) else status)} '
            f'{"-" if sent is None else sent} '
            f'{request_time.seconds * 1000 + int(request_time.microseconds / 1000)}ms {shown(request_id)}')


def shown(value):
    """A field of the access line as AccessAtoms gives it, redacted."""
    if isinstance(value, str):
        return shown_text(value)
    # AccessAtoms prints any other value as it is, and the line's redaction then covers it.
    return logs.redact(str(value))


@functools.lru_cache(maxsize=256)
def shown_text(text):
    """A text field with its control characters and double quotes escaped, redacted."""
    if not text.isprintable() or "\\" in text:
        text = logs.escape_controls(text)
    return logs.redact(text.replace('"', '\\"'))


class ServiceLogger(Logger):
    """gunicorn's logger, minus secrets (for a request it cannot parse, gunicorn logs the whole
    request line, query string and all; a client may put a key in the path itself), with each
    request's id, and with LOG_FORMAT=json one JSON object per line, access log included."""

    def setup(self, cfg):
        super().setup(cfg)
        # gunicorn.conf.py checked the settings, .env read, before gunicorn made its logger.
        self.log_format = settings.log_format(os.environ)
        logs.prepare_handlers(self.error_log, self.log_format)
        logs.prepare_handlers(self.access_log, self.log_format)
        self.service_format = cfg.access_log_format == SERVICE_FORMAT

    def access(self, resp, req, environ, request_time):
        if not self.access_log_enabled:
            return
        if self.log_format != "json":
            try:
                # Looked up for each line: a log file that failed to reopen (USR1) has no stream,
                # and logging's own write opens it again.
                handlers = logs.direct_writes(self.access_log)
                if handlers is not None and self.service_format:
                    logs.write_redacted_line(handlers, service_line(resp, environ, request_time))
                    return
                atoms = AccessAtoms(self, resp, req, environ, request_time)
                if handlers is None:
                    self.access_log.info(self.cfg.access_log_format, atoms)
                else:
                    logs.write_line(handlers, self.cfg.access_log_format % atoms)
            except Exception:
                self.error(traceback.format_exc())
            return
        try:
            method = logs.redact(environ.get("REQUEST_METHOD", "-"))
            path = logs.redact(environ.get("PATH_INFO", "-"))
            # The responses gunicorn makes for its own errors carry only the status line.
            status = int(str(resp.status).split()[0])
            self.access_log.info("%s %s %s", method, path, status, extra={
                "request_id": logs.request_id_of(environ),
                "method": method,
                "path": path,
                "status": status,
                "duration_ms": round(request_time.total_seconds() * 1000, 3),
                "bytes": getattr(resp, "sent", None),
                # From X-Forwarded-For behind TRUSTED_PROXIES: whatever the client wrote.
                "remote_addr": logs.redact(environ.get("REMOTE_ADDR") or "-"),
            })
        except Exception:
            self.error(traceback.format_exc())
