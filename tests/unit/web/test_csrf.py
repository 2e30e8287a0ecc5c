"""CSRF with Flask's test client: every form, and every route outside the API that takes a POST,
refuses one without a valid token, whatever the method's case; a request no view takes gets its 404
or 405; the page's token works."""

import re

import pytest
from flask import g
from webforms import SECRET_PATTERN, page

from models import ApiKey, User, personal_organisation
from orgs import keyactions
from serving import envelope
from web import hooks

HTML = {"Accept": "text/html,application/xhtml+xml,*/*;q=0.8"}


def csrf_token(client, path):
    # The app fixture keeps one app context for the whole test, so Flask-WTF's token cache in g would
    # outlive the request that put it there; in production every request has its own g.
    g.pop("csrf_token", None)
    return re.search(r'name="csrf_token" value="([^"]+)"', page(client.get(path)))[1]


@pytest.mark.parametrize("path, data", [
    ("/signup", {"username": "bob", "email": "bob@example.com", "password": "long enough"}),
    ("/login", {"username": "alice", "password": "correct horse battery"}),
    ("/logout", {}),
    ("/settings/security/keys", {"name": "k", "type": "development"}),
    ("/settings/security/keys/1/revoke", {}),
])
def test_every_form_rejects_a_post_without_a_valid_csrf_token(app, logged_in, path, data):
    keyactions.issue_key(User.get(User.username == "alice"), "existing", "development")
    app.config["WTF_CSRF_ENABLED"] = True
    for token in (None, "forged"):
        form = dict(data, csrf_token=token) if token else data
        response = logged_in.post(path, data=form, headers=HTML)
        assert response.status_code == 400
        assert "CSRF" in page(response)
    assert User.select().count() == 1
    assert ApiKey.active_in(personal_organisation(User.get(User.username == "alice").id)).count() == 1


def test_every_route_that_takes_a_post_outside_the_api_asks_for_the_csrf_token(app, logged_in):
    # Found from the URL map, so a form added later is checked without being listed here.
    app.config["WTF_CSRF_ENABLED"] = True
    posted = [rule for rule in app.url_map.iter_rules()
              if rule.methods & hooks.FORM_METHODS and not rule.rule.startswith(envelope.API_PREFIX)]
    assert len(posted) >= 10
    for rule in posted:
        path = rule.build({name: 1 for name in rule.arguments}, append_unknown=False)[1]
        response = logged_in.post(path, data={}, headers=HTML)
        assert response.status_code == 400 and "CSRF" in page(response), rule.rule


def test_a_lowercase_post_is_a_post_to_the_csrf_check_too(app, logged_in):
    # Werkzeug upper-cases the method, so Flask routes "post" to a POST view; the check, which
    # reads the method from the environ, must do the same (gevent's server passes it as sent).
    app.config["WTF_CSRF_ENABLED"] = True
    response = logged_in.post("/settings/security/keys", data={"name": "k", "type": "production"}, headers=HTML,
                              environ_overrides={"REQUEST_METHOD": "post"})
    assert response.status_code == 400 and "CSRF" in page(response)
    assert ApiKey.select().count() == 0


@pytest.mark.parametrize("method, path, status", [("POST", "/no-such-page", 404), ("DELETE", "/healthz", 405)])
def test_a_request_no_view_takes_gets_its_404_or_405_not_a_csrf_refusal(app, logged_in, method, path, status):
    app.config["WTF_CSRF_ENABLED"] = True
    assert logged_in.open(path, method=method, headers=HTML).status_code == status


def test_forms_work_with_the_csrf_token_from_the_page(app, client, user):
    app.config["WTF_CSRF_ENABLED"] = True
    token = csrf_token(client, "/login")
    response = client.post("/login", data={"username": "alice", "password": "correct horse battery",
                                           "csrf_token": token})
    assert response.status_code == 302
    token = csrf_token(client, "/settings/security")
    response = client.post("/settings/security/keys", data={"name": "k", "type": "production", "csrf_token": token})
    assert response.status_code == 302
    assert SECRET_PATTERN.search(page(client.get("/settings/security")))
