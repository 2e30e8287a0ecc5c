"""What `import app` loads: with the default settings, no library of a feature they leave unused."""

import subprocess
import sys

from liveserver import ROOT, service_env

# Each is imported where its feature is used: PostgreSQL's driver when a PostgreSQL URL is opened
# (store/pgdriver.py), Redis by limits' storage for a Redis URL, passkeys on their pages,
# cryptography by the first secret sealed, segno by the first QR code.
DEFERRED = {"psycopg", "psycopg2", "redis", "webauthn", "cryptography", "segno"}


def test_import_app_with_the_defaults_loads_no_library_of_an_unused_feature(tmp_path):
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, app; print(*sorted(sys.modules))"],
        cwd=ROOT, env=service_env(tmp_path), capture_output=True, text=True, timeout=60, check=True).stdout.split()
    assert "models" in loaded
    assert sorted(DEFERRED & {name.split(".")[0] for name in loaded}) == []
