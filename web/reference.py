"""The API reference page's content: openapi.json read once into what templates/docs.html shows."""

import collections
import json

import openapi

Operation = collections.namedtuple(
    "Operation", "method path anchor summary description tag auth key_header parameters request_body responses")
Response = collections.namedtuple("Response", "status description body codes headers")
Reference = collections.namedtuple("Reference", "schema anchor")
Field = collections.namedtuple("Field", "name type link required notes description", defaults=("",))
Schema = collections.namedtuple("Schema", "name anchor description type notes fields")
Header = collections.namedtuple("Header", "name anchor sent_as description type notes")
Parameter = collections.namedtuple("Parameter", "name where required type description")
Page = collections.namedtuple(
    "Page", "version description licence security tags other_responses schemas headers events webhook_headers")
Event = collections.namedtuple("Event", "name anchor summary description fields")

METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
# The document describes these answers once, in its components, rather than on every operation.
OTHER_RESPONSES = [("404", "NotFound", "A path the document does not list"),
                   ("405", "MethodNotAllowed", "A method the document does not list for its path")]
NOTES = {"pattern": "pattern {}", "format": "format {}", "minimum": "at least {}", "maximum": "at most {}",
         "minLength": "at least {} characters", "maxLength": "at most {} characters", "maxItems": "at most {} items"}
NOT_EMPTY = "not empty"


def component_name(ref):
    return ref.rsplit("/", 1)[1]


def build(document):
    """The page: every operation grouped by its first tag, the answers outside the operations, and
    the schemas and headers they refer to."""
    components = document.get("components", {})
    groups = {}
    for path, item in document["paths"].items():
        for method, operation in item.items():
            if method in METHODS:
                view = operation_view(document, path, method, operation)
                groups.setdefault(view.tag, []).append(view)
    described = {tag["name"]: tag.get("description", "") for tag in document.get("tags", [])}
    return Page(
        version=document["info"]["version"],
        description=document["info"].get("description", ""),
        licence=document["info"].get("license", {}).get("name"),
        security=[scheme.get("description", "") for scheme in components.get("securitySchemes", {}).values()],
        tags=[(name, described.get(name, ""), operations) for name, operations in groups.items()],
        other_responses=[(when, response_view(document, status, {"$ref": f"#/components/responses/{name}"}))
                         for status, name, when in OTHER_RESPONSES if name in components.get("responses", {})],
        schemas=[schema_view(document, name, schema) for name, schema in components.get("schemas", {}).items()],
        headers=[header_view(name, header, sent_as(document, name))
                 for name, header in components.get("headers", {}).items()],
        events=[event_view(document, name, item["post"]) for name, item in document.get("webhooks", {}).items()],
        webhook_headers=webhook_headers(document),
    )


def operation_view(document, path, method, operation):
    security = operation.get("security", document.get("security", []))
    parameters = document["paths"][path].get("parameters", []) + operation.get("parameters", [])
    return Operation(
        method=method.upper(),
        path=path,
        anchor=operation.get("operationId") or f"{method}-{path}".replace("/", "-"),
        summary=operation.get("summary", ""),
        description=operation.get("description", ""),
        tag=(operation.get("tags") or ["other"])[0],
        auth=auth_text(document, security),
        key_header=key_header(document, security),
        parameters=[parameter_view(document, resolve(document, parameter)) for parameter in parameters],
        request_body=request_body_view(document, operation),
        responses=[response_view(document, status, response) for status, response in operation["responses"].items()],
    )


def auth_text(document, security):
    """How the operation authenticates, in a sentence."""
    schemes = document.get("components", {}).get("securitySchemes", {})
    named = [name for requirement in security for name in requirement]
    if not named:
        return "None."
    ways = " or ".join(scheme_text(schemes[name]) for name in dict.fromkeys(named))
    return f"Optional: {ways}." if {} in security else f"Required: {ways}."


def key_header(document, security):
    """The header an operation's API key goes in, or None."""
    schemes = document.get("components", {}).get("securitySchemes", {})
    for name in (name for requirement in security for name in requirement):
        if schemes[name].get("type") == "apiKey" and schemes[name].get("in") == "header":
            return schemes[name]["name"]
    return None


def scheme_text(scheme):
    if scheme.get("type") == "apiKey":
        return f"an API key in the {scheme['name']} {scheme['in']}"
    return scheme.get("description") or scheme.get("type", "")


def resolve(document, item):
    """The object a $ref names (one level, as in openapi.json), or the item itself."""
    if "$ref" not in item:
        return item
    section, name = item["$ref"].split("/")[-2:]
    return document["components"][section][name]


