"""The settings of the in-process test apps (tests/conftest.py's `app` fixture and the modules that
make apps of their own), and the schema such an app builds."""

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
