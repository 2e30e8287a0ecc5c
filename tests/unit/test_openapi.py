"""openapi.json: it is served, it covers every REST route, and every kind of real response
(each endpoint's success and each error of the contract) matches it."""

import json

import peewee
import pytest
from contract import DOCUMENT, assert_conforms, assert_error
from limits.errors import StorageError
from openapi_core.validation.response.exceptions import ResponseValidationError

import models
import openapi
from accounts import users
from api import VERSION
from models import ApiKey, Membership
from orgs import keyactions, members, organisations

PROTECTED = ["/api/v1/protected/test", "/api/v1/user/me", "/api/v1/usage/stats", "/api/v1/usage/history"]
PUBLIC = ["/api/v1/demo/year", "/api/v1/status", "/api/v1/openapi.json"]


GITHUB_REPORTS = "/api/v1/integrations/github/secret-scanning"


def test_document_is_served_as_json(client):
    response = client.get("/api/v1/openapi.json")
    assert response.status_code == 200
    assert response.mimetype == "application/json"
    assert_conforms(response)


def test_a_default_deployment_describes_what_it_serves_and_not_github_reports(client):
    served = client.get("/api/v1/openapi.json").get_json()
    assert set(served["paths"]) == set(DOCUMENT["paths"]) - {GITHUB_REPORTS}
    assert [tag["name"] for tag in served["tags"]] == ["public", "keyed"]
    assert {key: value for key, value in served.items() if key not in ("paths", "tags")} == \
        {key: value for key, value in DOCUMENT.items() if key not in ("paths", "tags")}
    assert all(served["paths"][path] == DOCUMENT["paths"][path] for path in served["paths"])
    assert client.post(GITHUB_REPORTS).status_code == 404


def test_with_every_feature_on_the_served_document_is_the_file(make_app, database_url):
    app = make_app({"DATABASE_URL": database_url, "TESTING": True, "GITHUB_SECRET_SCANNING": True})
    assert app.test_client().get("/api/v1/openapi.json").get_json() == DOCUMENT


def test_an_operation_a_path_keeps_while_another_goes_stays_described():
    kept = openapi.described(lambda path, method: (path, method) != ("/api/v1/keys/revoke", "post"))
    assert "/api/v1/keys/revoke" not in kept["paths"] and kept["paths"].keys() < DOCUMENT["paths"].keys()
    only_get = openapi.described(lambda path, method: method == "get")
    assert all(set(item) & openapi.METHODS == {"get"} for item in only_get["paths"].values())
    assert openapi.OPENAPI == DOCUMENT  # the file's own description is left whole


def test_document_describes_this_version(app):
    assert DOCUMENT["openapi"] == "3.1.0"
    assert DOCUMENT["info"]["version"] == VERSION


def test_every_rest_route_is_documented_and_nothing_else(make_app, database_url):
    """Every route, those of switched-on features included (GitHub's reports)."""
    app = make_app({"DATABASE_URL": database_url, "TESTING": True, "GITHUB_SECRET_SCANNING": True})
    routes = {
        (rule.rule, method.lower())
        for rule in app.url_map.iter_rules()
        if rule.rule.startswith("/api/v1/") and not rule.rule.startswith("/api/v1/ws/")
        for method in rule.methods - {"HEAD", "OPTIONS"}
    }
    documented = {(path, method) for path, item in DOCUMENT["paths"].items() for method in item}
    assert routes == documented


def test_security_scheme_is_the_key_header():
    scheme = DOCUMENT["components"]["securitySchemes"]["ApiKeyHeader"]
    assert (scheme["type"], scheme["in"], scheme["name"]) == ("apiKey", "header", "X-API-Key")
    assert DOCUMENT["security"] == [{"ApiKeyHeader": []}]
    for path in PROTECTED:
        operation = DOCUMENT["paths"][path]["get"]
        assert "security" not in operation
        assert set(operation["responses"]) == {"200", "400", "401", "403", "429", "500", "503"}
    for path in PUBLIC:
        security = DOCUMENT["paths"][path]["get"]["security"]
        assert security == [] or {} in security


@pytest.mark.parametrize("path", PUBLIC)
def test_public_success_conforms(client, path):
    response = client.get(path)
    assert response.status_code == 200
    assert_conforms(response)


def test_user_me_of_a_key_whose_creator_was_deleted_conforms(client, user, api_key):
    """The key works on for its organisation; user/me has no one to describe."""
    bob = users.create_user("bob", "bob@example.com", "correct horse battery")
    acme = members.create("Acme", user)
    Membership.create(org=acme.id, user=bob.id, role="developer")
    _, secret = keyactions.issue_key(bob, "bob's", "development", org=acme.id)
    organisations.delete_account(bob, "correct horse battery")
    assert assert_conforms(client.get("/api/v1/user/me", headers={"X-API-Key": secret})) == {
        "user_id": None, "username": None, "email": None, "created_at": None, "api_key_count": 0}


