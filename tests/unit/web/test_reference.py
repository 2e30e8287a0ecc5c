"""GET /docs: the API reference rendered from openapi.json shows every operation with its
authentication, parameters and every documented response (status, body schema, error codes,
headers), every schema and header, and the webhooks (each event of openapi.json's `webhooks` with
every field of its data, the headers, how to verify a delivery); needs no script and no other host, and is
linked from the landing page. Its folds are walked in a browser in tests/browser/test_reference.py."""

import base64
import hashlib
import hmac
import html as markup
import json
import re
from html.parser import HTMLParser

import pytest
from contract import DOCUMENT

from web import hooks, reference
from webhooks import outbox, signing

OPERATIONS = [(method.upper(), path, operation) for path, item in DOCUMENT["paths"].items()
              for method, operation in item.items()]
# What web/reference.py reads of an operation; anything else openapi.json gains must be shown too.
RENDERED_KEYS = {"operationId", "summary", "description", "tags", "security", "parameters", "responses", "requestBody"}


class Articles(HTMLParser):
    """The text of each <article>, by its id (each tag a space, but a <wbr>: a path's place to wrap),
    and every src and href on the page."""

    def __init__(self, html):
        super().__init__()
        self.articles, self.links, self.open = {}, [], []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        if tag == "wbr":
            return
        self.handle_data(" ")
        attrs = dict(attrs)
        self.links += [attrs[name] for name in ("src", "href") if name in attrs]
        if tag == "article":
            self.open.append(attrs.get("id", ""))
            self.articles[self.open[-1]] = ""

    def handle_endtag(self, tag):
        self.handle_data(" ")
        if tag == "article":
            self.open.pop()

    def handle_data(self, data):
        for anchor in self.open:
            self.articles[anchor] += data


@pytest.fixture
def page(client):
    response = client.get("/docs")
    assert response.status_code == 200
    assert response.mimetype == "text/html"
    return response


def squeeze(text):
    return re.sub(r"\s+", " ", text)


def test_every_operation_is_shown_with_its_auth_and_every_response(page):
    articles = Articles(page.get_data(as_text=True)).articles
    for method, path, operation in OPERATIONS:
        text = squeeze(articles[operation["operationId"]])
        assert f"{method} {path}" in text
        assert operation["summary"] in text
        keyed = operation.get("security", DOCUMENT["security"]) == DOCUMENT["security"]
        public = operation.get("security") == []
        assert ("Required: an API key in the X-API-Key header." in text) is keyed
        assert ("Authentication None." in text) is public
        parameters = operation.get("parameters", [])
        assert ("Parameters None." in text) is not parameters
        for parameter in parameters:
            assert f"{parameter['name']} ({parameter['in']}, string, required): {parameter['description']}" in text
        if "requestBody" in operation:
            schema = operation["requestBody"]["content"]["application/json"]["schema"]
            assert f"Request body {reference.component_name(schema['$ref'])} (JSON)" in text
        for status, response in operation["responses"].items():
            described = reference.resolve(DOCUMENT, response)
            assert f"{status} {described['description']}" in text
            schema = described["content"]["application/json"]["schema"]
            if "$ref" in schema:
                name = reference.component_name(schema["$ref"])
                assert name in text
                for code in DOCUMENT["components"]["schemas"][name].get("properties", {}).get("error", {}).get(
                        "properties", {}).get("code", {}).get("enum", []):
                    assert code in text


def test_every_schema_and_header_has_its_place(page):
    html = page.get_data(as_text=True)
    for name in DOCUMENT["components"]["schemas"]:
        assert f'id="schema-{name}"' in html
    for name in DOCUMENT["components"]["headers"]:
        assert f'id="header-{name}"' in html
    for anchor in set(re.findall(r'href="#([^"]+)"', html)):
        assert f'id="{anchor}"' in html, anchor


def test_the_answers_outside_the_operations_are_shown(page):
    text = squeeze(re.sub(r"<[^>]+>", " ", page.get_data(as_text=True)))
    assert "A path the document does not list 404 not_found: no such path. NotFound error.code : not_found" in text
    assert ("405 method_not_allowed: the path does not take this method. MethodNotAllowed error.code : "
            "method_not_allowed Allow") in text


def test_the_page_needs_no_script_and_no_other_host(page):
    html = page.get_data(as_text=True)
    # Its one script, from this host, only opens folds: every part is in the HTML, in a <details>.
    assert re.findall(r"<script[^>]*>", html) == ['<script src="/static/reference.js" defer>']
    assert page.headers["Content-Security-Policy"] == hooks.CONTENT_SECURITY_POLICY
    for link in Articles(html).links:
        assert link.startswith(("/", "#")) and not link.startswith("//"), link


def test_every_section_and_each_part_in_it_is_a_fold_closed_in_the_html(page):
    folds = re.findall(r"<(?:section|article)\b[^>]*>(<details[^>]*>)?", page.get_data(as_text=True))
    assert len(folds) > 40 and set(folds) == {'<details class="fold">'}


