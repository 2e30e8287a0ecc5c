"""Every setting the environment gives the service, parsed, defaulted and checked in one place.

gunicorn's master runs this before it forks a worker (gunicorn.conf.py), so it imports the
standard library only: the app, peewee, limits and redis must wait for gevent's patching in each
worker, and whatever the master imports, its workers inherit unpatched."""

import ipaddress
import re
import sys
from email.utils import getaddresses
from pathlib import Path
from urllib.parse import unquote, urlsplit

INSTANCE = Path(__file__).resolve().parent / "instance"

RATE_PATTERN = re.compile(r"\s*([1-9][0-9]{0,9})\s*/\s*(second|minute|hour|day)\s*")
RATE_FORM = "a rate like 1000/hour (a whole number from 1, a slash, and second, minute, hour or day)"
TIER_NAME_PATTERN = re.compile(r"[a-z0-9_-]{1,32}")
# The policy names of the per-IP window, the account's window and a key's own windows.
RESERVED_POLICIES = ("public", "account", "key")
LOG_FORMATS = ("text", "json")
ANY_ORIGIN = "*"
ORIGIN_PATTERN = re.compile(r"([a-z][a-z0-9+.-]*)://(\[[0-9a-f:.]+\]|[a-z0-9_.-]+)(:[0-9]{1,5})?")
DEFAULT_PORTS = {"http": ":80", "https": ":443"}
# The schemes of playhouse.db_url for the two databases the service's SQL is written for, and of
# limits' synchronous storages; tests/live/test_settings.py checks both against the libraries, whose
# own lists cannot be read here without importing them.
DATABASE_SCHEMES = frozenset({
    "sqlite", "sqlite+pool", "postgres", "postgresql", "postgres+pool", "postgresql+pool", "postgresext",
    "postgresqlext", "postgresext+pool", "postgresqlext+pool", "psycopg3", "psycopg3+pool"})
DEFAULT_RETRY_SCHEDULE = "5s,5m,30m,2h,5h,10h,10h"
DEFAULT_MAIL_RETRY_SCHEDULE = "5s,1m,5m,30m,2h,6h,12h"
DEFAULT_MAIL_FROM = "API-key demo service <no-reply@localhost>"
MAIL_SCHEMES = ("smtp", "smtps")
MAIL_URL_FORM = "smtp://[USER:PASSWORD@]HOST[:PORT], smtps://..., console or off"
DEFAULT_MAIL_PORTS = {"smtp": 587, "smtps": 465}
# An address as MAIL_FROM may give it: no dot needed after the @ (no-reply@localhost).
MAIL_FROM_ADDRESS = re.compile(r"[^@\s<>,;\"]{1,64}@[^@\s<>,;\"]{1,253}")
DURATION_PATTERN = re.compile(r"\s*([0-9]{1,6})\s*(s|m|h|d)\s*")
DURATION_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
MAX_RETRIES = 20
# scrypt's N: 32 MiB and about 0.1 s of one core a hash (werkzeug's default).
DEFAULT_PASSWORD_HASH_COST = 32768
DEFAULT_GITHUB_KEYS_URL = "https://api.github.com/meta/public_keys/secret_scanning"
BILLING_TARGETS = ("off", "stripe", "lago", "openmeter", "cloudevents")
DEFAULT_BILLING_URLS = {"stripe": "https://api.stripe.com"}
BILLING_QUANTITIES = ("requests", "credits")
# A meter's event name or code as all four targets take it.
METER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}")
STORAGE_SCHEMES = frozenset({
    "memory", "redis", "rediss", "redis+unix", "redis+cluster", "redis+sentinel", "valkey", "valkeys",
    "valkey+unix", "valkey+cluster", "valkey+sentinel", "memcached", "mongodb", "mongodb+srv"})


class ConfigError(ValueError):
    """A setting the service cannot use; the message is one sentence that names the variable."""


