"""Configuration errors: settings/ names the variable of every value it refuses, in one sentence
and one exception type; every entry point (`python app.py` in both run modes, gunicorn, the flask
command) prints that sentence on one line and exits with status 2; gunicorn's master checks before
it forks a worker, importing nothing the workers must import after gevent's patching."""

import subprocess
import sys

import limits.storage  # noqa: F401  registers limits' storage schemes
import playhouse.db_url
import pytest
from limits._storage_scheme import SCHEMES
from liveserver import ROOT, free_port, service_env, without_gunicorn

import settings
from settings.billing import billing_meters, billing_retry_schedule

BAD_VALUES = [
    ("USAGE_HOURLY_RETENTION_DAYS", "ninety"),
    ("REVOKED_KEY_RETENTION_DAYS", "-1"),
    ("MAX_KEYS_PER_USER", "0"),
    ("MAX_BODY_BYTES", "1000"),
    ("PASSWORD_HASH_COST", "20000"),
    ("WS_SEND_TIMEOUT", "soon"),
    ("PORT", "abc"),
    ("PORT", "70000"),
    ("WEB_CONCURRENCY", "two"),
    ("TRUSTED_PROXIES", "x"),
    ("RATE_LIMIT_TIERS", "free"),
    ("RATE_LIMIT_TIERS", "free=10/fortnight"),
    ("PUBLIC_RATE_LIMIT", "5"),
    ("ACCOUNT_RATE_LIMIT", "lots"),
    ("RATE_LIMIT_ON_STORAGE_FAILURE", "fail-open"),
    ("ACCOUNT_RATE_LIMIT", "10/second+100/hour"),
    ("RATE_LIMIT_TIERS", "free=1/second+2/second"),
    ("LOG_FORMAT", "xml"),
    ("METRICS_TOKEN", "short"),
    ("CORS_ORIGINS", "https://app.example.com/"),
    ("WEBAUTHN_RP_ID", "https://example.com"),
    ("WEBAUTHN_ORIGIN", "example.com"),
    ("DATABASE_URL", "mysql://user:hunter2@db/service"),
    ("DATABASE_URL", "service.db"),
    ("RATELIMIT_STORAGE_URL", "redis://:hunter2@cache:abc/0"),
    ("RATELIMIT_STORAGE_URL", "memcache://cache:11211"),
    ("RATELIMIT_STORAGE_URL", "redis+sentinel://:hunter2@cache:26379"),
    ("WEBHOOK_RETRY_SCHEDULE", "5s,soon"),
    ("WEBHOOK_ALLOW_PRIVATE", "perhaps"),
    ("MAIL_URL", "smtp://user:hunter2@mail.example.com:port"),
    ("MAIL_URL", "http://mail.example.com"),
    ("MAIL_URL", "smtp://user:hunter2@/"),
    ("MAIL_URL", "smtps://user:hunter2@mail.example.com/inbox"),
    ("MAIL_FROM", "no address"),
    ("MAIL_FROM", "a@example.com, b@example.com"),
    ("MAIL_FROM", "Demo <a@example.com>\r\nBcc: b@example.com"),
    ("PUBLIC_URL", "api.example.com"),
    ("PUBLIC_URL", "https://api.example.com/?next=x"),
    ("MAIL_RETRY_SCHEDULE", "5s,later"),
    ("GITHUB_SECRET_SCANNING", "yes"),
    ("GITHUB_SECRET_SCANNING_KEYS_URL", "ftp://user:hunter2@keys.example.com/keys"),
    ("GITHUB_SECRET_SCANNING_KEYS_URL", "https://user:hunter2@/keys"),
    ("GITHUB_SECRET_SCANNING_KEYS_URL", "https://user:hunter2@keys.example.com:port/keys"),
    ("BILLING_EXPORT", "paypal"),
    ("BILLING_URL", "ftp://user:hunter2@billing.example.com"),
    ("BILLING_METERS", "requests="),
    ("BILLING_METERS", "requests=a,requests=b"),
    ("BILLING_METERS", "seconds=api_seconds"),
    ("BILLING_RETRY_SCHEDULE", "1m,never"),
    ("BILLING_METERS", "requests=usage,credits=usage"),
    ("BILLING_API_KEY", "sk_live_hunter2\nhunter2"),
]


@pytest.mark.parametrize("name, value", BAD_VALUES)
def test_every_bad_value_is_a_config_error_naming_its_variable(name, value):
    with pytest.raises(settings.ConfigError) as refused:
        settings.load({name: value})
    sentence = str(refused.value)
    assert name in sentence and "\n" not in sentence and sentence.endswith(".")
    # A URL's password never reaches the terminal or a log.
    assert "hunter2" not in sentence


