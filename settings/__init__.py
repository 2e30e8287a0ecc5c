"""Every setting the environment gives the service, parsed, defaulted and checked in one place
(the mail and billing settings in their own files here, the forms they share in parsing.py).

gunicorn's master runs this before it forks a worker (gunicorn.conf.py), so it imports the
standard library only: the app, peewee, limits and redis must wait for gevent's patching in each
worker, and whatever the master imports, its workers inherit unpatched."""

import re
import sys
from pathlib import Path
from urllib.parse import urlsplit

from settings import billing as billing_settings
from settings.mail import (
    DEFAULT_MAIL_FROM,
    DEFAULT_MAIL_RETRY_SCHEDULE,
    MAIL_SCHEMES,
    mail_from,
    mail_retry_schedule,
    mail_url,
)
from settings.parsing import ConfigError, checked, count, described, http_url, on_off, retry_schedule, seconds, switch

INSTANCE = Path(__file__).resolve().parent.parent / "instance"

RATE_PATTERN = re.compile(r"\s*([1-9][0-9]{0,9})\s*/\s*(second|minute|hour|day)\s*")
RATE_FORM = "a rate like 1000/hour (a whole number from 1, a slash, and second, minute, hour or day)"
TIER_NAME_PATTERN = re.compile(r"[a-z0-9_-]{1,32}")
# The policy names of the per-IP window, the account's window and a key's own windows.
RESERVED_POLICIES = ("public", "account", "key")
LOG_FORMATS = ("text", "json")
STORAGE_FAILURE_MODES = ("closed", "open")
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
# scrypt's N: 32 MiB and about 0.1 s of one core a hash (werkzeug's default).
DEFAULT_PASSWORD_HASH_COST = 32768
DEFAULT_GITHUB_KEYS_URL = "https://api.github.com/meta/public_keys/secret_scanning"
STORAGE_SCHEMES = frozenset({
    "memory", "redis", "rediss", "redis+unix", "redis+cluster", "redis+sentinel", "valkey", "valkeys",
    "valkey+unix", "valkey+cluster", "valkey+sentinel", "memcached", "mongodb", "mongodb+srv"})


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
        "RATE_LIMIT_ON_STORAGE_FAILURE": storage_failure(environ),
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
        **billing_settings.billing(environ),
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


def password_hash_cost(environ):
    """PASSWORD_HASH_COST: scrypt's N for the passwords hashed from now on, a power of two."""
    cost = count(environ, "PASSWORD_HASH_COST", DEFAULT_PASSWORD_HASH_COST, minimum=1024, maximum=131072)
    if cost & (cost - 1):
        raise ConfigError(f"PASSWORD_HASH_COST must be a power of two (such as 32768), not {cost}.")
    return cost


def workers(environ):
    """WEB_CONCURRENCY: gunicorn's worker processes."""
    return count(environ, "WEB_CONCURRENCY", 1)


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


def storage_failure(environ):
    """RATE_LIMIT_ON_STORAGE_FAILURE: closed (the default: keyed requests refused with 503 while the
    limit storage cannot be reached) or open (admitted without counting)."""
    value = (environ.get("RATE_LIMIT_ON_STORAGE_FAILURE") or "closed").strip().lower()
    if value not in STORAGE_FAILURE_MODES:
        raise ConfigError("RATE_LIMIT_ON_STORAGE_FAILURE must be closed or open, not "
                          f"{environ.get('RATE_LIMIT_ON_STORAGE_FAILURE')!r}.")
    return value


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
