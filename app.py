"""The service: configuration, the app factory, the REST API, error rendering and the CLI."""

import logging
import math
import os
import re
import secrets
import sys
from pathlib import Path

import click
import peewee
from flask import Blueprint, Flask, g, json, render_template, request
from flask.cli import AppGroup
from playhouse.pool import MaxConnectionsExceeded
from werkzeug.exceptions import HTTPException, InternalServerError, ServiceUnavailable
from werkzeug.middleware.proxy_fix import ProxyFix

import accounts
import auth
import logs
import models
import ratelimit
import sockets
import web
from auth import require_api_key
from models import ApiKey, User, iso_ms, iso_seconds, utc_from_epoch
from ratelimit import ip_rate_limited

VERSION = "1.0.0"
ROOT = Path(__file__).resolve().parent
INSTANCE = ROOT / "instance"
OPENAPI = json.loads((ROOT / "openapi.json").read_text())

log = logging.getLogger(__name__)

DATABASE_ERRORS = (peewee.OperationalError, peewee.InterfaceError, MaxConnectionsExceeded)


def load_config(environ=os.environ):
    """Return every setting of the contract's configuration table, defaults filled in."""
    return {
        "DATABASE_URL": environ.get("DATABASE_URL") or f"sqlite:///{INSTANCE / 'service.db'}",
        "SECRET_KEY": environ.get("SECRET_KEY") or instance_secret_key(),
        "RATELIMIT_STORAGE_URL": environ.get("RATELIMIT_STORAGE_URL") or "memory://",
        "RATE_LIMIT_TIERS": environ.get("RATE_LIMIT_TIERS") or "free=1000/hour",
        "PUBLIC_RATE_LIMIT": environ.get("PUBLIC_RATE_LIMIT") or "600/minute",
        "TRUSTED_PROXIES": int(environ.get("TRUSTED_PROXIES") or 0),
        "HOST": environ.get("HOST") or "127.0.0.1",
        "PORT": int(environ.get("PORT") or 5000),
        "WS_SEND_TIMEOUT": seconds(environ, "WS_SEND_TIMEOUT", 30),
        "MAX_KEYS_PER_USER": count(environ, "MAX_KEYS_PER_USER", 20),
    }


def count(environ, name, default):
    """A whole number of at least 1 from the environment, or a sentence saying what is wrong."""
    text = environ.get(name) or str(default)
    if not re.fullmatch(r"\s*[0-9]+\s*", text) or int(text) < 1:
        raise ValueError(f"{name} must be a whole number of at least 1, not {text!r}.")
    return int(text)


def seconds(environ, name, default):
    """A positive number of seconds from the environment, or a sentence saying what is wrong."""
    text = environ.get(name) or str(default)
    try:
        value = float(text)
    except ValueError:
        value = 0
    if not 0 < value < float("inf"):
        raise ValueError(f"{name} must be a number of seconds above 0, not {text!r}.")
    return value


def instance_secret_key():
    """Return the session secret kept in instance/, generating it on first use."""
    path = INSTANCE / "secret_key"
    if not path.exists():
        make_instance_folder()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as file:
            file.write(secrets.token_hex())
    return path.read_text().strip()


def make_instance_folder():
    """instance/ holds the session secret and the database: its owner's alone."""
    INSTANCE.mkdir(mode=0o700, exist_ok=True)
    if INSTANCE.stat().st_mode & 0o077:
        INSTANCE.chmod(0o700)


class Service(Flask):
    def make_default_options_response(self):
        """OPTIONS: 204 with Allow and no body (Flask's own is a 200 with an empty HTML body)."""
        response = super().make_default_options_response()
        response.status_code = 204
        del response.headers["Content-Type"]
        return response


