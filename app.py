"""The service: configuration, the app factory, error rendering and `python app.py`."""

if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["--version"]:
        import json
        from pathlib import Path

        print(json.loads((Path(__file__).resolve().parent / "openapi.json").read_text())["info"]["version"])
        raise SystemExit(0)
    # Before anything else is imported: where gunicorn cannot run, `python app.py` serves in this
    # process with gevent, whose patching of the standard library must come first.
    from serving import startup

    startup.prepare()

import gc

# Importing and building the app makes tens of thousands of tracked objects that live as long as
# the process: the collections they would set off meanwhile (a dozen of the older generations, one
# of them full) free next to nothing and took an eighth of the start, and every later full
# collection, and the last one at exit, would walk them all again. Once the app is built they are
# frozen out of the collector's way (as a serving process's whole heap is later, serving/warmup.py)
# and collecting resumes.
gc_was_enabled = gc.isenabled()
gc.disable()

# Before anything imports peewee, which imports PostgreSQL's driver whatever the URL (~60 ms):
# models.init_app loads it for a PostgreSQL URL only (store/pgdriver.py).
from store import pgdriver

pgdriver.import_peewee_without_driver()

import logging
import os
import secrets
import sys
import tempfile
from pathlib import Path

import click
from flask import json, render_template, request
from werkzeug.exceptions import HTTPException, InternalServerError, ServiceUnavailable
from werkzeug.middleware.proxy_fix import ProxyFix

import api
import models
import ratelimit
import settings
import sockets
from accounts import emailtokens, models as account_models, securitylog, users
from billing import models as billing_models, sealing, sender as billing_sender
from cli.audit import audit_command
from cli.billing import billing_cli
from cli.db import db_cli
from cli.keys import keys_cli
from cli.mail import mail_cli
from cli.orgs import orgs_cli
from cli.usage import usage_cli
from cli.users import users_cli
from cli.webhooks import webhooks_cli
from integrations import github
from keys import keycache, models as key_models
from mail import models as mail_models, notices, sender as mail_sender
from metering import lifecycle, thresholds, usage
from models import DATABASE_ERRORS, User
from ops import health, logs, metrics, services
from orgs import keyactions, members as org_members, models as org_models
from serving import bodylimit, cors, envelope, fastlane, startup
from serving.flaskapp import Service
from serving.forwarded import CheckedClientAddress
from web import (
    emailaddress as address_pages,
    home,
    hooks as page_hooks,
    invitations as invitation_pages,
    keyedit,
    keyforms,
    keypage,
    members as member_pages,
    organisation as organisation_pages,
    profile,
    recovery as recovery_pages,
    security,
    signin,
    webprotection,
)
from webhooks import (
    delivery as webhook_delivery,
    models as webhook_models,
    outbox as webhook_outbox,
    pages as webhook_pages,
)

ROOT = Path(__file__).resolve().parent
# The web application's view modules, each with its own blueprint (web/hooks.py makes them).
PAGE_MODULES = (home, signin, profile, security, keyforms, keyedit, keypage, webprotection, address_pages,
                recovery_pages, member_pages, organisation_pages, invitation_pages, webhook_pages)
INSTANCE = settings.INSTANCE

log = logging.getLogger(__name__)


def load_config(environ=os.environ):
    """Return every setting of the contract's configuration table, defaults filled in (settings/
    parses and checks them); an unset SECRET_KEY is the one kept in instance/."""
    config = settings.load(environ)
    config["SECRET_KEY"] = config["SECRET_KEY"] or instance_secret_key()
    return config


def instance_secret_key():
    """Return the session secret kept in instance/, generating it on first use; workers that start
    together all get the one written first."""
    path = INSTANCE / "secret_key"
    if not path.exists():
        make_instance_folder()
        # Written whole under a name of its own (0600), then linked into place: the secret_key file
        # appears once, with its content, and another process never reads it half written.
        fd, written = tempfile.mkstemp(prefix=".secret_key-", dir=INSTANCE)
        try:
            with os.fdopen(fd, "w") as file:
                file.write(secrets.token_hex())
            try:
                os.link(written, path)
            except FileExistsError:
                pass  # another process's secret came first
        finally:
            os.remove(written)
    return path.read_text().strip()