def webhooks_section(page):
    html = page.get_data(as_text=True)
    section = html[html.index('<section aria-labelledby="webhooks">'):]
    return section[:section.index("</section>")]


def test_the_webhooks_section_shows_every_event_of_the_catalog_with_its_data_fields(page):
    section = webhooks_section(page)
    articles = Articles(section).articles
    assert [anchor.removeprefix("event-") for anchor in articles] == list(DOCUMENT["webhooks"]) == list(outbox.EVENTS)
    for event, item in DOCUMENT["webhooks"].items():
        post = item["post"]
        data = post["requestBody"]["content"]["application/json"]["schema"]["properties"]["data"]
        text = squeeze(markup.unescape(articles[f"event-{event}"]))
        assert post["summary"] in text, event
        for name, field in data["properties"].items():
            required = "yes" if name in data["required"] else "no"
            shown = f"{name} {reference.type_text(field)[0]} {required} {field.get('description', '')}"
            assert shown in text, (event, shown)
        assert f'href="#event-{event}"' in page.get_data(as_text=True)
    created = squeeze(markup.unescape(articles["event-key.created"]))
    assert 'scopes array of "test:read" | "user:read" | "usage:read" | "time:stream" yes' in created
    assert "expires_at string or null yes" in created and "actor string or null yes" in created
    leaked = squeeze(markup.unescape(articles["event-key.revoked_as_leaked"]))
    assert 'source "github" no' in leaked and "url string no" in leaked
    assert 'href="#webhooks"' in page.get_data(as_text=True)


def test_the_webhooks_section_gives_the_headers_and_a_signature_the_service_makes(page):
    section = webhooks_section(page)
    text = squeeze(re.sub(r"<[^>]+>", " ", section))
    for header in ("User-Agent: api-key-demo-service-webhooks/1", "Content-Type: application/json"):
        assert header in text
    [parameters] = {json.dumps(item["post"]["parameters"]) for item in DOCUMENT["webhooks"].values()}
    for parameter in json.loads(parameters):
        assert f"{parameter['name']} {parameter['schema']['type']} {parameter['description']}" in markup.unescape(text)
    assert "within 5 minutes" in text and "raw body" in text and "2xx answer within 10 seconds" in text
    # The page's recipe, run: it makes the signature the service sends.
    [recipe] = [markup.unescape(code) for code in re.findall(r"<pre><code>(.*?)</code></pre>", section, re.S)
                if "hmac.new" in code]
    secret, body = signing.new_secret(), b'{"type":"webhook.test"}'
    made = {"base64": base64, "hashlib": hashlib, "hmac": hmac, "secret": secret, "webhook_id": "msg_x",
            "webhook_timestamp": "1795312800", "body": body}
    exec(recipe, made)
    assert "v1," + made["expected"] == signing.signature(secret, "msg_x", 1795312800, body)


def test_the_landing_page_links_to_it(client):
    assert 'href="/docs"' in client.get("/").get_data(as_text=True)


def test_every_part_of_an_operation_is_one_the_page_shows():
    for _, _, operation in OPERATIONS:
        assert set(operation) <= RENDERED_KEYS


def test_parameters_and_optional_keys_are_shown():
    document = {
        "openapi": "3.1.0",
        "info": {"title": "t", "version": "1"},
        "security": [{"Key": []}],
        "paths": {"/things/{id}": {
            "parameters": [{"name": "id", "in": "path", "required": True, "schema": {"type": "integer"}}],
            "get": {"operationId": "thing", "security": [{}, {"Key": []}],
                    "parameters": [{"$ref": "#/components/parameters/Limit"}],
                    "responses": {"200": {"description": "A thing.", "content": {
                        "application/json": {"schema": {"$ref": "#/components/schemas/Thing"}}}}}},
        }},
        "components": {
            "securitySchemes": {"Key": {"type": "apiKey", "in": "header", "name": "X-Key"}},
            "parameters": {"Limit": {"name": "limit", "in": "query", "description": "At most this many.",
                                     "schema": {"type": "integer", "maximum": 10}}},
            "schemas": {"Thing": {"type": "object", "required": ["id"], "properties": {
                "id": {"type": "integer"}, "tags": {"type": "array"}}}},
        },
    }
    built = reference.build(document)
    [(tag, _, [operation])] = built.tags
    assert (tag, operation.method, operation.path, operation.key_header) == ("other", "GET", "/things/{id}", "X-Key")
    assert operation.auth == "Optional: an API key in the X-Key header."
    assert [(p.name, p.where, p.required, p.type, p.description) for p in operation.parameters] == [
        ("id", "path", True, "integer", ""), ("limit", "query", False, "integer", "At most this many.")]
    assert operation.responses[0].body == reference.Reference("Thing", "schema-Thing")
    [thing] = built.schemas
    assert [(field.name, field.type, field.required) for field in thing.fields] == [
        ("id", "integer", True), ("tags", "array", False)]