def create_app(overrides=None):
    """Build the Flask app from the environment, then apply overrides (tests use them)."""
    app = Service(__name__, instance_path=str(INSTANCE), static_folder="static")
    app.config.from_mapping(load_config())
    if overrides:
        app.config.update(overrides)
    app.json.sort_keys = False
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logs.redact_handlers(logging.getLogger())
    if app.config["DATABASE_URL"].startswith(f"sqlite:///{INSTANCE}"):
        make_instance_folder()

    models.init_app(app)
    ratelimit.init_app(app)
    app.register_blueprint(api)
    app.after_request(add_response_headers)
    sockets.init_app(app)
    web.init_app(app)
    app.register_error_handler(HTTPException, render_http_error)
    for database_error in DATABASE_ERRORS:
        app.register_error_handler(database_error, render_database_error)
    app.register_error_handler(Exception, render_unexpected_error)
    app.cli.add_command(users_cli)
    app.cli.add_command(keys_cli)

    proxies = app.config["TRUSTED_PROXIES"]
    if proxies:
        app.wsgi_app = ProxyFix(app.wsgi_app, x_for=proxies, x_proto=proxies)
    return app


def add_response_headers(response):
    """Forbid caching and MIME sniffing of every API response, errors included; over HTTPS, tell
    browsers to come back only over HTTPS."""
    if request.path.startswith(web.API_PREFIX):
        # X-API-Key is not Authorization, so HTTP caches may store keyed responses unless told not to.
        response.headers["Cache-Control"] = "no-store"
        response.headers["X-Content-Type-Options"] = "nosniff"
    if request.is_secure:
        response.headers["Strict-Transport-Security"] = "max-age=31536000"
    return response


def render_http_error(error):
    """Render any HTTP error as {"error": {"code", "message"}}, keeping its status and headers; a
    browser (a client that prefers HTML) gets templates/error.html anywhere outside the API."""
    response = error.get_response()
    if not request.path.startswith(web.API_PREFIX) and prefers_html():
        response.set_data(render_template("error.html", error=error))
        response.content_type = "text/html; charset=utf-8"
        return response
    code = getattr(error, "error_code", None) or ERROR_CODES.get(error.code) or snake_case(error.name)
    response.set_data(json.dumps({"error": {"code": code, "message": error.description}}, separators=(",", ":")))
    response.content_type = "application/json"
    return response


ERROR_CODES = {500: "internal_error"}


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


api = Blueprint("api", __name__, url_prefix="/api/v1")


@api.get("/demo/year")
@ip_rate_limited
def demo_year():
    now = models.utcnow()
    return {"year": now.year, "message": f"The current year is {now.year}.", "timestamp": iso_ms(now)}


@api.get("/status")
@ip_rate_limited
def status():
    try:
        authenticated = bool(auth.authenticate(request.headers.get("X-API-Key")))
    except auth.ApiKeyError:
        authenticated = False
    return {"status": "operational", "version": VERSION, "authenticated": authenticated}


@api.get("/protected/test")
@require_api_key
def protected_test():
    key = g.api_key
    return {
        "success": True,
        "message": "Your API key is valid.",
        "api_key_name": key.name,
        "api_key_type": key.key_type,
        "rate_limit_tier": key.rate_limit_tier,
        "timestamp": models.now_strings()[0],
    }


@api.get("/user/me")
@require_api_key
def user_me():
    user = User.get_by_id(g.api_key.user_id)
    return {
        "user_id": user.id,
        "username": user.username,
        "email": user.email,
        "created_at": iso_seconds(user.created_at),
        "api_key_count": ApiKey.active_for(user).count(),
    }


@api.get("/usage/stats")
@require_api_key
def usage_stats():
    key, window = g.api_key, g.rate_limit
    return {
        "api_key_name": key.name,
        "total_requests": ratelimit.total_requests(key),
        "rate_limit_tier": key.rate_limit_tier,
        "requests_remaining": window.remaining,
        "reset_time": iso_seconds(utc_from_epoch(math.ceil(window.reset))),
    }


@api.get("/openapi.json")
@ip_rate_limited
def openapi_document():
    return OPENAPI


