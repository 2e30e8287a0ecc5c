"""Fixtures of the organisations' tests: Acme with a member of every role (tests/support/teams.py),
and clients logged in as its members."""

import pytest
from teams import PASSWORD, team_in


@pytest.fixture
def team(app, database_url):
    return team_in(app, database_url)


@pytest.fixture
def log_in(app):
    """log_in(username, org="acme"): a new client logged in as the user, working in that organisation
    (None: its personal one)."""

    def log_in(username, org="acme"):
        client = app.test_client()
        assert client.post("/login", data={"username": username, "password": PASSWORD}).status_code == 302
        if org:
            assert client.post("/orgs/switch", data={"org": org}).status_code == 302
        return client

    return log_in
