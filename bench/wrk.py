"""wrk on the client core: one run, and the figures parsed from its report."""

import re
import subprocess

from bench.servers import CLIENT_CORE

SECONDS, CONNECTIONS = 10, 50


def run(url, headers=(), script=None, env=None, seconds=SECONDS):
    """req/s, p50 and p99 in ms, the count of non-2xx responses and wrk's socket errors."""
    command = ["taskset", "-c", CLIENT_CORE, "wrk", "-t2", f"-c{CONNECTIONS}", f"-d{seconds}s", "--latency"]
    for header in headers:
        command += ["-H", header]
    if script:
        command += ["-s", script]
    output = subprocess.run(command + [url], capture_output=True, text=True, env=env, check=True).stdout
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
    errors = re.search(r"Socket errors: (.*)", output)
    return {
        "rps": float(re.search(r"Requests/sec:\s+([\d.]+)", output)[1]),
        "p50": latency_ms(re.search(r"^\s+50%\s+(\S+)", output, re.M)[1]),
        "p99": latency_ms(re.search(r"^\s+99%\s+(\S+)", output, re.M)[1]),
        "non_2xx": int(non_2xx[1]) if non_2xx else 0,
        "errors": errors[1] if errors else "none",
    }


def latency_ms(text):
    match = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text)
    if match is None:
        raise ValueError(f"wrk printed a latency of {text!r}")
    value, unit = match.groups()
    return float(value) * {"us": 0.001, "ms": 1, "s": 1000, "m": 60_000}[unit]
