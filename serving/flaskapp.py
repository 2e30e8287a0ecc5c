"""The Flask app's class: Flask and Werkzeug adapted where their defaults cost every request or every
start (JSON responses, URL builders, the coroutine check), and OPTIONS answered with 204. LazyBuilderRule
reaches into Werkzeug (Rule._compile_builder); tests/unit/test_app.py fails if a new version moves it."""

import functools
from json import JSONEncoder

from flask import Flask
from flask.json.provider import DefaultJSONProvider
from werkzeug.routing import Rule

from ops.encoded import Encoded


class CompactJson(DefaultJSONProvider):
    """Flask's JSON responses, keys in the order the views give them, written by one encoder made
    once: json.dumps with Flask's arguments makes a new encoder for every response."""

    sort_keys = False

    def __init__(self, app):
        super().__init__(app)
        self.encoder = JSONEncoder(default=self.default, ensure_ascii=self.ensure_ascii, separators=(",", ":"))

    def response(self, *args, **kwargs):
        # A view's dict or list comes as the one argument; other forms and debug's indented
        # output go Flask's way.
        if len(args) != 1 or kwargs or self._app.debug or self.compact is False:
            return super().response(*args, **kwargs)
        answer = args[0]
        text = answer.json if type(answer) is Encoded else self.encoder.encode(answer)
        return self._app.response_class(text + "\n", mimetype=self.mimetype)


class LazyBuilderRule(Rule):
    """A URL rule that compiles its URL builders when it first builds a URL (url_for), not when it
    is added. werkzeug compiles two for each rule as the app is made: with the defaults,
    create_app took 19.2 ms with them and 7.6 without (68 rules), paid at every worker's boot and
    every CLI command, for the few rules a process builds URLs with."""

    def _compile_builder(self, append_unknown=True):
        compile_builder = functools.partial(super()._compile_builder, append_unknown)
        compiled = None

        # The rule positional-only: a URL value may be called "rule" too (werkzeug names it ".self").
        def build(rule, /, *args, **kwargs):
            nonlocal compiled
            if compiled is None:
                compiled = compile_builder()
            return compiled(rule, *args, **kwargs)

        return build


class Service(Flask):
    json_provider_class = CompactJson
    url_rule_class = LazyBuilderRule

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.synced_functions = {}

    def ensure_sync(self, func):
        """Flask asks of every hook and view, on every request, whether it is a coroutine function
        (inspect's check, six times a keyed request); the answer never changes, so it is kept."""
        synced = self.synced_functions.get(func)
        if synced is None:
            synced = self.synced_functions[func] = super().ensure_sync(func)
        return synced

    def make_default_options_response(self):
        """OPTIONS: 204 with Allow and no body (Flask's own is a 200 with an empty HTML body)."""
        response = super().make_default_options_response()
        response.status_code = 204
        del response.headers["Content-Type"]
        return response
