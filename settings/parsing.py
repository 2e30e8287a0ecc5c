"""The forms every setting is read in: whole numbers, seconds, switches, URLs and retry schedules,
and the one error a setting the service cannot use raises. The standard library only (settings/)."""

import re
from urllib.parse import urlsplit

DURATION_PATTERN = re.compile(r"\s*([0-9]{1,6})\s*(s|m|h|d)\s*")
DURATION_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
MAX_RETRIES = 20


class ConfigError(ValueError):
    """A setting the service cannot use; the message is one sentence that names the variable."""


def checked(parse, text):
    """text, once parse accepts it: app.config keeps the text, which ratelimit.py parses again
    (the tests' configurations give it text too)."""
    parse(text)
    return text


def count(environ, name, default, minimum=1, maximum=None):
    """A whole number from minimum to maximum from the environment, or a sentence saying what is wrong."""
    text = environ.get(name) or str(default)
    value = int(text) if re.fullmatch(r"\s*[0-9]{1,18}\s*", text) else None
    if value is None or value < minimum or (maximum is not None and value > maximum):
        bounds = f"from {minimum} to {maximum}" if maximum is not None else f"of at least {minimum}"
        raise ConfigError(f"{name} must be a whole number {bounds}, not {text!r}.")
    return value


def seconds(environ, name, default):
    """A positive number of seconds from the environment, or a sentence saying what is wrong."""
    text = environ.get(name) or str(default)
    try:
        value = float(text)
    except ValueError:
        value = 0
    if not 0 < value < float("inf"):
        raise ConfigError(f"{name} must be a number of seconds above 0, not {text!r}.")
    return value


def described(scheme):
    return f"a {scheme}:// URL" if scheme else "a value without a scheme (such as postgresql://)"


def retry_schedule(text, setting="WEBHOOK_RETRY_SCHEDULE"):
    """[seconds, ...] of a retry schedule: the pauses before each attempt after the first,
    comma-separated durations such as 5s,5m,30m,2h (s, m, h or d)."""
    entries = text.split(",")
    matches = [DURATION_PATTERN.fullmatch(entry) for entry in entries]
    if len(entries) > MAX_RETRIES or not all(matches) or any(int(match[1]) == 0 for match in matches):
        raise ConfigError(f"{setting} must be 1 to {MAX_RETRIES} comma-separated durations above 0, "
                          f"each a number and a unit s, m, h or d (such as 5s,5m,30m,2h), not {text.strip()!r}.")
    return [int(match[1]) * DURATION_SECONDS[match[2]] for match in matches]


def switch(environ, name):
    """A yes-or-no variable: 1, true or yes; 0, false, no or unset."""
    text = (environ.get(name) or "0").strip().lower()
    if text not in ("1", "true", "yes", "0", "false", "no"):
        raise ConfigError(f"{name} must be 1 or 0, not {environ.get(name)!r}.")
    return text in ("1", "true", "yes")


def on_off(environ, name):
    """An on-or-off variable: on, or off (the default)."""
    text = (environ.get(name) or "off").strip().lower()
    if text not in ("on", "off"):
        raise ConfigError(f"{name} must be on or off, not {environ.get(name)!r}.")
    return text == "on"


def http_url(text, setting):
    """An http or https URL with a host. Only its scheme is ever quoted: the operator's URL may carry a token."""
    url = text.strip()
    parts = urlsplit(url)
    if parts.scheme not in ("https", "http"):
        raise ConfigError(f"{setting} must be an http or https URL, not {described(parts.scheme)}.")
    try:
        _ = parts.port  # read for its ValueError alone
    except ValueError:
        parts = parts._replace(netloc="")
    if not parts.hostname:
        raise ConfigError(f"{setting} must name a host (and a port from 0 to 65535, if any).")
    return url