def test_the_defaults_pass_and_the_variables_are_read_as_given():
    assert settings.load({})["PORT"] == 5000
    config = settings.load({"DATABASE_URL": "postgresql://u:p@db/name", "PORT": "8080", "WEB_CONCURRENCY": "3",
                            "RATELIMIT_STORAGE_URL": "redis+sentinel://a:26379,b:26379/mymaster",
                            "PUBLIC_RATE_LIMIT": "Off", "TRUSTED_PROXIES": "0"})
    assert (config["DATABASE_URL"], config["PORT"], config["WEB_CONCURRENCY"]) == ("postgresql://u:p@db/name", 8080, 3)
    assert config["RATELIMIT_STORAGE_URL"] == "redis+sentinel://a:26379,b:26379/mymaster"
    assert settings.public_rate(config["PUBLIC_RATE_LIMIT"]) is None


@pytest.mark.parametrize("more, named", [
    ({"BILLING_EXPORT": "stripe"}, "BILLING_API_KEY"),
    ({"BILLING_EXPORT": "lago", "BILLING_API_KEY": "k"}, "BILLING_URL"),
    ({"BILLING_EXPORT": "lago", "BILLING_URL": "https://api.getlago.com"}, "BILLING_API_KEY"),
    ({"BILLING_EXPORT": "openmeter"}, "BILLING_URL"),
])
def test_an_export_without_its_address_or_secret_is_refused(more, named):
    with pytest.raises(settings.ConfigError, match=named):
        settings.load(more)


def test_the_billing_settings_are_read_as_given():
    defaults = settings.load({})
    assert (defaults["BILLING_EXPORT"], defaults["BILLING_URL"], defaults["BILLING_API_KEY"]) == ("off", "", "")
    assert billing_meters(defaults["BILLING_METERS"]) == {"requests": "api_requests", "credits": "api_credits"}
    assert billing_retry_schedule(defaults["BILLING_RETRY_SCHEDULE"]) == [60, 300, 1800, 7200, 21600, 43200, 86400]
    stripe = settings.load({"BILLING_EXPORT": " Stripe ", "BILLING_API_KEY": "sk_test_1",
                            "BILLING_METERS": "credits=c"})
    assert (stripe["BILLING_EXPORT"], stripe["BILLING_URL"]) == ("stripe", "https://api.stripe.com")
    assert billing_meters(stripe["BILLING_METERS"]) == {"credits": "c"}
    sink = settings.load({"BILLING_EXPORT": "cloudevents", "BILLING_URL": "http://127.0.0.1:9000/events/"})
    assert (sink["BILLING_URL"], sink["BILLING_API_KEY"]) == ("http://127.0.0.1:9000/events", "")


@pytest.mark.parametrize("more", [{}, {"PUBLIC_URL": "https://api.example.com"},
                                  {"WEBAUTHN_ORIGIN": "https://api.example.com"}])
def test_mail_sent_by_smtp_needs_the_sites_address_for_its_links(more):
    if more:
        assert settings.load({"MAIL_URL": "smtps://u:hunter2@mail.example.com", **more})["MAIL_URL"]
        return
    with pytest.raises(settings.ConfigError) as refused:
        settings.load({"MAIL_URL": "smtps://u:hunter2@mail.example.com"})
    assert str(refused.value).startswith("PUBLIC_URL must be the site's address")
    assert "hunter2" not in str(refused.value)
    assert settings.load({"MAIL_URL": "console"})["PUBLIC_URL"] == ""


def test_the_mail_settings_are_read_as_given():
    config = settings.load({"MAIL_URL": "smtp://apikey:p%40ss@smtp.example.com", "PUBLIC_URL": "https://api.example.com/",
                            "MAIL_FROM": "Demo <no-reply@example.com>", "MAIL_RETRY_SCHEDULE": "1m,1h"})
    server = settings.mail_url(config["MAIL_URL"])
    assert (server.scheme, server.host, server.port, server.user, server.password) == (
        "smtp", "smtp.example.com", 587, "apikey", "p@ss")
    assert repr(server) == "smtp://smtp.example.com:587" and not server.loopback
    assert settings.mail_url("smtps://mail.example.com").port == 465
    assert settings.mail_url("smtp://[::1]:2525").loopback and settings.mail_url("SMTP://localhost").loopback
    assert (config["PUBLIC_URL"], config["MAIL_FROM"]) == ("https://api.example.com", "Demo <no-reply@example.com>")
    assert settings.mail_retry_schedule(config["MAIL_RETRY_SCHEDULE"]) == [60, 3600]
    assert settings.load({})["MAIL_URL"] == "console" and settings.mail_url("Off").scheme == "off"


