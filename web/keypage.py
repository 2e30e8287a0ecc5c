"""A key's own page (/settings/security/keys/<KEY_ID>): its details, its requests per hour and per
day by outcome and by endpoint as charts drawn on the server (SVG, no script), and its actions; for
a key of another of the user's organisations, which one holds it and the switch there."""

from flask import abort, g, render_template

from keys.models import ImportedKey
from metering import analytics, credits
from models import SCOPES, ApiKey, Membership, Organisation, utcnow
from orgs import roles
from web import keyforms, security
from web.hooks import MAX_ID, login_required, page_blueprint

bp = page_blueprint("keys", __name__)

# The chart's drawing area in SVG units; the SVG scales to its box (at most 40rem wide).
WIDTH, HEIGHT, LEFT, BOTTOM, TOP = 400, 170, 34, 22, 8
RIGHT = 22  # room for the last tick's label
OUTCOME_ORDER = list(analytics.OUTCOMES)


class Chart:
    """Stacked bars of requests by outcome, one bar per period, with its data-table rows."""

    def __init__(self, title, periods, label, tick_every):
        self.title = title
        self.periods = periods
        self.total = sum(period.requests for period in periods)
        self.peak = max([period.requests for period in periods] + [1])
        step = (WIDTH - LEFT - RIGHT) / len(periods)
        plot = HEIGHT - BOTTOM - TOP
        self.bars, self.ticks, self.rows = [], [], []
        for index, period in enumerate(periods):
            outcomes = period.by_outcome()
            x, y = LEFT + index * step, HEIGHT - BOTTOM
            segments = []
            for name in OUTCOME_ORDER:
                height = outcomes[name] / self.peak * plot
                if height:
                    y -= height
                    segments.append({"outcome": name, "y": round(y, 2), "height": round(height, 2)})
            text = label(period.start)
            self.bars.append({"x": round(x + step * 0.1, 2), "width": round(step * 0.8, 2), "segments": segments,
                              "title": f"{text}: {period.requests} requests"})
            if index % tick_every == 0:
                self.ticks.append({"x": round(x + step / 2, 2), "text": text})
            self.rows.append([text, period.requests] + [outcomes[name] for name in OUTCOME_ORDER])


class EndpointChart:
    """Horizontal bars: each endpoint's requests over a span, busiest first."""

    def __init__(self, title, periods):
        self.title = title
        counts = {}
        for period in periods:
            for endpoint, requests in period.by_endpoint.items():
                counts[endpoint] = counts.get(endpoint, 0) + requests
        self.rows = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
        self.total = sum(counts.values())
        peak = max(counts.values(), default=1)
        self.bars = [{"endpoint": endpoint, "requests": requests, "y": index * 40,
                      "width": round(max(requests / peak * (WIDTH - 60), 1), 2)}
                     for index, (endpoint, requests) in enumerate(self.rows)]
        self.height = len(self.bars) * 40


@bp.get(f"/settings/security/keys/<int(max={MAX_ID}):key_id>")
@login_required
def key_page(key_id):
    if not ApiKey.select().where((ApiKey.id == key_id) & (ApiKey.org == g.org.id)).exists():
        return key_elsewhere(key_id)
    key = keyforms.org_key(key_id, roles.VIEW)
    now = utcnow()
    hours = analytics.hourly([key.id], now=now)
    days = analytics.daily([key.id], now=now)
    charts = [
        Chart("Requests per hour, last 24 hours", hours, lambda start: start.strftime("%H:00"), 6),
        Chart("Requests per day, last 7 days", days[-7:], lambda start: start.strftime("%a %d"), 1),
        Chart("Requests per day, last 30 days", days, lambda start: start.strftime("%b %d"), 7),
    ]
    endpoints = [EndpointChart("By endpoint, last 24 hours", hours),
                 EndpointChart("By endpoint, last 7 days", days[-7:]),
                 EndpointChart("By endpoint, last 30 days", days)]
    refill = key.credits_refill_interval
    return render_template("key_page.html", key=key, now=now, charts=charts, endpoints=endpoints,
                           creator=security.key_creators(g.org.id).get(key.user_id),
                           imported=ImportedKey.get_or_none(ImportedKey.key == key.id),
                           spent={"today": days[-1].credits, "week": sum(day.credits for day in days[-7:]),
                                  "month": sum(day.credits for day in days)},
                           credits_left=credits.effective_remaining(key, now),
                           next_refill=refill and credits.next_refill_at(refill, now),
                           outcomes=analytics.OUTCOMES, scopes=SCOPES, key_types=security.KEY_TYPES,
                           graces=security.GRACES,
                           geometry={"width": WIDTH, "height": HEIGHT, "left": LEFT, "bottom": BOTTOM, "top": TOP})


def key_elsewhere(key_id):
    """The page of a key that another of the user's organisations holds: which one, and a switch to
    it that comes back here. Any other id, a stranger's key or none, is the same 404."""
    found = (ApiKey.select(ApiKey.name, Organisation.name.alias("org_name"), Organisation.slug)
             .join(Organisation).join(Membership, on=(Membership.org == Organisation.id))
             .where((ApiKey.id == key_id) & (Membership.user == g.user.id)).dicts().first())
    if found is None:
        abort(404)
    return render_template("key_elsewhere.html", key_name=found["name"], org_name=found["org_name"],
                           org_slug=found["slug"])