def make_instance_folder():
    """instance/ holds the session secret and the database: its owner's alone."""
    INSTANCE.mkdir(mode=0o700, exist_ok=True)
    # Windows has no such mode bits (chmod sets only read-only); a folder in the user's profile is
    # the user's alone by its access list.
    if os.name != "nt" and INSTANCE.stat().st_mode & 0o077:
        INSTANCE.chmod(0o700)


def create_app(overrides=None):
    """Build the Flask app from the environment, then apply overrides (tests use them)."""
    app = Service(__name__, instance_path=str(INSTANCE), static_folder="static")
    app.config.from_mapping(load_config())
    if overrides:
        app.config.update(overrides)
    configure_logging(app.config["LOG_FORMAT"])
    if app.config["DATABASE_URL"].startswith(f"sqlite:///{INSTANCE}"):
        make_instance_folder()

    bodylimit.init_app(app)
    # Before every room: their init_app register their background services.
    services.init_app(app)
    models.init_app(app, [*account_models.PROTECTION_MODELS, *webhook_models.MODELS, *mail_models.MODELS,
                          *emailtokens.MODELS, *org_models.MODELS, *key_models.MODELS, *billing_models.MODELS])
    # Key changes reach the security log, webhooks and notices through keys/events.py's signal, account
    # events the notices through the security log's, an account's deletion its invitations through
    # orgs/organisations.py's; the hot path's thresholds wait for the usage flush.
    securitylog.init_app(app)
    notices.init_app(app)
    org_members.init_app(app)
    webhook_events = webhook_outbox.init_app(app)
    ratelimit.init_app(app, thresholds.Watcher(webhook_events.add))
    keycache.init_app(app)
    # With the export on, an hour read for billing never grows (billing/sealing.py).
    usage.init_app(app, riders=[webhook_events],
                   open_hour=sealing.open_hour if app.config["BILLING_EXPORT"] != "off" else None)
    lifecycle.init_app(app)
    app.register_blueprint(api.api)
    github.init_app(app)
    cors.init_app(app)
    health.init_app(app)
    metrics.init_app(app)
    sockets.init_app(app)
    page_hooks.init_app(app)
    for view_module in PAGE_MODULES:
        app.register_blueprint(view_module.bp)
    webhook_delivery.init_app(app)
    mail_sender.init_app(app)
    billing_sender.init_app(app)
    app.register_error_handler(HTTPException, render_http_error)
    for database_error in DATABASE_ERRORS:
        app.register_error_handler(database_error, render_database_error)
    app.register_error_handler(Exception, render_unexpected_error)
    for command in (users_cli, keys_cli, db_cli, usage_cli, audit_command, webhooks_cli, mail_cli, orgs_cli,
                    billing_cli):
        app.cli.add_command(command)

    # Last: the lane serves only while every hook registered by now would do nothing for its requests.
    # Each middleware is called as a bound method, which the interpreter runs in the caller's C
    # frame; calling an instance goes through its type's C slot, a new C frame that every open
    # WebSocket keeps on its saved stack (~0.7 KiB each) for its whole life.
    app.wsgi_app = fastlane.Lane(app, app.wsgi_app).__call__
    proxies = app.config["TRUSTED_PROXIES"]
    if proxies:
        app.wsgi_app = ProxyFix(CheckedClientAddress(app.wsgi_app).__call__, x_for=proxies, x_proto=proxies).__call__
    app.wsgi_app = envelope.Envelope(app).__call__
    return app


def close_app(app):
    """Stop what the app runs in the background (ops/services.py: the webhook sender, the time
    sockets' ticker, the pruner, the usage flusher after writing what is pending, the memory
    storage's sweep): no thread outlives it."""
    services.stop(app)


def configure_logging(log_format):
    """Log INFO and above to stderr, unless something (gunicorn's logconfig, pytest) already set up
    the root logger; every handler redacts keys and tags the request's lines with its id."""
    root = logging.getLogger()
    if not root.handlers:
        root.addHandler(logging.StreamHandler())
        root.setLevel(logging.INFO)
        logs.prepare_handlers(root, log_format, logs.text_formatter())
    else:
        logs.prepare_handlers(root, log_format)