def parameter_view(document, parameter):
    schema = parameter.get("schema", {})
    return Parameter(parameter["name"], parameter["in"], parameter.get("required", False),
                     type_text(schema)[0], parameter.get("description", ""))


def request_body_view(document, operation):
    """A Reference to the schema of the operation's JSON body (or its fields, inline); None without one."""
    for content in resolve(document, operation.get("requestBody", {})).get("content", {}).values():
        return body_view(document, content.get("schema", {}))
    return None


def response_view(document, status, response):
    described = resolve(document, response)
    body, codes = None, []
    for content in described.get("content", {}).values():
        body = body_view(document, content.get("schema", {}))
        codes = error_codes(document, content.get("schema", {}))
    headers = [(name, component_name(header["$ref"]) if "$ref" in header else None,
                resolve(document, header).get("required", False))
               for name, header in described.get("headers", {}).items()]
    return Response(str(status), described.get("description", ""), body, codes, headers)


def body_view(document, schema):
    """A Reference to a named schema, or the fields of an inline one."""
    if "$ref" in schema:
        name = component_name(schema["$ref"])
        return Reference(name, f"schema-{name}")
    return fields(document, schema)


def error_codes(document, schema):
    """The codes an error body may carry: its error.code enum."""
    error = resolve(document, schema).get("properties", {}).get("error", {})
    code = resolve(document, error).get("properties", {}).get("code", {})
    return code.get("enum", [code["const"]] if "const" in code else [])


def schema_view(document, name, schema):
    kind, _ = type_text(schema)
    return Schema(name, f"schema-{name}", schema.get("description", ""), kind, notes(schema),
                  fields(document, schema))


def fields(document, schema, prefix=""):
    """Each property of an object schema, nested objects' properties as dotted names."""
    rows = []
    required = set(schema.get("required", []))
    for name, child in schema.get("properties", {}).items():
        kind, link = type_text(child)
        target = resolve(document, child)
        rows.append(Field(prefix + name, kind, link, name in required, notes(target), target.get("description", "")))
        if "$ref" not in child and child.get("properties"):
            rows += fields(document, child, f"{prefix}{name}.")
    return rows


def event_view(document, name, operation):
    """A webhook event: when it is sent, and the fields of its data."""
    body = resolve(document, operation["requestBody"]["content"]["application/json"]["schema"])
    data = resolve(document, body["properties"]["data"])
    return Event(name, f"event-{name}", operation.get("summary", ""), data.get("description", ""),
                 fields(document, data))


def webhook_headers(document):
    """The headers every delivery carries (each event's operation names the same): (name, type, meaning)."""
    for item in document.get("webhooks", {}).values():
        return [(parameter["name"], type_text(parameter.get("schema", {}))[0], parameter.get("description", ""))
                for parameter in item["post"].get("parameters", []) if parameter["in"] == "header"]
    return []


def type_text(schema):
    """(the schema's type in a few words, the anchor of the named schema it refers to or None)."""
    if "$ref" in schema:
        name = component_name(schema["$ref"])
        return name, f"schema-{name}"
    if "const" in schema:
        return json.dumps(schema["const"]), None
    if "enum" in schema:
        return " | ".join(json.dumps(value) for value in schema["enum"]), None
    if schema.get("type") == "array" and "items" in schema:
        item, link = type_text(schema["items"])
        return f"array of {item}", link
    kind = schema.get("type", "any")
    if kind == "array" and "items" in schema:
        return f"array of {type_text(schema['items'])[0]}", None
    return (" or ".join(kind) if isinstance(kind, list) else kind), None


def notes(schema):
    """The schema's constraints and examples, in a few words each."""
    said = [NOT_EMPTY if (key, schema[key]) == ("minLength", 1) else template.format(schema[key])
            for key, template in NOTES.items() if key in schema]
    if schema.get("additionalProperties") is False:
        said.append("no other properties")
    said += [f"example {json.dumps(example)}" for example in schema.get("examples", [])]
    return said


def header_view(name, header, names):
    schema = header.get("schema", {})
    return Header(name, f"header-{name}", names, header.get("description", ""), type_text(schema)[0],
                  notes(schema) + (["always sent"] if header.get("required") else []))


def sent_as(document, component):
    """The header names under which responses send a component header."""
    ref = f"#/components/headers/{component}"
    responses = [response for item in document["paths"].values() for method, operation in item.items()
                 if method in METHODS for response in operation["responses"].values()]
    responses += document.get("components", {}).get("responses", {}).values()
    return sorted({name for response in responses for name, header in response.get("headers", {}).items()
                   if header.get("$ref") == ref})


PAGE = build(openapi.OPENAPI)
