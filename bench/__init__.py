"""The benchmark suite, run by hand from the project root; docs/performance.md has its figures.

All parts at once, or a few, with one JSON report (bench/run.py's docstring lists the commands):

    python bench/run.py PART [PART ...] [--against DIR] [--json FILE] [--quick] [options]

Each part alone, always as a module of this package (`python -m`, from the project root), with
the same options where they apply (--help lists them); --quick makes a smoke run, never figures:

    python -m bench.rest          # REST under wrk, x bare, ÷ the peer     (run.py's part: rest)
    python -m bench.redislimits   # protected/test, limits in Redis ÷ memory          (redis)
    python -m bench.scale         # PostgreSQL + Redis ÷ SQLite + memory              (scale)
    python -m bench.timesockets   # tick lateness and memory per time socket          (sockets)
    python -m bench.stalled       # 3,000 time sockets, 1 % of them stalled           (stalled)
    python -m bench.echo          # echo round trips, x the bare flask-sock echo      (echo)
    python -m bench.cycles        # RSS over 1,000 connect/disconnect cycles          (cycles)
    python -m bench.logins        # GET /api/v1/status while 20 users log in          (logins)
    python -m bench.startup       # `import app` ÷ `import flask`, fresh processes    (startup)
    python -m bench.capacity      # Redis, PostgreSQL and memory per request, key, socket (capacity)

Shared by the parts: servers.py (gunicorn with one pinned worker, free ports, the service's
environment, seeded keys, copied accounts), wrk.py (a run and its parsed report), clients.py (the
WebSocket clients: raw handshakes, the kernel-stamped time-socket reader, the asyncio echo client;
percentiles), sharedstores.py (a redis-server of the bench's own, a PostgreSQL database made afresh,
and their counters read from outside), suite.py (the command line and the JSON report). bare.py and
bare.conf.py are the ceiling: a bare Flask route and a bare flask-sock echo under the service's
gunicorn settings; peer.py is the peer: protected/test on FastAPI and uvicorn, as a user might write
it instead. Standalone: hotpath.py (CPU time, or with --instructions CPU instructions through the
app, or with --served the gunicorn worker's instructions, per protected/test against another
checkout and the bare route), sendfloor.py (the machine's floor for the time sockets' tick: a server
that writes the same frame to every socket in a bare loop of `send`, read as the service is),
lifecycle.py (usage rows over a simulated year, p99 during a prune), billing.py (the billing
export's exactness under faults, events a second and lag, for each target; billingstores.py its
stores and their rows), pgbouncer.py (the service behind PgBouncer in transaction mode, needs
pgbouncer) and plot.py (PNGs from a --json report).

The parts import the service's modules (accounts, auth, app ...) from the project root, so a
module here is never named like one of them or like a library (sockets, redis, select). The two
exceptions, lifecycle.py and billing.py, are imported only as bench.lifecycle and bench.billing;
run as scripts, they and run.py first take bench/ off the path, where they would shadow the
service's lifecycle module and billing package.
"""
