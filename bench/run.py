"""Benchmark, run by hand: the service and a bare Flask app under the same gunicorn settings,
one gevent worker pinned to core 1, the load generators on core 0. Prints markdown tables;
with --json FILE, also writes every part's numbers there (bench/plot.py draws them). Each part
is a module of the bench package and runs alone too (python -m bench.rest ...; see bench/__init__.py).

    pip install -r bench/requirements.txt && apt-get install wrk
    python bench/run.py                 # everything
    python bench/run.py rest            # REST only (wrk), the FastAPI + uvicorn peer (bench/peer.py) included
    python bench/run.py rest --runs 3   # three runs on fresh servers, each run's ratios to bare and to the peer
    python bench/run.py sockets echo    # time sockets, echo round trips
    python bench/run.py sockets --all   # time sockets, every one read by several client processes
    python bench/run.py sockets --all --sockets 10000 --runs 3   # 10,000 on the worker, three runs
    python bench/run.py stalled         # 3,000 time sockets, 1 % of them stalled
    python bench/run.py echo --against ../before   # and the echo of another checkout beside it
    python bench/run.py rest --against ../before   # and its REST, interleaved with this one
    python bench/run.py logins          # GET /api/v1/status while 20 users log in
    python bench/run.py redis           # protected/test with Redis limits ÷ memory limits
    python bench/run.py redis --against ../before  # and the other checkout's Redis path beside it
    python bench/run.py scale           # protected/test on PostgreSQL + Redis ÷ SQLite + memory, and x bare
    python bench/run.py scale --against ../before  # and both configurations of the other checkout
    python bench/run.py startup         # `import app` ÷ `import flask`, in fresh processes
    python bench/run.py startup --against ../before   # and the other checkout's `import app` beside it
    python bench/run.py capacity --runs 3   # what a request, a kept key, a time socket cost Redis and PostgreSQL
    python bench/run.py rest echo --json docs/bench/results.json   # and the numbers as JSON
    python bench/run.py rest echo --quick          # a smoke run: short, its figures mean nothing
    BENCH_REDIS_URL=redis://127.0.0.1:6379/13 python bench/run.py redis   # redis, scale: another Redis database
"""

import sys
from pathlib import Path

if not __package__:
    # Run as a script, Python put bench/ first on the path, where lifecycle.py would shadow the
    # service's module of that name: import from the project root instead.
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench import (
    capacity,
    cycles,
    echo,
    logins,
    redislimits,
    rest,
    scale,
    stalled,
    startup,
    suite,
    timesockets,
)

PARTS = {"rest": rest.measure, "sockets": timesockets.measure, "stalled": stalled.measure, "echo": echo.measure,
         "cycles": cycles.measure, "logins": logins.measure, "redis": redislimits.measure, "scale": scale.measure,
         "startup": startup.measure, "capacity": capacity.measure}

if __name__ == "__main__":
    suite.main("python bench/run.py", PARTS, __doc__)
