"""The command line every part shares: its options, the header line, a fresh folder per part and
the JSON report that bench/plot.py reads."""

import argparse
import dataclasses
import datetime
import json
import os
import sys
import tempfile
from pathlib import Path

from bench import servers, wrk


@dataclasses.dataclass(frozen=True)
class Options:
    """What a part measures and for how long; QUICK shortens it for a smoke run, never for figures."""

    wrk_seconds: int = wrk.SECONDS
    repetitions: int = 3
    random_keys: int = 100_000
    socket_counts: tuple = (1000, 3000, 5000)
    tick_seconds: int = 10
    # sockets --all: a run's p99 is the tail of its slowest seconds, and about one second in fifteen
    # of a machine can come late to any server; over 60 s the floor's run and the service's each
    # hold several, where in 10 s one of them often held one and the other none.
    every_socket_seconds: int = 60
    echo_clients: int = 50
    echo_seconds: int = 10
    stalled_runs: int = 3
    login_runs: int = 3
    runs: int = 1
    all_sockets: bool = False
    against: Path | None = None
    quick: bool = False


QUICK = {"wrk_seconds": 2, "repetitions": 2, "random_keys": 10_000, "tick_seconds": 4, "every_socket_seconds": 4,
         "echo_seconds": 2, "stalled_runs": 1, "login_runs": 1}

# Each option with the parts that read it: a part run alone offers only its own.
ARGUMENTS = {
    "--against": ({"rest", "echo", "redis", "scale", "startup"}, {
        "type": Path, "metavar": "DIR",
        "help": "also measure the service in DIR, a checkout of another revision (git worktree add DIR REV), "
                "interleaved with this one"}),
    "--all": ({"sockets"}, {
        "action": "store_true", "dest": "all_sockets",
        "help": "read every socket with several client processes (kernel timestamps), not only the last 100"}),
    "--sockets": ({"sockets"}, {
        "type": int, "nargs": "+", "metavar": "N", "dest": "socket_counts",
        "help": "the counts of time sockets to open on the worker (default: 1000 3000 5000)"}),
    "--random-keys": ({"rest"}, {
        "type": int, "metavar": "N", "dest": "random_keys",
        "help": "the keys the random-key case picks from (default: 100000; the key cache holds 10,000)"}),
    "--runs": ({"rest", "sockets", "capacity"}, {
        "type": int, "metavar": "N", "help": "repeat the whole measurement N times on fresh servers (default: 1)"}),
    "--quick": (None, {
        "action": "store_true", "help": "a smoke run: shorter and fewer rounds; its figures mean nothing"}),
    "--json": (None, {
        "type": Path, "metavar": "FILE",
        "help": "also write every part's numbers to FILE, as bench/plot.py reads them"}),
}


def main(command, parts, description):
    """Parse the command line, then run the chosen parts, each in a fresh temporary folder.

    command is how the report names the program (`python bench/run.py`); parts maps each part's
    name to its measure(workdir, options) function, which prints its tables and returns its numbers
    for the JSON report."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    if len(parts) > 1:
        # Checked below: argparse 3.11 checks an empty nargs="*" against choices and refuses it.
        parser.add_argument("parts", nargs="*", help=f"any of {', '.join(parts)} (default: all)")
    for flag, (readers, settings) in ARGUMENTS.items():
        if readers is None or readers & set(parts):
            names = "" if readers is None or len(parts) == 1 else f"{', '.join(sorted(readers))}: "
            parser.add_argument(flag, **settings | {"help": names + settings["help"]})
    args = parser.parse_args()
    chosen = getattr(args, "parts", None) or list(parts)
    if unknown := set(chosen) - set(parts):
        parser.error(f"unknown parts: {', '.join(sorted(unknown))}")
    given = {name: value for name, value in vars(args).items()
             if name in {field.name for field in dataclasses.fields(Options)} and value not in (None, False)}
    if given.get("against"):
        given["against"] = given["against"].resolve()
    if "socket_counts" in given:
        given["socket_counts"] = tuple(given["socket_counts"])
    options = Options(**(QUICK if args.quick else {}) | given)

    servers.use_client_core()
    today = datetime.date.today()
    print(f"{today}, {os.cpu_count()} cores, Python {sys.version.split()[0]}, one gevent worker on core "
          f"{servers.SERVER_CORE}, clients on core {servers.CLIENT_CORE}" + (", QUICK: smoke run" * options.quick))
    report = {"date": today.isoformat(),
              "command": " ".join([command] + sys.argv[1:]),
              "machine": {"cores": os.cpu_count(), "python": sys.version.split()[0],
                          "server_core": servers.SERVER_CORE, "client_core": servers.CLIENT_CORE},
              "settings": {"wrk_seconds": options.wrk_seconds, "wrk_connections": wrk.CONNECTIONS,
                           "repetitions": options.repetitions, "random_keys": options.random_keys,
                           "socket_counts": list(options.socket_counts), "tick_seconds": options.tick_seconds,
                           "every_socket_seconds": options.every_socket_seconds,
                           "echo_clients": options.echo_clients, "echo_seconds": options.echo_seconds}
                          | ({"runs": options.runs} if options.runs > 1 else {})
                          | ({"quick": True} if options.quick else {}),
              "parts": {}}
    for part in chosen:
        with tempfile.TemporaryDirectory(prefix=f"bench-{part}-") as workdir:
            report["parts"][part] = parts[part](Path(workdir), options)
        if args.json:  # after each part, so a long run interrupted later keeps what it measured
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n")