def load(environ):
    """Every setting of the configuration table, defaults filled in, SECRET_KEY as given ("" when
    unset: app.py keeps one in instance/); ConfigError for the first that is wrong."""
    webauthn_rp_id, webauthn_origin = relying_party(environ)
    config = {
        "DATABASE_URL": database_url(environ),
        "SECRET_KEY": environ.get("SECRET_KEY") or "",
        "RATELIMIT_STORAGE_URL": storage_url(environ),
        "RATE_LIMIT_TIERS": checked(tiers, environ.get("RATE_LIMIT_TIERS") or "free=1000/hour"),
        "PUBLIC_RATE_LIMIT": checked(public_rate, environ.get("PUBLIC_RATE_LIMIT") or "600/minute"),
        "ACCOUNT_RATE_LIMIT": checked(account_rate, environ.get("ACCOUNT_RATE_LIMIT") or "off"),
        "TRUSTED_PROXIES": count(environ, "TRUSTED_PROXIES", 0, minimum=0),
        "HOST": environ.get("HOST") or "127.0.0.1",
        "PORT": count(environ, "PORT", 5000, maximum=65535),
        "WEB_CONCURRENCY": workers(environ),
        "WS_SEND_TIMEOUT": seconds(environ, "WS_SEND_TIMEOUT", 30),
        "MAX_KEYS_PER_USER": count(environ, "MAX_KEYS_PER_USER", 20),
        "MAX_BODY_BYTES": count(environ, "MAX_BODY_BYTES", 65536, minimum=1024),
        "PASSWORD_HASH_COST": password_hash_cost(environ),
        "LOG_FORMAT": log_format(environ),
        "METRICS_TOKEN": metrics_token(environ),
        "CORS_ORIGINS": allowed_origins(environ),
        # Passkeys: "" is the request's own host and origin.
        "WEBAUTHN_RP_ID": webauthn_rp_id,
        "WEBAUTHN_ORIGIN": webauthn_origin,
        "USAGE_HOURLY_RETENTION_DAYS": count(environ, "USAGE_HOURLY_RETENTION_DAYS", 90),
        "USAGE_DAILY_RETENTION_DAYS": count(environ, "USAGE_DAILY_RETENTION_DAYS", 400),
        "REVOKED_KEY_RETENTION_DAYS": count(environ, "REVOKED_KEY_RETENTION_DAYS", 90, minimum=0),
        "WEBHOOK_RETRY_SCHEDULE": checked(retry_schedule, environ.get("WEBHOOK_RETRY_SCHEDULE")
                                          or DEFAULT_RETRY_SCHEDULE),
        "MAIL_URL": checked(mail_url, environ.get("MAIL_URL") or "console"),
        "MAIL_FROM": mail_from(environ.get("MAIL_FROM") or DEFAULT_MAIL_FROM),
        "PUBLIC_URL": public_url(environ.get("PUBLIC_URL") or ""),
        "MAIL_RETRY_SCHEDULE": checked(mail_retry_schedule, environ.get("MAIL_RETRY_SCHEDULE")
                                       or DEFAULT_MAIL_RETRY_SCHEDULE),
        "WEBHOOK_ALLOW_PRIVATE": switch(environ, "WEBHOOK_ALLOW_PRIVATE"),
        "GITHUB_SECRET_SCANNING": on_off(environ, "GITHUB_SECRET_SCANNING"),
        "GITHUB_SECRET_SCANNING_KEYS_URL": http_url(environ.get("GITHUB_SECRET_SCANNING_KEYS_URL")
                                                    or DEFAULT_GITHUB_KEYS_URL, "GITHUB_SECRET_SCANNING_KEYS_URL"),
        **billing(environ),
    }
    if mail_url(config["MAIL_URL"]).scheme in MAIL_SCHEMES and not (config["PUBLIC_URL"] or webauthn_origin):
        raise ConfigError("PUBLIC_URL must be the site's address, such as https://api.example.com, when MAIL_URL "
                          "sends mail: a mail's links would otherwise follow the Host header of the request that "
                          "caused it, which any client chooses.")
    return config


def exit_with(error):
    """End the process on a configuration error: its sentence on one line of stderr, status 2."""
    print(f"error: {error}", file=sys.stderr, flush=True)
    raise SystemExit(2)


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


def password_hash_cost(environ):
    """PASSWORD_HASH_COST: scrypt's N for the passwords hashed from now on, a power of two."""
    cost = count(environ, "PASSWORD_HASH_COST", DEFAULT_PASSWORD_HASH_COST, minimum=1024, maximum=131072)
    if cost & (cost - 1):
        raise ConfigError(f"PASSWORD_HASH_COST must be a power of two (such as 32768), not {cost}.")
    return cost


