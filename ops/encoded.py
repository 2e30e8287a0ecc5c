"""A view's answer that carries its own JSON: one whose large parts are kept for many requests
(metering/analytics.py's history) is written from their JSON, kept with them, rather than encoded
whole again for each request."""

import json

# What the app's JSON provider writes (serving/flaskapp.py's CompactJson): no spaces, ASCII only.
encode = json.JSONEncoder(separators=(",", ":")).encode


class Encoded(dict):
    """The answer as a dict, for whatever reads it, and as the JSON text that the fast lane and the
    app's JSON provider send instead of encoding the dict (`json`; its maker keeps the two equal)."""

    __slots__ = ("json",)

    def __init__(self, text, /, **items):
        super().__init__(**items)
        self.json = text
