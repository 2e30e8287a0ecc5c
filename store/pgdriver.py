"""PostgreSQL's driver for peewee, imported only when a PostgreSQL URL is opened.

peewee imports psycopg at its own import, whatever the URL: ~60 ms of every start, a CLI
command's as a worker's. app.py imports peewee through import_peewee_without_driver() first, and
store/connections.py calls load_driver() for a PostgreSQL URL, which binds psycopg where peewee's
import would have. Both rely on the names peewee and playhouse.postgres_ext bind at their import;
tests/unit/store/test_pgdriver.py fails when a new peewee binds others."""

import importlib
import sys

# What the service imports of peewee, all of it at once: playhouse.db_url and playhouse.migrate
# import playhouse.postgres_ext, which imports psycopg too.
PEEWEE_MODULES = ("peewee", "playhouse.pool", "playhouse.db_url", "playhouse.migrate")


def import_peewee_without_driver():
    """Import peewee's modules as if psycopg were not installed, unless either is imported already."""
    if "peewee" in sys.modules or "psycopg" in sys.modules:
        return
    sys.modules["psycopg"] = None  # `import psycopg` raises ImportError
    try:
        for name in PEEWEE_MODULES:
            importlib.import_module(name)
    finally:
        del sys.modules["psycopg"]


def load_driver():
    """Import psycopg and bind it in peewee as peewee's own import does; nothing when peewee has it
    already, or when it is not installed (peewee then says so when it connects)."""
    import peewee

    if peewee.psycopg is not None:
        return
    try:
        import psycopg
        from psycopg.pq import TransactionStatus
        from psycopg.types import TypeInfo
        from psycopg.types.hstore import register_hstore
        from psycopg.types.json import Json, Jsonb
    except ImportError:
        return
    (peewee.psycopg, peewee.TransactionStatus,
     peewee.Json_pg3, peewee.Jsonb_pg3) = psycopg, TransactionStatus, Json, Jsonb
    # Set in the class's body only when peewee's import found psycopg.
    peewee.Psycopg3Adapter.txn_idle = TransactionStatus.IDLE
    peewee.Psycopg3Adapter.txn_inerror = TransactionStatus.INERROR
    peewee.Psycopg3Adapter.txn_unknown = TransactionStatus.UNKNOWN
    postgres_ext = sys.modules.get("playhouse.postgres_ext")
    if postgres_ext is not None:
        postgres_ext.TypeInfo, postgres_ext.register_hstore_pg3 = TypeInfo, register_hstore
