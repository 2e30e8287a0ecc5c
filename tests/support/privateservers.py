"""A PostgreSQL cluster and a Redis server of their own, on free ports: a test's, which it may stop,
kill and start again without touching the servers other tests use, or (Redis) a test process's."""

import ctypes
import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import services
from liveserver import free_port

PR_SET_PDEATHSIG = 1
prctl = ctypes.CDLL(None, use_errno=True).prctl


def wait_until_listening(port, seconds=60):
    deadline = time.monotonic() + seconds
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def dying_with(parent):
    """What a child runs before its program: the kernel kills it when the thread that started it
    ends, however that ends (a SIGKILL too, which no finalizer or atexit outlives). The tests run in
    their process's main thread, pytest-xdist's workers' too."""

    def set_in_child():
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # it ended before the line above
            os._exit(1)

    return set_in_child


def postgres_bin():
    """The folder of PostgreSQL's server programs, or a skip naming what is missing."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        services.unavailable("PostgreSQL's server programs (initdb, pg_ctl) are not installed "
                             "(Debian: apt-get install postgresql)")
    return os.path.dirname(found[-1])


class PrivatePostgres:
    """A cluster in a folder of the test's, trust authentication, logging to a file the test reads."""

    def __init__(self):
        self.bin = postgres_bin()
        # Not under pytest's tmp_path: as root, the cluster runs as postgres, who cannot enter it.
        self.folder = folder = tempfile.mkdtemp(prefix="apitest-postgres-")
        self.data = os.path.join(folder, "data")
        self.log = os.path.join(folder, "postgres.log")
        self.port = free_port()
        self.user = []
        if os.geteuid() == 0:
            # initdb refuses to run as root.
            if shutil.which("runuser") is None:
                services.unavailable("running as root without runuser to start PostgreSQL as its own user")
            self.user = ["runuser", "-u", "postgres", "--"]
            shutil.chown(folder, "postgres")
        self.run("initdb", "-D", self.data, "-A", "trust", "-U", "postgres", "--no-sync")
        self.start()

    def run(self, program, *args):
        done = subprocess.run([*self.user, os.path.join(self.bin, program), *args], capture_output=True, text=True,
                              timeout=60)
        if done.returncode:
            raise RuntimeError(f"{program} failed: {done.stdout}{done.stderr}")

    @property
    def url(self):
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def start(self):
        self.run("pg_ctl", "-D", self.data, "-l", self.log, "-w", "-o",
                 f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 -c fsync=off", "start")

    def stop(self, mode="fast"):
        self.run("pg_ctl", "-D", self.data, "-m", mode, "-w", "stop")

    def close(self):
        try:
            self.stop("immediate")
        except RuntimeError:
            pass
        shutil.rmtree(self.folder, ignore_errors=True)

    def logged(self):
        with open(self.log) as log:
            return log.read()


class PrivateRedis:
    """redis-server on a free port, keeping nothing on disk, ending with the process that started it."""

    def __init__(self):
        self.program = shutil.which("redis-server")
        if self.program is None:
            services.unavailable("redis-server is not installed (Debian: apt-get install redis-server)")
        self.port = free_port()
        self.process = None
        self.start()

    @property
    def url(self):
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self):
        self.process = subprocess.Popen(
            [self.program, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=dying_with(os.getpid()))
        wait_until_listening(self.port)

    def kill(self):
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def close(self):
        if self.process.poll() is None:
            self.kill()