def workers(environ):
    """WEB_CONCURRENCY: gunicorn's worker processes."""
    return count(environ, "WEB_CONCURRENCY", 1)


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


def rate(text, setting, alternative=""):
    """(amount, period) of a rate like 1000/hour; ConfigError naming the setting otherwise."""
    match = RATE_PATTERN.fullmatch(text)
    if not match:
        raise ConfigError(f"{setting} must be {RATE_FORM}{alternative}, not {text.strip()!r}.")
    return int(match[1]), match[2]


def tiers(spec):
    """{tier: [(amount, period), ...]} from RATE_LIMIT_TIERS ('free=10/second+1000/hour,pro=10000/hour')."""
    parsed = {}
    for entry in spec.split(","):
        name, sep, text = entry.partition("=")
        name = name.strip()
        if not sep or not TIER_NAME_PATTERN.fullmatch(name):
            raise ConfigError(f"RATE_LIMIT_TIERS entry {entry.strip()!r} is not like free=1000/hour (a tier "
                              "name of lower-case letters, digits, - or _, then = and a rate).")
        if name in parsed:
            raise ConfigError(f"RATE_LIMIT_TIERS names the tier {name!r} twice.")
        if name in RESERVED_POLICIES:
            raise ConfigError(f"RATE_LIMIT_TIERS cannot name a tier {name!r}: the rate-limit headers use that name "
                              "for another window.")
        parsed[name] = rates(text, f"RATE_LIMIT_TIERS's tier {name!r}")
    return parsed


def rates(text, setting):
    """[(amount, period), ...] of RATE+RATE... (10/second+1000/hour), at most one rate a period."""
    parsed = [rate(part, setting, ", or several joined by +") for part in text.split("+")]
    periods = [period for _, period in parsed]
    if len(set(periods)) < len(periods):
        raise ConfigError(f"{setting} has two rates per {max(periods, key=periods.count)}; give each period once.")
    return parsed


def public_rate(text):
    """(amount, period) of PUBLIC_RATE_LIMIT, or None when it is off."""
    if text.strip().lower() == "off":
        return None
    return rate(text, "PUBLIC_RATE_LIMIT", " or off")


def account_rate(text):
    """(amount, period) of ACCOUNT_RATE_LIMIT, or None when it is off."""
    if text.strip().lower() == "off":
        return None
    return rate(text, "ACCOUNT_RATE_LIMIT", " or off")


def database_url(environ):
    """DATABASE_URL: a SQLite or PostgreSQL URL, by default a SQLite file in instance/. Only its
    scheme is ever quoted: the rest may hold a password."""
    url = environ.get("DATABASE_URL") or f"sqlite:///{INSTANCE / 'service.db'}"
    scheme = url.partition("://")[0] if "://" in url else ""
    if scheme not in DATABASE_SCHEMES:
        raise ConfigError("DATABASE_URL must be a SQLite or PostgreSQL URL such as sqlite:///path/service.db "
                          f"or postgresql://user:password@host/name, not {described(scheme)}.")
    return url


def storage_url(environ):
    """RATELIMIT_STORAGE_URL: a storage URI of the limits library; as with DATABASE_URL, only its
    scheme and port are ever quoted."""
    url = environ.get("RATELIMIT_STORAGE_URL") or "memory://"
    scheme = url.strip().partition("://")[0] if "://" in url else ""
    if scheme not in STORAGE_SCHEMES:
        raise ConfigError("RATELIMIT_STORAGE_URL must be memory:// or a storage URI such as "
                          f"redis://host:6379/0, not {described(scheme)}.")
    # Sentinel, cluster and memcached URIs may name several hosts, each with its port.
    for host in urlsplit(url.strip()).netloc.rpartition("@")[2].split(","):
        try:
            _ = urlsplit(f"//{host}").port  # read for its ValueError alone
        except ValueError:
            raise ConfigError("RATELIMIT_STORAGE_URL has a port that is not a whole number from 0 to 65535.") from None
    if scheme.endswith("+sentinel") and not urlsplit(url.strip()).path.strip("/"):
        raise ConfigError(f"RATELIMIT_STORAGE_URL must name the Sentinel's service after the hosts, as in "
                          f"{scheme}://host:26379/mymaster.")
    return url


