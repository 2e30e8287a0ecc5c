"""Usage analytics: a key's (or an account's) requests per hour and per day, by HTTP status and by
endpoint, read from the hourly and daily rows with one bounded query each."""

import collections
import datetime
import math
import time

from models import UsageDay, UsageHour, db, iso_second, iso_seconds, start_of_hour, utc_from_epoch, utcnow
from ops import note as request_note
from ops.encoded import Encoded, encode
from store.kept import KeptAnswers

HOURS = 24
DAYS = 30
HOUR = datetime.timedelta(hours=1)
DAY = datetime.timedelta(days=1)
# Keys whose history is kept between two commits: 54 periods each, 24-100 KiB with their JSON.
HISTORIES_KEPT = 100
kept_histories = KeptAnswers(db, HISTORIES_KEPT, request_note.data_versions)
# How the key page groups statuses: a success, a refusal for scope, a refusal for rate, the rest.
OUTCOMES = {"success": "Success", "insufficient_scope": "Refused for scope", "rate_limited": "Rate limited",
            "other": "Other"}


def outcome(status):
    """The outcome an HTTP status stands for on the key page."""
    if status < 400:
        return "success"
    return {403: "insufficient_scope", 429: "rate_limited"}.get(status, "other")


class Period:
    """One hour or day's requests, by status and by endpoint, and the credits they spent."""

    def __init__(self, start):
        self.start = start
        self.by_status = collections.Counter()
        self.by_endpoint = collections.Counter()
        self.credits = 0

    @property
    def requests(self):
        return sum(self.by_status.values())

    def add(self, endpoint, status, requests, credits=0):
        self.by_status[str(status)] += requests
        self.by_endpoint[endpoint or "(not recorded)"] += requests
        self.credits += credits

    def by_outcome(self):
        counts = collections.Counter()
        for status, requests in self.by_status.items():
            counts[outcome(int(status))] += requests
        return counts

    def as_json(self, label, text):
        return {label: text, "requests": self.requests, "by_status": dict(sorted(self.by_status.items())),
                "by_endpoint": dict(sorted(self.by_endpoint.items()))}


def hourly(key_ids, hours=HOURS, now=None):
    """The last `hours` UTC hours (the current one last), every hour present, for the keys."""
    last = start_of_hour(now or utcnow())
    periods = {last - HOUR * back: Period(last - HOUR * back) for back in reversed(range(hours))}
    rows = (UsageHour.select(UsageHour.hour, UsageHour.endpoint, UsageHour.status, UsageHour.requests,
                             UsageHour.credits)
            .where(UsageHour.api_key.in_(key_ids) & (UsageHour.hour >= min(periods))).tuples())
    for hour, endpoint, status, requests, credits in rows:
        if hour in periods:
            periods[hour].add(endpoint, status, requests, credits)
    return list(periods.values())


def daily(key_ids, days=DAYS, now=None):
    """The last `days` UTC days (today last), every day present, for the keys."""
    today = (now or utcnow()).date()
    periods = {today - DAY * back: Period(today - DAY * back) for back in reversed(range(days))}
    rows = (UsageDay.select(UsageDay.day, UsageDay.endpoint, UsageDay.status, UsageDay.requests, UsageDay.credits)
            .where(UsageDay.api_key.in_(key_ids) & (UsageDay.day >= min(periods))).tuples())
    for day, endpoint, status, requests, credits in rows:
        if day in periods:
            periods[day].add(endpoint, status, requests, credits)
    return list(periods.values())


def daily_json(periods):
    return [period.as_json("day", period.start.isoformat()) for period in periods]


def history(key):
    """GET /api/v1/usage/history's answer for the key: its hours and days as the database holds them,
    kept with their JSON while nothing is committed (a usage flush commits every second) within the
    hour."""
    second = math.floor(time.time())
    hour = second - second % 3600
    hours, days, text = kept_histories.get((key.id, hour), lambda: (periods_json(key.id, utc_from_epoch(hour)), None))
    generated_at = iso_second(second)
    return Encoded(f'{{"api_key_name":{encode(key.name)},"generated_at":"{generated_at}",{text}}}',
                   api_key_name=key.name, generated_at=generated_at, hourly=hours, daily=days)


def periods_json(key_id, now):
    """(the key's hours, its days, both as the JSON members "hourly" and "daily")."""
    hours = [period.as_json("hour", iso_seconds(period.start)) for period in hourly([key_id], now=now)]
    days = daily_json(daily([key_id], now=now))
    return hours, days, f'"hourly":{encode(hours)},"daily":{encode(days)}'


def endpoints_of(periods):
    """Every endpoint the periods name, busiest first."""
    totals = collections.Counter()
    for period in periods:
        totals.update(period.by_endpoint)
    return [endpoint for endpoint, _ in totals.most_common()]
