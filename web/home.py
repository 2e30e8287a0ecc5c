"""The open pages and the playground: the landing page with the endpoints, the reference (/docs),
and the playground, which calls the API with one of the organisation's keys."""

from flask import g, render_template

from models import ApiKey
from web import reference
from web.hooks import login_required, page_blueprint

bp = page_blueprint("home", __name__)

ENDPOINTS = [
    ("GET", "/api/v1/demo/year", "public"),
    ("GET", "/api/v1/status", "public"),
    ("GET", "/api/v1/protected/test", "API key"),
    ("GET", "/api/v1/user/me", "API key"),
    ("GET", "/api/v1/usage/stats", "API key"),
    ("GET", "/api/v1/usage/history", "API key"),
]


@bp.get("/")
def landing():
    return render_template("landing.html", endpoints=ENDPOINTS)


@bp.get("/docs")
def docs():
    return render_template("docs.html", page=reference.PAGE)


@bp.get("/playground")
@login_required
def playground():
    return render_template("playground.html", keys=ApiKey.active_in(g.org), endpoints=ENDPOINTS)