@pytest.mark.parametrize("key", ["valid", "invalid"])
def test_status_with_a_key_conforms(client, api_key, key):
    value = api_key if key == "valid" else "sk_test_" + "x" * 40
    assert assert_conforms(client.get("/api/v1/status", headers={"X-API-Key": value}))["authenticated"] is (
        key == "valid")


@pytest.mark.parametrize("path", PROTECTED)
def test_protected_success_conforms(client, pro_key, path):
    response = client.get(path, headers={"X-API-Key": pro_key})
    assert response.status_code == 200
    assert_conforms(response)


@pytest.mark.parametrize("path", PROTECTED)
@pytest.mark.parametrize("value", [None, "", "nonsense", "sk_live_" + "A" * 40, "revoked"])
def test_unauthorized_conforms(client, user, path, value):
    if value == "revoked":
        key, value = keyactions.issue_key(user, "gone", "development")
        keyactions.revoke_key(key)
    response = client.get(path, headers={} if value is None else {"X-API-Key": value})
    assert_error(response, 401, "missing_api_key" if not value else "invalid_api_key")


@pytest.mark.parametrize("path", PROTECTED)
@pytest.mark.parametrize("refusal", ["insufficient_scope", "ip_not_allowed"])
def test_forbidden_conforms(client, user, path, refusal):
    restriction = {"scopes": ["time:stream"]} if refusal == "insufficient_scope" else {"allow_ips": "203.0.113.7"}
    _, secret = keyactions.issue_key(user, "restricted", "development", **restriction)
    response = client.get(path, headers={"X-API-Key": secret}, environ_base={"REMOTE_ADDR": "198.51.100.1"})
    assert (response.status_code, response.get_json()["error"]["code"]) == (403, refusal)
    assert_conforms(response)


@pytest.mark.parametrize("path", PROTECTED)
def test_key_rate_limited_conforms(client, api_key, path):
    for _ in range(3):
        client.get(path, headers={"X-API-Key": api_key})
    response = client.get(path, headers={"X-API-Key": api_key})
    assert_error(response, 429, "rate_limit_exceeded")


@pytest.mark.parametrize("path", PUBLIC)
def test_ip_rate_limited_conforms(client, path):
    for _ in range(5):
        client.get(path)
    response = client.get(path)
    assert_error(response, 429, "rate_limit_exceeded")


def test_internal_error_conforms(client, user):
    key, secret = keyactions.issue_key(user, "k", "development")
    ApiKey.update(rate_limit_tier="platinum").where(ApiKey.id == key.id).execute()
    response = client.get("/api/v1/protected/test", headers={"X-API-Key": secret})
    assert_error(response, 500, "internal_error")


@pytest.mark.parametrize("path", PROTECTED + ["/api/v1/status"])
def test_database_unavailable_conforms(client, api_key, monkeypatch, path):
    def refuse(*args, **kwargs):
        raise peewee.OperationalError("unable to open database file")

    monkeypatch.setattr(models.db.obj, "execute_sql", refuse)
    response = client.get(path, headers={"X-API-Key": api_key})
    assert_error(response, 503, "service_unavailable")


@pytest.mark.parametrize("path, status", [(path, 503) for path in PROTECTED] + [(path, 200) for path in PUBLIC])
def test_limit_storage_unavailable_conforms(app, client, api_key, monkeypatch, path, status):
    """Keyed requests fail closed; public ones keep answering without their per-IP limit."""

    def refuse(*args, **kwargs):
        raise StorageError(ConnectionError("connection refused"))

    monkeypatch.setattr(app.extensions["ratelimit"].storage, "incr", refuse)
    monkeypatch.setattr(app.extensions["ratelimit"], "count_hit", refuse)
    response = client.get(path, headers={"X-API-Key": api_key})
    assert response.status_code == status
    assert_conforms(response)


@pytest.mark.parametrize("path", ["/api/v1/nothing", "/api/v1/ws/nothing", "/nothing"])
def test_not_found_conforms(client, path):
    response = client.get(path)
    assert_error(response, 404, "not_found")


@pytest.mark.parametrize("path", PUBLIC + PROTECTED)
@pytest.mark.parametrize("method", ["post", "put", "patch", "delete"])
def test_method_not_allowed_conforms(client, path, method):
    response = getattr(client, method)(path)
    assert_error(response, 405, "method_not_allowed")


def test_a_response_the_document_does_not_describe_fails(client):
    response = client.get("/api/v1/demo/year")
    response.set_data(json.dumps({**response.get_json(), "extra": 1}))
    with pytest.raises(ResponseValidationError):
        assert_conforms(response)
    response = client.get("/api/v1/user/me")
    del response.headers["WWW-Authenticate"]
    with pytest.raises(ResponseValidationError):
        assert_conforms(response)
