"""The receivers docs/webhooks.md shows, taken from its Python code blocks as they stand and served on a
local port: each answers 2xx to every event the service sends (outbox.EVENTS, each with the example
data of openapi.json's webhooks), sent and signed as the service sends them, and 4xx to a forged one."""

import json
import re
import threading
import time
import types
from pathlib import Path

import pytest
from werkzeug.serving import make_server

from models import utcnow
from webhooks import deadlines, delivery, outbox, signing

DOCS = Path(__file__).resolve().parents[3] / "docs" / "webhooks.md"
TEXT = DOCS.read_text(encoding="utf-8")
BLOCKS = re.findall(r"^```python\n(.*?)^```", TEXT, re.M | re.S)
EVENTS_TABLE = TEXT[TEXT.index("## Events"):TEXT.index("## A delivery")]
WEBHOOKS = json.loads((DOCS.parents[1] / "openapi.json").read_text(encoding="utf-8"))["webhooks"]
# {event: its example data, as the catalog gives it}
DATA = {event: item["post"]["requestBody"]["content"]["application/json"]["example"]["data"]
        for event, item in WEBHOOKS.items()}


def test_the_events_table_gives_every_event_and_the_docs_show_receivers():
    assert re.findall(r"^\| `([a-z_.]+)` \|", EVENTS_TABLE, re.M) == list(outbox.EVENTS) == list(DATA)
    assert "key_id" not in DATA["webhook.test"] and all("key_id" in DATA[event] for event in outbox.EVENTS[:-1])
    assert len(BLOCKS) >= 2


@pytest.fixture(params=range(len(BLOCKS)), ids=lambda n: f"block{n + 1}")
def receiver(request):
    """(the URL its POST route is served at, the secret in its code): one code block of the page run as
    a module, served by werkzeug on a free port for this test."""
    code = BLOCKS[request.param]
    module = types.ModuleType(f"webhooks_md_block{request.param + 1}")
    exec(compile(code, f"{DOCS.name}, Python block {request.param + 1}", "exec"), module.__dict__)
    app = getattr(module, "app", None)
    assert app is not None, "the block is not a receiver: it makes no Flask app"
    [route] = [rule.rule for rule in app.url_map.iter_rules() if "POST" in rule.methods]
    [secret] = re.findall(r'"(whsec_[A-Za-z0-9+/=]+)"', code)
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.port}{route}", secret
    server.shutdown()
    thread.join(10)
    server.server_close()


def post(url, body, headers):
    """The status the receiver answers, sent as webhooks/delivery.py sends an attempt."""
    status, _ = delivery.post(url, body, headers, allow_private=True, deadline=deadlines.Deadline(10))
    return status


@pytest.mark.parametrize("event", outbox.EVENTS)
def test_every_receiver_answers_2xx_to_every_event(receiver, event):
    url, secret = receiver
    body = outbox.message_body(event, DATA[event], utcnow()).encode()
    status = post(url, body, signing.headers([secret], outbox.new_message_id(), int(time.time()), body))
    assert 200 <= status < 300


def forgeries(secret, body):
    now = int(time.time())
    signed = signing.headers([secret], "msg_forged", now, body)
    return {
        "no headers": {},
        "another secret": signing.headers([signing.new_secret()], "msg_forged", now, body),
        "an hour old": signing.headers([secret], "msg_forged", now - 3600, body),
        "a signature without a version": {**signed, "webhook-signature": "garbage"},
        "a timestamp that is not a number": {**signed, "webhook-timestamp": "soon"},
    }


def test_every_receiver_refuses_a_forged_delivery_with_a_4xx(receiver):
    url, secret = receiver
    body = outbox.message_body("key.revoked", DATA["key.revoked"], utcnow()).encode()
    answers = {name: post(url, body, headers) for name, headers in forgeries(secret, body).items()}
    assert all(400 <= status < 500 for status in answers.values()), answers
