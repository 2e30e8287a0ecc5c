"""Checks that a real response, from Flask's test client or from `requests` against a live
server, is one that openapi.json describes."""

import json

import jsonschema
import requests
from liveserver import ROOT
from openapi_core import OpenAPI
from openapi_core.contrib.requests import RequestsOpenAPIRequest, RequestsOpenAPIResponse
from openapi_core.contrib.werkzeug import WerkzeugOpenAPIRequest, WerkzeugOpenAPIResponse
from openapi_core.templating.paths.exceptions import OperationNotFound, PathNotFound

DOCUMENT = json.loads((ROOT / "openapi.json").read_text())
SPEC = OpenAPI.from_dict(DOCUMENT)


def assert_conforms(response):
    """Fail unless the response matches its operation in openapi.json (or, for an unknown path or
    method, the document's NotFound or MethodNotAllowed response); return the JSON body."""
    if isinstance(response, requests.Response):
        wrapped = RequestsOpenAPIRequest(response.request), RequestsOpenAPIResponse(response)
        body = response.json()
    else:
        # The view read the request's body: openapi-core reads it again, from the start.
        stream = response.request.environ.get("wsgi.input")
        if stream is not None and stream.seekable():
            stream.seek(0)
        wrapped = WerkzeugOpenAPIRequest(response.request), WerkzeugOpenAPIResponse(response)
        body = response.get_json()
    try:
        SPEC.validate_response(*wrapped)
    except PathNotFound:
        assert_component_response(response, body, "NotFound", 404)
    except OperationNotFound:
        assert_component_response(response, body, "MethodNotAllowed", 405)
    return body


def assert_component_response(response, body, name, status):
    described = DOCUMENT["components"]["responses"][name]
    assert response.status_code == status
    assert response.headers["Content-Type"] == "application/json"
    for header in described.get("headers", {}):
        assert response.headers.get(header)
    # The components travel along so that the schema's "#/components/..." references resolve.
    schema = {**described["content"]["application/json"]["schema"], "components": DOCUMENT["components"]}
    jsonschema.validate(body, schema, cls=jsonschema.Draft202012Validator)


def assert_error(response, status, code):
    """Fail unless the response is the contract's error: the status, JSON {"error": {"code",
    "message"}} with this code and a sentence, as openapi.json describes it; return the body."""
    assert response.status_code == status
    assert response.headers["Content-Type"].split(";")[0] == "application/json"
    body = assert_conforms(response)
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}
    assert body["error"]["code"] == code
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    return body
