"""The webhook event catalog: each event, when it is sent and the JSON Schema of its `data`, written
once here. outbox.EVENTS is its list of names, and openapi.json's top-level `webhooks` (what /docs
shows and receivers generate their models from) is made from it: `python -m webhooks.catalog`
rewrites that part of the file and nothing else."""

import json
import re

import openapi
from keys.keyformat import DISPLAY_PREFIX_LENGTH, KEY_PREFIXES
from models import SCOPES
from orgs.keyactions import MAX_KEY_NAME_LENGTH
from orgs.keyedits import FIELDS as KEY_FIELDS
from store.slugs import MAX_SLUG_LENGTH

SECONDS = {"type": "string", "format": "date-time",
           "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z$",
           "examples": ["2026-11-22T23:20:00Z"]}
PREFIX = {"type": "string", "pattern": f"^sk_(live|test)_[A-Za-z0-9]{{{DISPLAY_PREFIX_LENGTH - len('sk_live_')}}}$",
          "examples": ["sk_live_3uXP"]}
# A key's display prefix: this service's form above, or the start an imported key's line gave (docs/importing-keys.md).
START = {"type": "string", "maxLength": 16, "pattern": "^[!-~]*$", "examples": ["sk_live_3uXP", "acme_live_"]}
ORG = {"org": {"type": "string", "pattern": "^[a-z0-9]+(-[a-z0-9]+)*$", "maxLength": MAX_SLUG_LENGTH,
               "description": "The slug of the organisation whose key or endpoint the event is about.",
               "examples": ["acme"]}}
KEY = {
    "key_id": {"type": "integer", "minimum": 1, "description": "The key's id (KEY_ID), as keys list prints it.",
               "examples": [42]},
    "key_name": {"type": "string", "maxLength": MAX_KEY_NAME_LENGTH, "description": "The key's name.",
                 "examples": ["CI"]},
    "key_prefix": {**START, "description": "The key's display prefix, the start of its secret (sk_live_ and 4 "
                                          "characters; an imported key's as its import gave it); never the secret."},
}
ACTOR = {"actor": {"type": ["string", "null"], "examples": ["alice"],
                   "description": "The username of who made the change in the web application; null for the "
                                  "command line, the API (a key revoked as leaked) or the service itself."}}

# Receivers generate models from these schemas: extra properties stay allowed (a later release may
# add a field, and a receiver's model must not refuse it); the tests hold the service to the list.
TOLERANT = "A later release may add properties: ignore those you do not know."


def key_event(summary, fields, optional=(), actor=True):
    """An event about a key: its data starts with the key's fields; key changes (key_changed's
    events) name the actor; every field is always present but those named in optional."""
    properties = {**KEY, **fields, **(ACTOR if actor else {}), **ORG}
    return {"summary": summary, "properties": properties,
            "required": [name for name in properties if name not in optional]}