class CommandGroup(AppGroup):
    """Commands whose database cannot be reached or written end with a sentence, not a traceback."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except DATABASE_ERRORS as error:
            raise click.ClickException(f"The database cannot be used right now: {error}") from None


users_cli = CommandGroup("users", help="Manage users.")
keys_cli = CommandGroup("keys", help="Manage API keys.")


def find_user(username):
    if accounts.CONTROL_CHARACTERS.search(username):
        raise click.ClickException("A username cannot contain control characters.")
    user = accounts.find_user(username)
    if user is None:
        raise click.ClickException(f"There is no user named {username!r}.")
    return user


def has_terminal():
    return sys.stdin.isatty()


@users_cli.command("create")
@click.argument("username")
@click.option("--email", required=True, help="The user's email address.")
@click.option("--password-stdin", is_flag=True, help="Read the password from the first line of stdin.")
def create_user_command(username, email, password_stdin):
    """Create a user."""
    if password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    elif not has_terminal():
        raise click.ClickException("No terminal to prompt for a password; use --password-stdin.")
    else:
        password = click.prompt("Password", hide_input=True, confirmation_prompt=True)
    try:
        user = accounts.create_user(username, email, password)
    except ValueError as error:
        raise click.ClickException(str(error)) from None
    click.echo(f"Created user {user.username} (id {user.id}).")


@keys_cli.command("create")
@click.argument("username")
@click.option("--name", required=True, help="A name for the key.")
@click.option("--type", "key_type", required=True, type=click.Choice(sorted(auth.KEY_PREFIXES)))
@click.option("--tier", default="free", show_default=True, help="A tier of RATE_LIMIT_TIERS.")
def create_key_command(username, name, key_type, tier):
    """Create an API key; its secret is printed once, alone on the last line."""
    user = find_user(username)
    try:
        key, secret = auth.issue_key(user, name, key_type, tier)
    except ValueError as error:
        raise click.ClickException(str(error)) from None
    click.echo(f"Created {key.key_type} key {key.name!r} (id {key.id}) for {user.username}.")
    click.echo("Copy the secret now; it is not stored and cannot be shown again:")
    click.echo(secret)


@keys_cli.command("list")
@click.argument("username")
def list_keys_command(username):
    """List a user's keys: id, name, type, prefix, tier, status (tab-separated; never the secret)."""
    user = find_user(username)
    for key in ApiKey.select().where(ApiKey.user == user).order_by(ApiKey.id):
        state = "revoked" if key.revoked_at else "active"
        fields = (key.id, key.name, key.key_type, f"{key.display_prefix}...", key.rate_limit_tier, state)
        click.echo("\t".join(map(str, fields)))


@keys_cli.command("revoke")
@click.argument("key_id", type=int)
def revoke_key_command(key_id):
    """Revoke a key; it fails from the next request on."""
    key = ApiKey.get_or_none(ApiKey.id == key_id)
    if key is None:
        raise click.ClickException(f"There is no API key with id {key_id}.")
    if key.revoked_at:
        click.echo(f"Key {key_id} was already revoked.")
        return
    auth.revoke_key(key)
    click.echo(f"Revoked key {key_id} ({key.name!r}).")


def seed_demo(base_url):
    """On an empty database, create user demo with a Development key and print the key once."""
    if User.select().exists():
        return
    user = accounts.create_user("demo", "demo@example.com", secrets.token_urlsafe(24))
    _, secret = auth.issue_key(user, "Demo key", "development")
    print(
        "Created user 'demo' with a Development API key. It is shown only this once:\n\n"
        f"    {secret}\n\nTry it:\n\n"
        f'    curl -H "X-API-Key: {secret}" {base_url}/api/v1/protected/test\n',
        flush=True,
    )


def serve(config):
    """Seed the demo user, then become gunicorn with the gevent worker, as the Procfile runs it."""
    host, port = config["HOST"], config["PORT"]
    shown_host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    with app.app_context():
        seed_demo(f"http://{shown_host}:{port}")
    models.db.close()
    os.execvp(sys.executable, [
        sys.executable, "-m", "gunicorn",
        "--config", str(ROOT / "gunicorn.conf.py"),
        "--chdir", str(ROOT),
        "--bind", f"{host}:{port}",
        "app:app",
    ])


app = create_app()

if __name__ == "__main__":
    serve(app.config)
