"""What `import app` loads: with the default settings, no library of a feature they leave unused;
a serving process loads those its requests would, before it freezes its heap. The import leaves
the garbage collector on, what it made frozen out of the collector's way, also when the settings
stop it; a program that turned the collector off keeps it off. Its middlewares are bound methods.
Its URL rules compile their URL builders at their first url_for, and build what werkzeug's own do."""

import subprocess
import sys
import types

import pytest
from flask import Flask, url_for
from liveserver import ROOT, service_env
from werkzeug.routing import Map, Rule

# Each is imported where its feature is used: PostgreSQL's driver when a PostgreSQL URL is opened
# (store/pgdriver.py), Redis by limits' storage for a Redis URL; passkeys, cryptography, segno and
# smtplib by a request that uses them, or by serving/warmup.py in a serving process.
DEFERRED = {"psycopg", "psycopg2", "redis", "webauthn", "cryptography", "segno", "smtplib"}
CONFIGURED = {"psycopg", "psycopg2", "redis"}


def loaded_by(program, tmp_path):
    loaded = subprocess.run([sys.executable, "-c", f"import sys, app; {program}; print(*sorted(sys.modules))"],
                            cwd=ROOT, env=service_env(tmp_path), capture_output=True, text=True, timeout=60,
                            check=True).stdout.split()
    assert "models" in loaded
    return {name.split(".")[0] for name in loaded}


def test_import_app_with_the_defaults_loads_no_library_of_an_unused_feature(tmp_path):
    assert sorted(DEFERRED & loaded_by("pass", tmp_path)) == []


def test_a_serving_process_loads_what_its_requests_would_before_it_freezes_its_heap(tmp_path):
    loaded = loaded_by("from serving import warmup; warmup.freeze_heap()", tmp_path)
    assert sorted(DEFERRED - CONFIGURED - loaded) == []
    assert sorted(CONFIGURED & loaded) == []


def collector_after(program, tmp_path, **env):
    result = subprocess.run([sys.executable, "-c", f"import gc; {program}"], cwd=ROOT,
                            env={**service_env(tmp_path), **env}, capture_output=True, text=True, timeout=60)
    return result.stdout.split()


def test_import_app_freezes_what_it_made_and_turns_the_collector_back_on(tmp_path):
    enabled, threshold, frozen, young = collector_after(
        "import app; print(gc.isenabled(), gc.get_threshold()[0], gc.get_freeze_count(), gc.get_count()[0])", tmp_path)
    assert (enabled, threshold) == ("True", "700")
    assert int(frozen) > 50_000 and int(young) < 700
    assert collector_after("gc.disable(); import app; print(gc.isenabled(), gc.get_freeze_count())", tmp_path) == [
        "False", "0"]


def test_a_setting_that_stops_the_import_leaves_the_collector_on(tmp_path):
    program = "\ntry:\n    import app\nexcept Exception as error:\n    print(type(error).__name__, gc.isenabled())"
    assert collector_after(program, tmp_path, RATE_LIMIT_TIERS="free=often") == ["ConfigError", "True"]


def test_every_middleware_is_called_as_a_bound_method(make_app, database_url):
    """An instance called as a function goes through its type's C slot: a new C frame for every
    request, which each open WebSocket keeps on its greenlet's saved stack (~0.7 KiB a layer)."""
    app = make_app({"DATABASE_URL": database_url, "TRUSTED_PROXIES": 1, "TESTING": True})
    layer, layers = app.wsgi_app, []
    while not isinstance(layer.__self__, Flask):
        assert isinstance(layer, types.MethodType) and layer.__name__ == "__call__"
        middleware = layer.__self__
        layers.append(type(middleware).__name__)
        layer = getattr(middleware, "wsgi_app", None) or middleware.app  # ProxyFix keeps it as .app
    assert layers == ["Envelope", "ProxyFix", "CheckedClientAddress", "Lane"]
    assert layer == Flask.wsgi_app.__get__(app)


def test_making_the_app_compiles_no_url_builder(make_app, database_url, monkeypatch):
    compiled = []
    compile_builder = Rule._compile_builder

    def counted(rule, append_unknown=True):
        compiled.append(rule.rule)
        return compile_builder(rule, append_unknown)

    monkeypatch.setattr(Rule, "_compile_builder", counted)
    app = make_app({"DATABASE_URL": database_url, "TESTING": True})
    assert compiled == []
    with app.test_request_context():
        assert url_for("static", filename="style.css") == "/static/style.css"
    assert compiled == ["/static/<path:filename>"]


@pytest.mark.parametrize("append_unknown", [True, False])
def test_every_rule_builds_the_urls_werkzeug_s_own_rule_builds(make_app, database_url, append_unknown):
    app = make_app({"DATABASE_URL": database_url, "TESTING": True})
    own = Map([Rule(rule.rule, websocket=rule.websocket, **rule.get_empty_kwargs())
               for rule in app.url_map.iter_rules()],
              converters=app.url_map.converters)
    ours, theirs = app.url_map.bind("localhost"), own.bind("localhost")
    for rule in app.url_map.iter_rules():
        values = {**{name: 7 for name in rule.arguments}, "next": "/a b?c", "rule": "z"}
        built = ours.build(rule.endpoint, values, append_unknown=append_unknown)
        assert built == theirs.build(rule.endpoint, values, append_unknown=append_unknown), rule.rule
        assert "7" in built or not rule.arguments
