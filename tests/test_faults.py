"""Faults under the SQLite file of a running server (its disk filling up, the files turning
read-only): keyed requests go on, usage counts wait in memory, writes that cannot wait fail with
a clear error, and nothing is lost once the fault is gone."""

import os
import subprocess

import pytest
import requests

from liveserver import make_key, run_cli, service_env, start_procfile, stored_total, wait_for


@pytest.fixture
def small_disk(tmp_path):
    """A 4 MiB tmpfs for the database; needs root, as CI has."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        message = f"cannot mount a tmpfs here ({mounted.stderr.decode().strip()})"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=True)


def fill(disk):
    """Fill the disk to the last byte; return the filler file."""
    filler = disk / "filler"
    subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=64k"], capture_output=True)
    return filler


def test_counts_wait_out_a_full_disk(tmp_path, small_disk):
    env = service_env(tmp_path, DATABASE_URL=f"sqlite:///{small_disk}/service.db")
    key = make_key(env)
    headers = {"X-API-Key": key}
    server = start_procfile(tmp_path, env)
    try:
        for _ in range(20):
            assert requests.get(server.base + "/api/v1/protected/test", headers=headers).status_code == 200
        wait_for(lambda: stored_total(env["DATABASE_URL"], key) == 20)

        filler = fill(small_disk)
        for _ in range(30):
            assert requests.get(server.base + "/api/v1/protected/test", headers=headers).status_code == 200
        stats = requests.get(server.base + "/api/v1/usage/stats", headers=headers)
        assert stats.status_code == 200
        assert stats.json()["total_requests"] == 51
        server.wait_for_output("Could not write usage counts")
        assert stored_total(env["DATABASE_URL"], key) == 20

        filler.unlink()
        wait_for(lambda: stored_total(env["DATABASE_URL"], key) == 51)
        assert requests.get(server.base + "/api/v1/protected/test", headers=headers).status_code == 200
    finally:
        server.stop()
    assert stored_total(env["DATABASE_URL"], key) == 52


@pytest.fixture
def make_read_only(tmp_path):
    """Return a function that makes files immutable: unlike chmod, which root ignores and which
    spares open descriptors, ext4 then refuses every write to them, as after a read-only remount.
    Needs root and such a filesystem, as CI has; the files are made writable again afterwards."""
    probe = tmp_path / "probe"
    with open(probe, "wb") as handle:
        done = subprocess.run(["chattr", "+i", str(probe)], capture_output=True, text=True)
        try:
            os.write(handle.fileno(), b"x")
            refused = False
        except OSError:
            refused = True
        subprocess.run(["chattr", "-i", str(probe)], capture_output=True)
    if not refused:
        reason = done.stderr.strip() or "the filesystem still writes through open descriptors"
        message = f"cannot make a file refuse writes here ({reason})"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    frozen = []

    def freeze(*paths):
        for path in paths:
            subprocess.run(["chattr", "+i", str(path)], check=True)
            frozen.append(path)

    def thaw():
        while frozen:
            subprocess.run(["chattr", "-i", str(frozen.pop())], check=True)

    freeze.thaw = thaw
    yield freeze
    thaw()


def test_counts_wait_out_a_read_only_database(tmp_path, make_read_only):
    database = tmp_path / "service.db"
    env = service_env(tmp_path, DATABASE_URL=f"sqlite:///{database}")
    key = make_key(env)
    headers = {"X-API-Key": key}
    server = start_procfile(tmp_path, env)
    try:
        for _ in range(20):
            assert requests.get(server.base + "/api/v1/protected/test", headers=headers).status_code == 200
        wait_for(lambda: stored_total(env["DATABASE_URL"], key) == 20)

        make_read_only(database, tmp_path / "service.db-wal")
        for _ in range(30):
            assert requests.get(server.base + "/api/v1/protected/test", headers=headers).status_code == 200
        assert requests.get(server.base + "/api/v1/usage/stats", headers=headers).json()["total_requests"] == 51
        server.wait_for_output("Could not write usage counts")
        assert stored_total(env["DATABASE_URL"], key) == 20

        refused = run_cli(env, "keys", "create", "carol", "--name", "later", "--type", "development")
        assert refused.returncode != 0
        assert "Traceback" not in refused.stderr
        assert refused.stderr.strip()

        make_read_only.thaw()
        wait_for(lambda: stored_total(env["DATABASE_URL"], key) == 51)
        assert requests.get(server.base + "/api/v1/protected/test", headers=headers).status_code == 200
    finally:
        server.stop()
    assert stored_total(env["DATABASE_URL"], key) == 52
