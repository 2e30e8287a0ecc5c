"""The settings of the in-process test apps (tests/conftest.py's `app` fixture and the modules that
make apps of their own), the schema such an app builds, and the templates they share compiled."""

import jinja2

TEST_TIERS = "free=3/minute,pro=100/minute"
# The settings of the `app` fixture's app, but for its DATABASE_URL.
APP_SETTINGS = {
    "RATELIMIT_STORAGE_URL": "memory://",
    "RATE_LIMIT_TIERS": TEST_TIERS,
    "PUBLIC_RATE_LIMIT": "5/minute",
    "TESTING": True,
    # tests/unit/web/test_views.py turns CSRF back on where it is the subject.
    "WTF_CSRF_ENABLED": False,
}


def build_schema(database_url):
    """Make in an empty database what the `app` fixture's app makes at its start."""
    from app import close_app, create_app

    close_app(create_app({**APP_SETTINGS, "DATABASE_URL": database_url}))


class CompiledTemplates(jinja2.BytecodeCache):
    """Each template compiled once per test process rather than once per app: compiling them anew
    for each test's app took a fifth of the web tests' time. A template whose source changed is
    compiled again (jinja checks each one's checksum)."""

    def __init__(self):
        self.compiled = {}

    def load_bytecode(self, bucket):
        if (code := self.compiled.get(bucket.key)) is not None:
            bucket.bytecode_from_string(code)

    def dump_bytecode(self, bucket):
        self.compiled[bucket.key] = bucket.bytecode_to_string()


COMPILED_TEMPLATES = CompiledTemplates()


def share_compiled_templates(app):
    app.jinja_env.bytecode_cache = COMPILED_TEMPLATES
    return app