def described(scheme):
    return f"a {scheme}:// URL" if scheme else "a value without a scheme (such as postgresql://)"


def log_format(environ):
    """LOG_FORMAT from the environment: text (the default) or json, or a sentence saying what is wrong."""
    value = (environ.get("LOG_FORMAT") or "text").strip().lower()
    if value not in LOG_FORMATS:
        raise ConfigError(f"LOG_FORMAT must be text or json, not {environ.get('LOG_FORMAT')!r}.")
    return value


def metrics_token(environ):
    """METRICS_TOKEN, when set: 16 or more visible ASCII characters, since anyone may try it."""
    token = environ.get("METRICS_TOKEN") or ""
    if token and not re.fullmatch(r"[!-~]{16,}", token):
        raise ConfigError("METRICS_TOKEN must be at least 16 visible ASCII characters without spaces; "
                          "`python -c 'import secrets; print(secrets.token_urlsafe())'` makes one.")
    return token


def allowed_origins(environ):
    """CORS_ORIGINS as a tuple of origins, ("*",) for any, () when unset; a sentence for an entry a
    browser would never send as its Origin."""
    entries = [entry.strip() for entry in (environ.get("CORS_ORIGINS") or "").split(",") if entry.strip()]
    if ANY_ORIGIN in entries:
        if len(entries) > 1:
            raise ConfigError("CORS_ORIGINS is either * alone or a list of origins, not both.")
        return (ANY_ORIGIN,)
    return tuple(dict.fromkeys(origin(entry) for entry in entries))


def origin(entry):
    """An origin as browsers send it in the Origin header: scheme://host[:port], lowercase, without
    the scheme's default port."""
    text = entry.lower()
    match = ORIGIN_PATTERN.fullmatch(text)
    if not match:
        raise ConfigError(f"CORS_ORIGINS entry {entry!r} is not an origin like https://app.example.com "
                          "(a scheme, ://, a host and an optional port; no wildcard, no path, not even a "
                          "trailing /).")
    if match[3] and match[3] == DEFAULT_PORTS.get(match[1]):
        return text.removesuffix(match[3])
    return text


def relying_party(environ):
    """WEBAUTHN_RP_ID and WEBAUTHN_ORIGIN from the environment ("" each: the request's host and
    origin), or a sentence saying what is wrong."""
    rp_id = (environ.get("WEBAUTHN_RP_ID") or "").strip().lower()
    site = (environ.get("WEBAUTHN_ORIGIN") or "").strip().rstrip("/")
    if rp_id and not re.fullmatch(r"[a-z0-9.-]{1,253}", rp_id):
        raise ConfigError(f"WEBAUTHN_RP_ID must be a host name such as example.com (no scheme or port), not {rp_id!r}.")
    if site:
        parts = urlsplit(site)
        if parts.scheme not in ("https", "http") or not parts.hostname or parts.path or parts.query:
            raise ConfigError(f"WEBAUTHN_ORIGIN must be a scheme and host such as https://example.com, not {site!r}.")
        if rp_id and not (parts.hostname == rp_id or parts.hostname.endswith("." + rp_id)):
            raise ConfigError(f"WEBAUTHN_ORIGIN's host must be WEBAUTHN_RP_ID ({rp_id}) or below it, not {site!r}.")
    return rp_id, site


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


def billing(environ):
    """The BILLING_* settings: the export's target, address, secret, meters and retry schedule."""
    target = (environ.get("BILLING_EXPORT") or "off").strip().lower()
    if target not in BILLING_TARGETS:
        raise ConfigError(f"BILLING_EXPORT must be one of {', '.join(BILLING_TARGETS)}, "
                          f"not {environ['BILLING_EXPORT']!r}.")
    url = (environ.get("BILLING_URL") or DEFAULT_BILLING_URLS.get(target, "")).strip().rstrip("/")
    if url:
        http_url(url, "BILLING_URL")
    elif target != "off":
        raise ConfigError(f"BILLING_URL must be the address of the {target} service when BILLING_EXPORT is {target}.")
    api_key = (environ.get("BILLING_API_KEY") or "").strip()
    if api_key and not re.fullmatch(r"[\x21-\x7e]{1,1000}", api_key):
        # Never quoted: it is a secret. A line break in it would end up in a header's error, and a log.
        raise ConfigError("BILLING_API_KEY must be printable ASCII without spaces or line breaks.")
    if target in ("stripe", "lago") and not api_key:
        raise ConfigError(f"BILLING_API_KEY must be the {target} secret key when BILLING_EXPORT is {target}.")
    return {"BILLING_EXPORT": target, "BILLING_URL": url, "BILLING_API_KEY": api_key,
            "BILLING_METERS": checked(billing_meters, environ.get("BILLING_METERS")
                                      or "requests=api_requests,credits=api_credits"),
            "BILLING_RETRY_SCHEDULE": checked(billing_retry_schedule, environ.get("BILLING_RETRY_SCHEDULE")
                                              or "1m,5m,30m,2h,6h,12h,24h")}