CATALOG = {
    "key.created": key_event("A key is created (web, command line) or imported (keys import, the Organisation tab).", {
        "key_type": {"type": "string", "enum": list(KEY_PREFIXES), "description": "Its type."},
        "scopes": {"type": "array", "items": {"type": "string", "enum": list(SCOPES)}, "minItems": 1,
                   "uniqueItems": True, "description": "What the key may call.", "examples": [["test:read"]]},
        "expires_at": {**SECONDS, "type": ["string", "null"], "description": "When it expires; null: never."},
        "imported": {"type": "boolean", "examples": [False],
                     "description": "True for a key another system issued, imported by its hash."},
        "external_id": {"type": ["string", "null"], "maxLength": 255, "examples": ["cus_4Fq2"],
                        "description": "An imported key's id in the system that issued it, where its import gave one."},
    }, optional=("external_id",)),
    "key.rolled": key_event("A key gets a new secret.", {
        "key_prefix": {**PREFIX, "description": "The new secret's display prefix."},
        "previous_key_prefix": {**START, "description": "The previous secret's display prefix.",
                                "examples": ["sk_live_9fQa"]},
        "previous_valid_until": {**SECONDS, "type": ["string", "null"],
                                 "description": "The end of the previous secret's grace period; "
                                                "null: it ended at once."},
    }),
    "key.updated": key_event("A key is changed in place (web, command line): name, scopes, allow-list, expiry, tier, "
                             "windows or credits.", {
        "changed": {"type": "array", "items": {"type": "string", "enum": list(KEY_FIELDS)}, "minItems": 1,
                    "uniqueItems": True, "description": "The fields that changed, in this order; never a value.",
                    "examples": [["name", "tier"]]},
    }),
    "key.revoked": key_event("A key is revoked (web, command line).", {
        "revoked_at": {**SECONDS, "description": "When it was revoked."},
    }),
    "key.revoked_as_leaked": key_event(
        "A key is revoked as leaked: through POST /api/v1/keys/revoke by whoever held it, or reported by GitHub.", {
            "revoked_at": {**SECONDS, "description": "When it was revoked."},
            "source": {"type": "string", "enum": ["github"],
                       "description": "Who reported it, when not its holder: github (secret scanning)."},
            "url": {"type": "string", "maxLength": 2000,
                    "description": "Where GitHub found it (with source github); empty when GitHub did not say.",
                    "examples": ["https://github.com/acme/app/blob/main/.env"]},
        }, optional=("source", "url")),
    "key.expiring": key_event("7 days before a key's expiry, once (at once for a key made with less to live).", {
        "expires_at": {**SECONDS, "description": "When it expires."},
    }),
    "key.expired": key_event("A key's expiry has come (once, within a minute).", {
        "expires_at": {**SECONDS, "description": "When it expired."},
    }),
    "usage.threshold": key_event("A key's window reaches 80 % and 100 % of its allowance: once each per window.", {
        "window": {"type": "string", "description": "The window's policy name, as RateLimit-Policy names it.",
                   "examples": ["free"]},
        "limit": {"type": "integer", "minimum": 1, "description": "The window's allowance.", "examples": [1000]},
        "window_seconds": {"type": "integer", "minimum": 1, "description": "The window's length.", "examples": [3600]},
        "used": {"type": "integer", "minimum": 1, "description": "Requests counted in the window.", "examples": [800]},
        "percent": {"type": "integer", "enum": [80, 100], "description": "The threshold reached."},
        "reset_at": {**SECONDS, "description": "When the window starts again."},
    }, actor=False),
    "credits.low": key_event("A key with credits has 10 % left of what it was last given, once until then.", {
        "credits_remaining": {"type": "integer", "minimum": 1, "description": "Credits left.", "examples": [100]},
        "credits_granted": {"type": "integer", "minimum": 10, "examples": [1000],
                            "description": "What the key was last given (set, added to or refilled)."},
    }, actor=False),
    "credits.exhausted": key_event("A key with credits has none left.", {
        "credits_remaining": {"type": "integer", "const": 0, "description": "Credits left: none."},
        "next_refill_at": {**SECONDS, "type": ["string", "null"], "description": "The next refill; null: none."},
    }, actor=False),
    "webhook.test": {"summary": "Send test event, or webhooks test: to that endpoint, whatever its events.",
                     "properties": {
                         "endpoint_id": {"type": "integer", "minimum": 1, "description": "The endpoint's id.",
                                         "examples": [3]},
                         "url": {"type": "string", "format": "uri", "description": "The endpoint's URL.",
                                 "examples": ["https://hooks.example.com/api-keys"]},
                         **ORG},
                     "required": ["endpoint_id", "url", "org"]},
}
EVENTS = tuple(CATALOG)

HEADERS = [
    ("webhook-id", {"type": "string", "pattern": "^msg_[A-Za-z0-9_-]{24}$"},
     "The message's id, the same on every attempt: drop a delivery whose id you have processed (delivery is at "
     "least once)."),
    ("webhook-timestamp", {"type": "integer"},
     "The Unix second of the attempt: refuse one more than 5 minutes from now."),
    ("webhook-signature", {"type": "string", "pattern": "^v1,[A-Za-z0-9+/]{43}=( v1,[A-Za-z0-9+/]{43}=)*$"},
     "v1, and the base64 HMAC-SHA256 of webhook-id.webhook-timestamp.body keyed with the base64-decoded secret "
     "after whsec_; several are separated by spaces: accept the delivery when one matches."),
]
ANSWERS = {"2XX": {"description": "Delivered: any 2xx within 10 seconds, whatever the body (at most 1 KiB is read)."},
           "default": {"description": "Anything else, or no answer within 10 seconds: "
                                      "tried again on the retry schedule."}}


