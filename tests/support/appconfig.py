"""The rate-limit tiers of the in-process test apps (tests/conftest.py's `app` fixture and the
modules that make apps of their own)."""

TEST_TIERS = "free=3/minute,pro=100/minute"