def render_http_error(error):
    """Render any HTTP error as {"error": {"code", "message"}}, keeping its status and headers; a
    browser (a client that prefers HTML) gets templates/error.html anywhere outside the API."""
    response = error.get_response()
    if not request.path.startswith(envelope.API_PREFIX) and prefers_html():
        own = error.description == type(error).description and PAGE_SENTENCES.get(error.code)
        response.set_data(render_template("error.html", error=error, sentence=own or error.description))
        response.content_type = "text/html; charset=utf-8"
        return response
    code = getattr(error, "error_code", None) or ERROR_CODES.get(error.code) or snake_case(error.name)
    response.set_data(json.dumps({"error": {"code": code, "message": error.description}}, separators=(",", ":")))
    response.content_type = "application/json"
    return response


ERROR_CODES = {413: "payload_too_large", 500: "internal_error"}
# The pages' own words where an error has Werkzeug's ("... please check your spelling ...").
PAGE_SENTENCES = {
    403: "Your role in this organisation does not allow this.",
    404: "There is nothing here: the address is mistyped or out of date, or what it named is gone or not yours to see.",
}


def prefers_html():
    return request.accept_mimetypes.best_match(["application/json", "text/html"]) == "text/html"


def snake_case(text):
    return text.lower().replace(" ", "_").replace("-", "_")


def render_database_error(error):
    log.error("Database unavailable: %s", error)
    return render_http_error(ServiceUnavailable("The database is unavailable; try again shortly."))


def render_unexpected_error(error):
    log.exception("Unhandled error on %s %s", request.method, request.path)
    return render_http_error(InternalServerError("Something went wrong on our side."))


DEMO_KEY_COMMAND = 'flask --app app keys create demo --name "Demo key" --type development'


def seed_demo(base_url):
    """On an empty database, create user demo with a Development key and print the key once; on
    later starts, print how to make a new one."""
    if User.select().exists():
        if User.select().where(User.username == "demo").exists():
            print(f"To make a new demo key: {DEMO_KEY_COMMAND}", flush=True)
        return
    user = users.create_user("demo", "demo@example.com", secrets.token_urlsafe(24))
    _, secret = keyactions.issue_key(user, "Demo key", "development")
    print(
        "Created user 'demo' with a Development API key. It is shown only this once:\n\n"
        f"    {secret}\n\nTry it:\n\n"
        f'    curl -H "X-API-Key: {secret}" {base_url}/api/v1/protected/test\n',
        flush=True,
    )


def serve(config):
    """Seed the demo user, then serve: as gunicorn with the gevent worker, as the Procfile runs it,
    or where gunicorn cannot run, with gevent's WSGI server in this process (serving/devserver.py)."""
    host, port = config["HOST"], config["PORT"]
    startup.refuse_busy_port(host, port)
    shown_host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    with app.app_context():
        seed_demo(f"http://{shown_host}:{port}")
    if startup.gunicorn_unavailable is not None:
        # Here only: gevent's WSGI server is not what a worker or a CLI command needs.
        from serving import devserver

        devserver.serve(app, host, port, startup.gunicorn_unavailable)
        return
    models.db.close()
    os.execvp(sys.executable, [
        sys.executable, "-m", "gunicorn",
        "--config", str(ROOT / "gunicorn.conf.py"),
        "--chdir", str(ROOT),
        "--bind", f"{host}:{port}",
        "app:app",
    ])


try:
    app = create_app()
except settings.ConfigError as error:
    # `python app.py` and the flask command (a click command is running) end on the sentence. In a
    # gunicorn worker it is raised: the master checked the settings before forking
    # (gunicorn.conf.py), and gunicorn stops on a worker that fails to boot but would start one
    # that exits with 2 again and again.
    if __name__ != "__main__" and click.get_current_context(silent=True) is None:
        raise
    settings.exit_with(error)
finally:
    if gc_was_enabled:
        gc.freeze()
        gc.enable()

if __name__ == "__main__":
    serve(app.config)
