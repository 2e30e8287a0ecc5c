"""What `import app` loads: with the default settings, no library of a feature they leave unused;
a serving process loads those its requests would, before it freezes its heap."""

import subprocess
import sys

from liveserver import ROOT, service_env

# Each is imported where its feature is used: PostgreSQL's driver when a PostgreSQL URL is opened
# (store/pgdriver.py), Redis by limits' storage for a Redis URL; passkeys, cryptography, segno and
# smtplib by a request that uses them, or by serving/warmup.py in a serving process.
DEFERRED = {"psycopg", "psycopg2", "redis", "webauthn", "cryptography", "segno", "smtplib"}
CONFIGURED = {"psycopg", "psycopg2", "redis"}


def loaded_by(program, tmp_path):
    loaded = subprocess.run([sys.executable, "-c", f"import sys, app; {program}; print(*sorted(sys.modules))"],
                            cwd=ROOT, env=service_env(tmp_path), capture_output=True, text=True, timeout=60,
                            check=True).stdout.split()
    assert "models" in loaded
    return {name.split(".")[0] for name in loaded}


def test_import_app_with_the_defaults_loads_no_library_of_an_unused_feature(tmp_path):
    assert sorted(DEFERRED & loaded_by("pass", tmp_path)) == []


def test_a_serving_process_loads_what_its_requests_would_before_it_freezes_its_heap(tmp_path):
    loaded = loaded_by("from serving import warmup; warmup.freeze_heap()", tmp_path)
    assert sorted(DEFERRED - CONFIGURED - loaded) == []
    assert sorted(CONFIGURED & loaded) == []
