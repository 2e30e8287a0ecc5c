"""What the logs may hold: no API key in any line, wherever in a request a client put it."""

import logging
import re

# A key with its prefix in any case, an api_key value, and any run of 32 or more letters and
# digits: a key's body on its own (after an encoded or mangled prefix) is still a key.
SECRET = re.compile(r"(api_key=)[^&\s']*|((?i:sk_(?:live|test)_))[A-Za-z0-9]+|[A-Za-z0-9]{32,}")


def redact(text):
    return SECRET.sub(lambda match: (match[1] or match[2] or "") + "[redacted]", text)


class RedactSecrets(logging.Filter):
    """Replace API keys in a log record's message (and its traceback) with [redacted]."""

    def filter(self, record):
        record.msg = redact(record.getMessage())
        record.args = ()
        if record.exc_info:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
            record.exc_info = None
        return True


def redact_handlers(logger):
    """Redact every record that reaches the logger's handlers, those of its children included
    (a filter on the logger itself would see only its own records)."""
    for handler in logger.handlers:
        if not any(isinstance(existing, RedactSecrets) for existing in handler.filters):
            handler.addFilter(RedactSecrets())