def title(event):
    """KeyRevokedAsLeaked for key.revoked_as_leaked: the name generated models take."""
    return "".join(word.capitalize() for word in re.split(r"[._]", event))


def example(properties):
    return {name: schema["examples"][0] if "examples" in schema else schema.get("const", schema.get("enum", [None])[0])
            for name, schema in properties.items()}


def operation(event, described):
    data = {"title": f"{title(event)}Data", "type": "object", "description": f"The event's data. {TOLERANT}",
            "required": described["required"], "properties": described["properties"]}
    body = {"title": f"{title(event)}Event", "type": "object", "description": f"A {event} delivery's body. {TOLERANT}",
            "required": ["type", "timestamp", "data"],
            "properties": {"type": {"type": "string", "const": event},
                           "timestamp": {"type": "string", "format": "date-time",
                                         "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}"
                                                    "T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3}Z$",
                                         "description": "When the event happened, with milliseconds."},
                           "data": data}}
    sample = {"type": event, "timestamp": "2026-11-22T23:20:00.123Z", "data": example(described["properties"])}
    return {"post": {
        "operationId": f"webhook_{event.replace('.', '_')}",
        "summary": described["summary"],
        "security": [],
        "parameters": [{"name": name, "in": "header", "required": True, "description": description, "schema": schema}
                       for name, schema, description in HEADERS],
        "requestBody": {"required": True, "content": {"application/json": {"schema": body, "example": sample}}},
        "responses": ANSWERS,
    }}


def webhooks():
    """openapi.json's `webhooks`: one POST per event, named by the event's type."""
    return {event: operation(event, described) for event, described in CATALOG.items()}


WIDTH = 110


def nesting(value):
    """How deep containers go in value, a list of plain values counting as a plain value."""
    members = list(value.values()) if isinstance(value, dict) else value if isinstance(value, list) else []
    if isinstance(value, list) and not any(isinstance(member, (dict, list)) for member in members):
        return 0
    return 1 + max(map(nesting, members), default=0) if isinstance(value, (dict, list)) else 0


def formatted(value, depth):
    """value as JSON in openapi.json's style: a schema of plain fields, or anything short, on one
    line; else one member a line."""
    flat = json.dumps(value, ensure_ascii=False)
    if nesting(value) <= 2 or len(flat) + 2 * depth <= WIDTH:
        return flat
    inner = "  " * (depth + 1)
    if isinstance(value, dict):
        members = [f"{inner}{json.dumps(name)}: {formatted(member, depth + 1)}" for name, member in value.items()]
        return "{\n" + ",\n".join(members) + "\n" + "  " * depth + "}"
    return "[\n" + ",\n".join(inner + formatted(member, depth + 1) for member in value) + "\n" + "  " * depth + "]"


def rewrite(text):
    """openapi.json's text with its top-level `webhooks` made afresh (added last when missing),
    every other byte as it was, so that regenerating never touches the paths another change edits."""
    block = '"webhooks": ' + formatted(webhooks(), 1)
    if found := re.search(r'^  "webhooks": ', text, re.M):
        _, end = json.JSONDecoder().raw_decode(text, found.end())
        made = text[:found.start() + 2] + block + text[end:]
    else:
        close = text.rstrip().rindex("}")
        made = text[:close].rstrip() + ",\n  " + block + "\n" + text[close:]
    if json.loads(made) != {**json.loads(text), "webhooks": webhooks()}:
        raise ValueError("openapi.json's top-level members are no longer one a line at two spaces' indent.")
    return made


def main():
    text = openapi.PATH.read_text(encoding="utf-8")
    made = rewrite(text)
    if made != text:
        openapi.PATH.write_text(made, encoding="utf-8")
    print(f"{openapi.PATH.name}: webhooks {'rewritten' if made != text else 'already up to date'} "
          f"({len(EVENTS)} events).")


if __name__ == "__main__":
    main()
