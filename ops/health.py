"""GET /healthz (the process serves) and GET /readyz (the database and the limit storage answer),
for a platform's health checks: outside the rate limits, and each check bounded in time."""

import contextvars
import logging
import math
import time

import gevent
import gevent.lock
from flask import Blueprint, current_app

import models
from store.connections import discard_connection

log = logging.getLogger(__name__)

CHECK_SECONDS = 2

bp = Blueprint("health", __name__)


def init_app(app):
    app.extensions["readiness"] = Readiness(app.extensions["ratelimit"].storage)
    app.register_blueprint(bp)


@bp.after_request
def never_cache(response):
    response.headers["Cache-Control"] = "no-store"
    return response


@bp.get("/healthz")
def healthz():
    return {"status": "ok"}


@bp.get("/readyz")
def readyz():
    checks = current_app.extensions["readiness"].checks()
    if all(result == "ok" for result in checks.values()):
        return {"status": "ready", "checks": checks}
    return {"status": "unavailable", "checks": checks}, 503


class Readiness:
    """The worker's latest answer: at most one check runs at a time (requests that arrive meanwhile
    wait for it) and an answer is reused for REUSE_SECONDS, so a flood of /readyz costs the
    database and the limit storage at most one check a second."""

    REUSE_SECONDS = 1.0

    def __init__(self, storage):
        self.storage = storage
        self.lock = gevent.lock.Semaphore()
        self.answer = None
        self.answered_at = -math.inf

    def checks(self):
        with self.lock:
            if time.monotonic() - self.answered_at >= self.REUSE_SECONDS:
                # Both at once, so the answer comes within CHECK_SECONDS even when both hang. A new
                # greenlet starts with empty context variables: give each the request's (its id).
                database = gevent.spawn(contextvars.copy_context().run, within_deadline, "database",
                                        check_database)
                limit_storage = gevent.spawn(contextvars.copy_context().run, within_deadline,
                                             "rate-limit storage", self.storage.check)
                gevent.joinall([database, limit_storage])
                self.answer = {"database": database.value, "limit_storage": limit_storage.value}
                self.answered_at = time.monotonic()
            return self.answer


def within_deadline(name, check):
    """Run check, which returns False or raises when the dependency cannot be used; return "ok"
    or a sentence. Errors are logged, not shown: they can name hosts and ports."""
    started = time.monotonic()
    deadline = gevent.Timeout(CHECK_SECONDS)
    try:
        with deadline:
            answered = check()
    except gevent.Timeout as timeout:
        if timeout is not deadline:
            raise
        answered = False
    except Exception as error:
        log.warning("Readiness: the %s failed: %s", name, error)
        return f"The {name} cannot be reached."
    if answered is False:
        # limits' own check turns any failure into False, our deadline included.
        if time.monotonic() - started >= CHECK_SECONDS:
            return f"The {name} did not answer within {CHECK_SECONDS} seconds."
        return f"The {name} does not answer."
    return "ok"


def check_database():
    """Read a table of ours: SQLite answers `SELECT 1` without opening the file."""
    database = models.db.obj
    try:
        database.execute_sql("SELECT version FROM schema_version")
    except BaseException:
        # A query cut short by the deadline leaves its connection mid-conversation.
        discard_connection(database)
        raise
    finally:
        models.release_connection(database)