def billing_meters(text):
    """BILLING_METERS as {quantity: meter name}: requests=NAME and credits=NAME, one or both."""
    meters = {}
    for entry in text.split(","):
        quantity, _, name = (part.strip() for part in entry.partition("="))
        if quantity not in BILLING_QUANTITIES or quantity in meters or not METER_NAME.fullmatch(name):
            raise ConfigError("BILLING_METERS must be requests=NAME, credits=NAME or both, comma-separated, each "
                              f"name letters, digits, _ . : or - (up to 100), not {text.strip()!r}.")
        meters[quantity] = name
    if len(set(meters.values())) < len(meters):
        raise ConfigError("BILLING_METERS must give requests and credits different names: one event each hour "
                          f"and key carries one name, not {text.strip()!r}.")
    return meters


def billing_retry_schedule(text):
    return retry_schedule(text, "BILLING_RETRY_SCHEDULE")


def mail_retry_schedule(text):
    return retry_schedule(text, "MAIL_RETRY_SCHEDULE")


class MailServer:
    """MAIL_URL parsed: scheme smtp (STARTTLS, or plain on a loopback host), smtps (TLS from the
    start), console or off; the user and password are never part of a message."""

    def __init__(self, scheme, host="", port=0, user="", password=""):
        self.scheme, self.host, self.port, self.user, self.password = scheme, host, port, user, password

    @property
    def loopback(self):
        return self.host == "localhost" or is_loopback(self.host)

    def __repr__(self):
        return f"{self.scheme}://{self.host}:{self.port}" if self.host else self.scheme


def is_loopback(host):
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def mail_url(text):
    """MAIL_URL as a MailServer, or a sentence saying what is wrong that never quotes its password."""
    url = text.strip()
    if url.lower() in ("console", "off"):
        return MailServer(url.lower())
    scheme = url.partition("://")[0].lower() if "://" in url else ""
    if scheme not in MAIL_SCHEMES:
        raise ConfigError(f"MAIL_URL must be {MAIL_URL_FORM}, not {described(scheme)}.")
    parts = urlsplit(url)
    try:
        port = parts.port or DEFAULT_MAIL_PORTS[scheme]
    except ValueError:
        raise ConfigError("MAIL_URL has a port that is not a whole number from 1 to 65535.") from None
    if not parts.hostname or parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ConfigError(f"MAIL_URL must name a host and nothing after it, as in {MAIL_URL_FORM}.")
    return MailServer(scheme, parts.hostname, port, unquote(parts.username or ""), unquote(parts.password or ""))


def mail_from(text):
    """MAIL_FROM: one address, with an optional name, on one line."""
    addresses = getaddresses([text])
    address = addresses[0][1] if len(addresses) == 1 else ""
    if "\r" in text or "\n" in text or not MAIL_FROM_ADDRESS.fullmatch(address):
        raise ConfigError(f"MAIL_FROM must be one address such as 'API-key demo service <no-reply@example.com>', "
                          f"not {text!r}.")
    return text.strip()


def public_url(text):
    """PUBLIC_URL: the site's scheme, host and optional path prefix, without a trailing slash; "" when unset."""
    url = text.strip().rstrip("/")
    if not url:
        return ""
    parts = urlsplit(url)
    if parts.scheme not in ("https", "http") or not parts.hostname or parts.query or parts.fragment \
            or "@" in parts.netloc:
        raise ConfigError(f"PUBLIC_URL must be the site's address such as https://api.example.com, not {text!r}.")
    return url
