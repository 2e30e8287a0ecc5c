"""A fourth-release database (schema version 12, tests/fixtures/make_release4.py) served by this
release in each run mode, on SQLite and PostgreSQL: its workers upgrade it once on start, and every
secret it gave answers as it did there."""

import pytest
import requests
from liveserver import service_env, serving
from releases import RELEASE4, RELEASE4_ANSWERS, load_release4

from store import schema


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_a_fourth_release_database_is_upgraded_on_start_and_its_keys_answer_as_they_did(database, run_mode, tmp_path):
    env = service_env(tmp_path, database, WEB_CONCURRENCY="2", RATE_LIMIT_TIERS=RELEASE4["tiers"],
                      ACCOUNT_RATE_LIMIT="1000/hour")
    env["DATABASE_URL"], made = load_release4(env["DATABASE_URL"], tmp_path)
    with serving(tmp_path, env, run_mode) as server:
        answers = {name: requests.get(server.base + "/api/v1/protected/test",
                                      headers={"X-API-Key": made["secrets"][name]}, timeout=10).status_code
                   for name in RELEASE4_ANSWERS}
        output = server.output()
    assert answers == RELEASE4_ANSWERS
    assert output.count(f"Upgraded the database from schema version 12 to {schema.LATEST}.") == 1
