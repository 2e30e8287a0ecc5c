"""A reload (SIGHUP to gunicorn's master) under steady load: no request refused, failed or held."""

import os
import signal
import threading
import time

import redis
import requests
from liveserver import ROOT, children, make_key, metrics_folder, service_env, start_procfile, wait_for
from privateservers import PrivateRedis

SLOW_IMPORT = ROOT / "tests" / "fixtures" / "slow_app_import"


class SteadyLoad:
    """Client threads calling a URL back to back, keeping each answer's status and duration."""

    def __init__(self, url, headers, threads=4):
        self.url, self.headers = url, headers
        self.results = []
        self.running = True
        self.threads = [threading.Thread(target=self.call) for _ in range(threads)]
        for thread in self.threads:
            thread.start()

    def call(self):
        session = requests.Session()
        while self.running:
            started = time.monotonic()
            try:
                outcome = session.get(self.url, headers=self.headers, timeout=10).status_code
            except requests.RequestException as error:
                outcome = repr(error)
            self.results.append((outcome, time.monotonic() - started))

    def stop(self):
        self.running = False
        for thread in self.threads:
            thread.join()
        return self.results


def test_a_reload_refuses_fails_and_holds_no_request_and_leaves_no_file(tmp_path):
    # Workers that take 1.5 s to load the app: before, every request of the reload waited for them.
    env = service_env(tmp_path, WEB_CONCURRENCY="2", PYTHONPATH=str(SLOW_IMPORT), SLOW_APP_IMPORT_SECONDS="1.5")
    key = make_key(dict(env, PYTHONPATH="", SLOW_APP_IMPORT_SECONDS="0"))
    server = start_procfile(tmp_path, env)
    load = SteadyLoad(server.base + "/api/v1/protected/test", {"X-API-Key": key})
    try:
        time.sleep(0.5)
        folder = metrics_folder(server.process.pid)
        for reloads in (1, 2):
            os.kill(server.process.pid, signal.SIGHUP)
            # Both old workers have gone once their replacements serve.
            wait_for(lambda: server.output().count("Worker exiting") >= 2 * reloads)
            time.sleep(0.5)
    finally:
        # Also when a step failed: the threads would otherwise call the stopped server for ever.
        results = load.stop()
        server.stop()
    outcomes = {outcome for outcome, _ in results}
    assert outcomes == {200}, outcomes
    slowest = max(duration for _, duration in results)
    assert slowest < 1, f"a request waited {slowest:.2f} s during a reload"
    assert len(results) > 100
    assert not os.path.exists(folder)
    assert "Traceback" not in server.output()


def test_gunicorn_still_calls_on_reload_before_it_forks_the_new_workers():
    # gunicorn.conf.py's on_reload raises the arbiter's num_workers and reads WORKERS and
    # worker_age, which are not public API: this fails loudly if a new gunicorn moves them.
    import inspect

    from gunicorn.arbiter import Arbiter

    reload = inspect.getsource(Arbiter.reload)
    assert reload.index("self.cfg.on_reload(self)") < reload.index("self.spawn_worker()") \
        < reload.index("self.manage_workers()")
    manage = inspect.getsource(Arbiter.manage_workers)
    assert "while len(workers) > self.num_workers" in manage
    spawn = inspect.getsource(Arbiter.spawn_worker)
    assert "self.worker_age += 1" in spawn and "self.WORKERS[pid] = worker" in spawn
    assert "self.cfg.child_exit(self, worker)" in inspect.getsource(Arbiter.reap_workers)


def test_a_replacement_that_dies_before_it_serves_leaves_no_old_worker_behind(tmp_path):
    env = service_env(tmp_path, WEB_CONCURRENCY="2", PYTHONPATH=str(SLOW_IMPORT), SLOW_APP_IMPORT_SECONDS="2")
    key = make_key(dict(env, PYTHONPATH="", SLOW_APP_IMPORT_SECONDS="0"))
    server = start_procfile(tmp_path, env)
    try:
        master = server.process.pid
        old = set(children(master))
        assert len(old) == 2
        os.kill(master, signal.SIGHUP)
        wait_for(lambda: len(set(children(master)) - old) == 2)
        # Killed while it loads the app: it never served, so never stopped the old worker it replaced.
        os.kill(min(set(children(master)) - old), signal.SIGKILL)
        wait_for(lambda: not old & set(children(master)) and len(children(master)) == 2)
        time.sleep(1)
        assert len(children(master)) == 2
        assert requests.get(server.base + "/api/v1/protected/test", headers={"X-API-Key": key},
                            timeout=10).status_code == 200
    finally:
        server.stop()


def test_workers_connect_before_a_request_needs_it_after_a_reload_too(tmp_path):
    # A new worker's first requests would otherwise each open a connection, on a loaded machine
    # for many times a warm request's time, just as the reload retires the old worker beside it.
    private = PrivateRedis()
    try:
        server = start_procfile(tmp_path, service_env(tmp_path, WEB_CONCURRENCY="2", RATELIMIT_STORAGE_URL=private.url))
        observer = redis.Redis.from_url(private.url)
        try:
            def workers_connected():
                return len(observer.client_list()) - 1

            master = server.process.pid
            # The first worker up has answered; the second may still be starting.
            wait_for(lambda: workers_connected() == 2)
            first = set(children(master))
            os.kill(master, signal.SIGHUP)
            wait_for(lambda: not first & set(children(master)) and len(children(master)) == 2)
            # Nothing has been asked of the new workers: what they hold, they opened to serve (Redis
            # may take a moment to see the old workers' connections close).
            wait_for(lambda: workers_connected() == 2)
        finally:
            observer.close()
            server.stop()
    finally:
        private.close()
