"""Faults under the SQLite file of a running server (its disk filling up, the files turning
read-only): keyed requests go on, usage counts wait in memory, writes that cannot wait fail with
a clear error, and nothing is lost once the fault is gone."""

import contextlib
import os
import subprocess

import pytest
import requests
import services
from liveserver import assert_served_and_stored, make_key, run_cli, service_env, start_procfile, stored_total, wait_for


@pytest.fixture
def small_disk(tmp_path):
    """A 4 MiB tmpfs for the database; needs root, as CI has."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        services.unavailable(f"cannot mount a tmpfs here ({mounted.stderr.decode().strip()})")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=True)


@contextlib.contextmanager
def full(disk):
    """Fill the disk to the last byte while the block runs."""
    filler = disk / "filler"
    subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=64k"], capture_output=True)
    try:
        yield
    finally:
        filler.unlink()


@pytest.fixture
def immutable_files_refuse_writes(tmp_path):
    """Make sure `chattr +i` makes a file refuse writes even through descriptors already open,
    as ext4 does after the flag (and as after a read-only remount): chmod does neither for root
    nor for open files, and tmpfs ignores the flag for them. Needs root, as CI has."""
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
        services.unavailable(f"cannot make a file refuse writes here ({reason})")


@contextlib.contextmanager
def read_only(*paths):
    """Make the files immutable while the block runs."""
    frozen = []
    try:
        for path in paths:
            subprocess.run(["chattr", "+i", str(path)], check=True)
            frozen.append(path)
        yield
    finally:
        for path in frozen:
            subprocess.run(["chattr", "-i", str(path)], check=True)


def assert_counts_wait_out(tmp_path, database, fault, while_it_lasts=lambda env: None):
    """Serve keyed requests before, during and after the fault (a context manager): they all
    answer, the counts wait in memory while it lasts and reach the database by themselves after."""
    env = service_env(tmp_path, DATABASE_URL=f"sqlite:///{database}")
    key = make_key(env)
    headers = {"X-API-Key": key}
    server = start_procfile(tmp_path, env)
    try:
        assert_served_and_stored(server, env, key, 20)

        with fault:
            for _ in range(30):
                served = requests.get(server.base + "/api/v1/protected/test", headers=headers, timeout=10)
                assert served.status_code == 200
            stats = requests.get(server.base + "/api/v1/usage/stats", headers=headers, timeout=10)
            assert stats.status_code == 200
            assert stats.json()["total_requests"] == 51
            server.wait_for_output("Could not write usage counts")
            assert stored_total(env["DATABASE_URL"], key) == 20
            while_it_lasts(env)

        wait_for(lambda: stored_total(env["DATABASE_URL"], key) == 51)
        assert requests.get(server.base + "/api/v1/protected/test", headers=headers, timeout=10).status_code == 200
    finally:
        server.stop()
    assert stored_total(env["DATABASE_URL"], key) == 52


def test_counts_wait_out_a_full_disk(tmp_path, small_disk):
    assert_counts_wait_out(tmp_path, small_disk / "service.db", full(small_disk))


def test_counts_wait_out_a_read_only_database(tmp_path, immutable_files_refuse_writes):
    database = tmp_path / "service.db"

    def cli_refuses_with_a_sentence(env):
        refused = run_cli(env, "keys", "create", "carol", "--name", "later", "--type", "development")
        assert refused.returncode != 0
        assert "Traceback" not in refused.stderr
        assert refused.stderr.strip()

    assert_counts_wait_out(tmp_path, database, read_only(database, tmp_path / "service.db-wal"),
                           cli_refuses_with_a_sentence)