def test_the_github_settings_are_read_as_given():
    assert {name: value for name, value in settings.load({}).items() if name.startswith("GITHUB_")} == {
        "GITHUB_SECRET_SCANNING": False,
        "GITHUB_SECRET_SCANNING_KEYS_URL": "https://api.github.com/meta/public_keys/secret_scanning"}
    config = settings.load({"GITHUB_SECRET_SCANNING": " On ", "GITHUB_SECRET_SCANNING_KEYS_URL": "http://127.0.0.1:8080/k"})
    assert (config["GITHUB_SECRET_SCANNING"], config["GITHUB_SECRET_SCANNING_KEYS_URL"]) == (True, "http://127.0.0.1:8080/k")


def test_the_schemes_are_those_the_libraries_know():
    assert settings.DATABASE_SCHEMES <= set(playhouse.db_url.schemes)
    assert {scheme for scheme in playhouse.db_url.schemes if scheme.startswith(("sqlite", "postgres", "psycopg"))
            } == settings.DATABASE_SCHEMES
    assert settings.STORAGE_SCHEMES == {scheme for scheme in SCHEMES if not scheme.startswith("async+")}


def test_a_storage_the_library_refuses_is_a_config_error(tmp_path):
    from app import create_app

    # Without pymemcache, which the service does not install.
    with pytest.raises(settings.ConfigError, match="RATELIMIT_STORAGE_URL cannot be used: 'pymemcache'"):
        create_app({"DATABASE_URL": f"sqlite:///{tmp_path}/memcached.db",
                    "RATELIMIT_STORAGE_URL": "memcached://127.0.0.1:11211"})


def test_the_master_s_check_imports_nothing_the_workers_must_import_patched(tmp_path):
    # What the master imports, its forked workers hold already imported, before gevent patches them.
    loaded = subprocess.run(
        [sys.executable, "-c", "import runpy, sys; runpy.run_path('gunicorn.conf.py'); print(*sorted(sys.modules))"],
        cwd=ROOT, env=service_env(tmp_path), capture_output=True, text=True, timeout=60, check=True).stdout.split()
    heavy = {"app", "models", "ratelimit", "peewee", "playhouse", "limits", "redis", "psycopg", "flask"}
    assert "settings" in loaded
    assert not heavy & {name.split(".")[0] for name in loaded}


def assert_one_line_error(result, name):
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
    assert name in result.stderr


def run(argv, env, tmp_path):
    return subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)


ENTRY_POINT_CASES = [("USAGE_HOURLY_RETENTION_DAYS", "ninety"), ("RATE_LIMIT_TIERS", "free=abc"), ("PORT", "abc"),
                     ("TRUSTED_PROXIES", "x"), ("RATELIMIT_STORAGE_URL", "redis://cache:abc/0")]


@pytest.mark.parametrize("name, value", ENTRY_POINT_CASES)
def test_the_flask_command_ends_on_one_line(tmp_path, name, value):
    env = service_env(tmp_path, **{name: value})
    assert_one_line_error(run([sys.executable, "-m", "flask", "--app", str(ROOT / "app.py"), "keys", "list", "demo"],
                              env, tmp_path), name)


@pytest.mark.parametrize("name, value", ENTRY_POINT_CASES)
def test_gunicorn_ends_on_one_line_before_forking_a_worker(tmp_path, name, value):
    env = service_env(tmp_path, **{"PORT": str(free_port()), name: value})
    result = run([sys.executable, "-m", "gunicorn", "-c", str(ROOT / "gunicorn.conf.py"), "--chdir", str(ROOT),
                  "app:app"], env, tmp_path)
    assert_one_line_error(result, name)
    assert "Booting worker" not in result.stderr


@pytest.mark.parametrize("name, value", ENTRY_POINT_CASES + [("WEB_CONCURRENCY", "two")])
@pytest.mark.parametrize("mode", ["gunicorn", "fallback"])
def test_python_app_py_ends_on_one_line(tmp_path, mode, name, value):
    env = service_env(tmp_path, **{name: value})
    if mode == "fallback":
        env = without_gunicorn(env)
    assert_one_line_error(run([sys.executable, str(ROOT / "app.py")], env, tmp_path), name)


def test_a_bad_value_in_env_ends_gunicorn_on_one_line_too(tmp_path):
    # WEB_CONCURRENCY from .env reaches gunicorn only through gunicorn.conf.py, which checks it.
    (tmp_path / ".env").write_text("WEB_CONCURRENCY=two\n")
    env = service_env(tmp_path, PORT=str(free_port()))
    del env["FLASK_SKIP_DOTENV"]
    result = run([sys.executable, "-m", "gunicorn", "-c", str(ROOT / "gunicorn.conf.py"), "--chdir", str(ROOT),
                  "app:app"], env, tmp_path)
    assert_one_line_error(result, "WEB_CONCURRENCY")
