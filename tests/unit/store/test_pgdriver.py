"""peewee imported without PostgreSQL's driver, then given it: the same peewee as one imported with
it, and a PostgreSQL URL served by a process that imported the app without it."""

import json
import subprocess
import sys

import services
from liveserver import ROOT, service_env

# Prints what peewee's modules bind (each name, each class's attributes), described by name.
SNAPSHOT = """
import enum, inspect, json, sys, types

def described(value):
    if isinstance(value, types.ModuleType):
        return "module " + value.__name__
    if isinstance(value, enum.Enum):
        return repr(value)
    if isinstance(value, dict):
        return {str(key): described(item) for key, item in value.items()}
    if isinstance(value, (type, types.FunctionType, types.BuiltinFunctionType)):
        return f"{value.__module__}.{value.__qualname__}"
    return type(value).__qualname__

snapshot = {}
for name in ("peewee", "playhouse.pool", "playhouse.db_url", "playhouse.migrate", "playhouse.postgres_ext",
             "playhouse.cockroachdb"):
    module = sys.modules[name]
    for key, value in vars(module).items():
        snapshot[f"{name}.{key}"] = described(value)
        if inspect.isclass(value) and value.__module__ == name:
            for attribute, item in vars(value).items():
                snapshot[f"{name}.{key}.{attribute}"] = described(item)
print(json.dumps(snapshot, sort_keys=True))
"""
WITH_DRIVER = "import psycopg, peewee, playhouse.pool, playhouse.db_url, playhouse.migrate\n" + SNAPSHOT
WITHOUT_DRIVER = """
import sys
from store import pgdriver
pgdriver.import_peewee_without_driver()
assert "psycopg" not in sys.modules
"""
GIVEN_DRIVER = WITHOUT_DRIVER + "pgdriver.load_driver()\n"


def snapshot(program):
    return json.loads(subprocess.run([sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True,
                                     timeout=60, check=True).stdout)


def differences(one, other):
    return sorted(name for name in one.keys() | other.keys() if one.get(name) != other.get(name))


def test_peewee_given_the_driver_binds_what_its_own_import_binds():
    imported_with_it = snapshot(WITH_DRIVER)
    # What load_driver must bind: if a new peewee binds more, the first assertion lists it.
    assert differences(imported_with_it, snapshot(WITHOUT_DRIVER + SNAPSHOT)) == [
        "peewee.Json_pg3", "peewee.Jsonb_pg3", "peewee.Psycopg3Adapter.txn_idle", "peewee.Psycopg3Adapter.txn_inerror",
        "peewee.Psycopg3Adapter.txn_unknown", "peewee.TransactionStatus", "peewee.psycopg",
        "playhouse.postgres_ext.TypeInfo", "playhouse.postgres_ext.register_hstore_pg3"]
    assert differences(imported_with_it, snapshot(GIVEN_DRIVER + SNAPSHOT)) == []


def test_an_app_imported_without_the_driver_serves_a_postgresql_url(tmp_path):
    env = service_env(tmp_path, database="postgresql")
    program = ("import sys, app, models\n"
               "with app.app.app_context(), models.db.atomic():\n"
               "    print(type(models.db.obj).__name__, models.User.select().count(), 'psycopg' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", program], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["PooledPostgresqlDatabase", "0", "True"]
    assert services.rows(env["DATABASE_URL"], "SELECT count(*) FROM users") == [(0,)]
