"""`import app` ÷ `import flask`: each imported by a fresh process (`python -c "import app"`), the
processes interleaved, 20 of each, pinned to the server core, in the service's environment (its
own SQLite database, limits in memory). Wall time of the whole process, the interpreter's start
included, as every CLI command and worker boot pays it, and the CPU time the process used, which
the machine's other work disturbs less; medians, and their ratios to `import flask`. One untimed
process of each first writes the bytecode and the database, as a deployed service has them.
Beside them, the Procfile's gunicorn with one worker, started, asked once and stopped: wall time
to its first answer, and the CPU of its master and worker through their whole life.

    python -m bench.startup [--against DIR] [--json FILE]
"""

import functools
import resource
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request

from bench import servers, suite

ROUNDS = 20


def run_once(statement, cwd, env):
    """(wall seconds, CPU seconds) of one pinned `python -c statement`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(["taskset", "-c", servers.SERVER_CORE, sys.executable, "-c", statement],
                   cwd=cwd, env=env, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    return wall, children_cpu_since(before)


def serve_once(checkout, env):
    """(wall seconds to the first answer, CPU seconds of the whole life) of the checkout's gunicorn
    with one worker, pinned, asked `GET /api/v1/demo/year` once and stopped."""
    port = servers.free_port()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    process = subprocess.Popen(["taskset", "-c", servers.SERVER_CORE, sys.executable, "-m", "gunicorn",
                                "-c", str(checkout / "gunicorn.conf.py"), "--chdir", str(checkout), "app:app"],
                               cwd=checkout, env=dict(env, PORT=str(port), WEB_CONCURRENCY="1"),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/demo/year", timeout=5):
                break
        except urllib.error.HTTPError as error:
            raise SystemExit(f"gunicorn in {checkout} answered {error.code}") from None
        except OSError:
            if process.poll() is not None:
                raise SystemExit(f"gunicorn in {checkout} did not start") from None
            time.sleep(0.005)
    wall = time.perf_counter() - started
    process.terminate()
    process.wait(timeout=60)
    return wall, children_cpu_since(before)


def children_cpu_since(before):
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def measure(workdir, options):
    # Bytecode written as a deployed service has it, whatever the shell says.
    env = {name: value for name, value in servers.service_env(workdir).items() if name != "PYTHONDONTWRITEBYTECODE"}
    runs = {"python -c pass": functools.partial(run_once, "pass", servers.ROOT, env),
            "import flask": functools.partial(run_once, "import flask", servers.ROOT, env),
            "import app": functools.partial(run_once, "import app", servers.ROOT, env),
            "gunicorn, to its first answer": functools.partial(serve_once, servers.ROOT, env)}
    if options.against:
        # Its own database: `import app` upgrades the schema, and an older checkout refuses a newer one.
        against_env = {**env, "DATABASE_URL": f"sqlite:///{workdir}/against.db"}
        name = options.against.name
        runs[f"import app ({name})"] = functools.partial(run_once, "import app", options.against, against_env)
        runs[f"gunicorn, to its first answer ({name})"] = functools.partial(serve_once, options.against, against_env)
    for run in runs.values():
        run()
    rounds = 3 if options.quick else ROUNDS
    times = {name: [] for name in runs}
    for repetition in range(rounds):
        for name in servers.rotated(list(runs), repetition):
            times[name].append(runs[name]())

    flask_wall = statistics.median(wall for wall, _ in times["import flask"])
    flask_cpu = statistics.median(cpu for _, cpu in times["import flask"])
    print(f"\n{rounds} fresh processes each, interleaved, pinned to core {servers.SERVER_CORE}; medians\n")
    print("| process | wall | CPU | wall ÷ `import flask` | CPU ÷ `import flask` |")
    print("|---|---|---|---|---|")
    result = {"rounds": rounds}
    for name, measured in times.items():
        wall = statistics.median(wall for wall, _ in measured)
        cpu = statistics.median(cpu for _, cpu in measured)
        print(f"| `{name}` | {wall * 1000:.0f} ms | {cpu * 1000:.0f} ms | {wall / flask_wall:.2f} | "
              f"{cpu / flask_cpu:.2f} |")
        result[name] = {"wall_ms": [round(wall * 1000, 1) for wall, _ in measured],
                        "cpu_ms": [round(cpu * 1000, 1) for _, cpu in measured],
                        "wall_ratio": round(wall / flask_wall, 2), "cpu_ratio": round(cpu / flask_cpu, 2)}
    return result


if __name__ == "__main__":
    suite.main("python -m bench.startup", {"startup": measure}, __doc__)
