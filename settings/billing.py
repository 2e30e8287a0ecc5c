"""The BILLING_* settings: the usage export's target, address, secret, meters and retry schedule.
The standard library only (settings/)."""

import re

from settings.parsing import ConfigError, checked, http_url, retry_schedule

BILLING_TARGETS = ("off", "stripe", "lago", "openmeter", "cloudevents")
DEFAULT_BILLING_URLS = {"stripe": "https://api.stripe.com"}
BILLING_QUANTITIES = ("requests", "credits")
# A meter's event name or code as all four targets take it.
METER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}")


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
