"""Render the numbers bench/run.py (or a part run alone) wrote with --json as one PNG per part,
each stamped with its command and date.

    pip install -r bench/requirements.txt
    python bench/plot.py docs/bench/results.json docs/bench/     # writes docs/bench/<part>.png
"""

import argparse
import json
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display, no GUI toolkit
import matplotlib.pyplot as plt  # noqa: E402

BAR, RUN, BASE, FLOOR = "#4c72b0", "#222222", "#b0b0b0", "#dd8452"


def label(name):
    """A scenario's name as run.py prints it, without its markdown."""
    return name.replace("`", "")


def stamp(figure, report, caption):
    """Title the figure and write the command and the date under it."""
    figure.suptitle(caption, fontsize=11, fontweight="bold")
    machine = report["machine"]
    figure.text(0.01, 0.01, f"{report['date']}: {report['command']}   ({machine['cores']} cores, Python "
                f"{machine['python']}, one gevent worker on core {machine['server_core']}, clients on core "
                f"{machine['client_core']})", fontsize=7, color="#555555")
    figure.tight_layout(rect=(0, 0.04, 1, 0.95))


def bars_with_runs(axis, names, runs, median, colours=None, notes=None):
    """Horizontal bars of each name's median, with each run as a dot on it and notes[name], if
    given, written right of the last dot."""
    positions = range(len(names))
    axis.barh(positions, [median(name) for name in names], color=colours or BAR)
    for position, name in zip(positions, names):
        values = runs(name)
        axis.plot(values, [position] * len(values), "o", color=RUN, markersize=3)
        if notes:
            axis.annotate(notes[name], (max(values), position), xytext=(5, 0), textcoords="offset points",
                          va="center", fontsize=8)
    widest = max(max(runs(name)) for name in names)
    axis.set_xlim(0, widest * (1.55 if notes else 1.1))
    axis.set_yticks(list(positions), [label(name) for name in names], fontsize=8)
    axis.invert_yaxis()
    axis.grid(axis="x", alpha=0.3)


def plot_rest(part, report):
    names = list(part["cases"])
    bare = part["cases"][part["bare"]]["median"]["rps"]
    colours = [BASE if name == part["bare"] else BAR for name in names]
    figure, (speed, tail) = plt.subplots(1, 2, figsize=(11, 3.6), sharey=True)
    medians = {name: part["cases"][name]["median"]["rps"] for name in names}
    bars_with_runs(speed, names, lambda n: [run["rps"] for run in part["cases"][n]["runs"]], medians.get,
                   colours, {name: f"{rps:,.0f} ({rps / bare:.2f} x bare)" for name, rps in medians.items()})
    speed.set_xlabel("requests/s (bar: median; dots: each run)")
    bars_with_runs(tail, names, lambda n: [run["p99"] for run in part["cases"][n]["runs"]],
                   lambda n: part["cases"][n]["median"]["p99"], colours)
    tail.set_xlabel("p99 latency, ms")
    s = report["settings"]
    stamp(figure, report, f"REST: wrk -t2 -c{s['wrk_connections']} -d{s['wrk_seconds']}s, "
                          f"{s['repetitions']} interleaved runs after a warm-up")
    return figure


def plot_echo(part, report):
    names = list(part["cases"])
    bare = part["cases"][part["bare"]]["median"]["round_trips_per_s"]
    colours = [BASE if name == part["bare"] else BAR for name in names]
    figure, (speed, tail) = plt.subplots(1, 2, figsize=(11, 2.6), sharey=True)
    medians = {name: part["cases"][name]["median"]["round_trips_per_s"] for name in names}
    bars_with_runs(speed, names, lambda n: [run["round_trips_per_s"] for run in part["cases"][n]["runs"]],
                   medians.get, colours,
                   {name: f"{rate:,.0f} ({rate / bare:.2f} x bare)" for name, rate in medians.items()})
    speed.set_xlabel("round trips/s (bar: median; dots: each run)")
    bars_with_runs(tail, names, lambda n: [run["p99_ms"] for run in part["cases"][n]["runs"]],
                   lambda n: part["cases"][n]["median"]["p99_ms"], colours)
    tail.set_xlabel("p99 round trip, ms")
    stamp(figure, report, f"Echo socket: {part['clients']} connections, one message in flight on each, "
                          f"{report['settings']['echo_seconds']} s a run")
    return figure


def plot_sockets(part, report):
    """Lines for the first run (rows without a run number are one run's); each later run's p99 as dots."""
    measured = [row for row in part["rows"] if row["arrived_ms"]]
    rows = [row for row in measured if row.get("run", 1) == 1]
    counts = [row["sockets"] for row in rows]
    figure, (late, memory) = plt.subplots(1, 2, figsize=(11, 3.6), gridspec_kw={"width_ratios": (2, 1)})
    for field, style in (("p99", "-"), ("p50", "--")):
        late.plot(counts, [row["arrived_ms"][field] for row in rows], style, marker="o", color=BAR,
                  label=f"arrived at the client, {field}")
    later = [row for row in measured if row.get("run", 1) > 1]
    if later:
        late.plot([row["sockets"] for row in later], [row["arrived_ms"]["p99"] for row in later], "o",
                  color=RUN, markersize=3, label="arrived, p99, later runs")
    late.plot(counts, [row["built_ms"]["p99"] for row in rows], "-", marker=".", color=BASE,
              label="message built by the server, p99")
    floors = [row for row in measured if row.get("floor_arrived_ms")]
    if floors:
        late.plot([row["sockets"] for row in floors], [row["floor_arrived_ms"]["p99"] for row in floors], "_",
                  color=FLOOR, markersize=16, markeredgewidth=2,
                  label="the floor's p99 before each run: a bare send loop's server")
    late.set_xlabel("time sockets open on the worker")
    late.set_ylabel("ms after the whole second")
    late.set_xticks(counts, [f"{count:,}" for count in counts])
    late.grid(alpha=0.3)
    # Headroom for the legend above the highest point, in two columns across the top.
    highest = max([row["arrived_ms"]["p99"] for row in measured] + [row["floor_arrived_ms"]["p99"] for row in floors])
    late.set_ylim(0, highest * 1.45)
    late.legend(fontsize=7, loc="upper left", ncol=2)
    memory.bar([f"{count:,}" for count in counts], [row["rss_per_socket_kib"] for row in rows], color=BAR)
    memory.set_ylabel("worker RSS per socket, KiB")
    for position, row in enumerate(rows):
        memory.annotate(f"{row['rss_per_socket_kib']:.1f}", (position, row["rss_per_socket_kib"]),
                        ha="center", va="bottom", fontsize=8)
    failures = sum(row["handshake_failures"] for row in part["rows"])
    skipped = sum(row["skipped_seconds"] for row in part["rows"])
    stamp(figure, report, f"Time sockets: lateness of each tick after its whole second, read on {part['read']}\n"
                          f"{part['tick_seconds']} s of ticks; {failures} failed handshakes, {skipped} skipped seconds")
    return figure


def plot_ratios(part, report, groups, baseline, caption, what):
    """Each round's req/s and p99 of every group ÷ the baseline's in the same round."""
    names = [name for name in part[groups] if name != baseline]
    runs = part[groups]
    base = runs[baseline]
    colours = [BASE if name == part.get("bare") else BAR for name in names]
    figure, (speed, tail) = plt.subplots(1, 2, figsize=(11, 1.3 + 0.55 * len(names)), sharey=True)
    for axis, field, title in ((speed, "rps", "req/s"), (tail, "p99", "p99 latency")):
        ratios = {name: [run[field] / other[field] for run, other in zip(runs[name], base)] for name in names}
        bars_with_runs(axis, names, ratios.get, lambda n: statistics.median(ratios[n]), colours,
                       {name: ", ".join(f"{ratio:.2f}" for ratio in values) for name, values in ratios.items()})
        axis.axvline(1, color=RUN, linewidth=0.8)
        axis.set_xlabel(f"{title} ÷ {label(baseline)} in the same round")
    stamp(figure, report, f"{caption}\n{what}")
    return figure


def plot_scale(part, report):
    s = report["settings"]
    return plot_ratios(part, report, "configurations", part["baseline"],
                       f"GET /api/v1/protected/test, 1 key, one worker each: wrk -t2 -c{s['wrk_connections']} "
                       f"-d{s['wrk_seconds']}s, {s['repetitions']} rounds after a warm-up",
                       "bar: median of the rounds; dots and figures: each round")


def plot_redis(part, report):
    s = report["settings"]
    return plot_ratios(part, report, "storages", part["baseline"],
                       f"GET /api/v1/protected/test, 1 key, by limit storage: wrk -t2 -c{s['wrk_connections']} "
                       f"-d{s['wrk_seconds']}s, {s['repetitions']} runs, the order rotated each run",
                       "bar: median of the runs; dots and figures: each run")


def plot_stalled(part, report):
    cases = list(part["cases"])
    figure, axis = plt.subplots(figsize=(11, 0.9 + 0.6 * len(cases)))
    p99s = {case: [run["arrived_ms"]["p99"] for run in runs] for case, runs in part["cases"].items()}
    bars_with_runs(axis, cases, p99s.get, lambda c: statistics.median(p99s[c]), notes={
        case: " / ".join(f"{p99:.1f}" for p99 in values) + " ms" for case, values in p99s.items()})
    axis.set_xlabel("p99 lateness of arrival on the healthy sample, ms (bar: median; dots: runs)")
    stamp(figure, report, f"{part['sockets']:,} time sockets, {part['stalled_sockets']} of them stalled")
    return figure


def plot_logins(part, report):
    runs = part["runs"]
    figure, axis = plt.subplots(figsize=(11, 3))
    positions = range(len(runs))
    axis.bar([p - 0.2 for p in positions], [run["alone_ms"]["p99"] for run in runs], 0.4, color=BASE,
             label="alone")
    axis.bar([p + 0.2 for p in positions], [run["during_ms"]["p99"] for run in runs], 0.4, color=BAR,
             label=f"while {part['users']} users log in {part['logins_each']} times each")
    for position, run in zip(positions, runs):
        axis.annotate(f"{run['during_ms']['p99'] / run['alone_ms']['p99']:.2f} x; log-ins took "
                      f"{run['logins_took_s']:.0f} s", (position + 0.2, run["during_ms"]["p99"]),
                      ha="center", va="bottom", fontsize=8)
    axis.set_xticks(list(positions), [f"run {p + 1}" for p in positions])
    axis.set_ylabel("p99 of GET /api/v1/status, ms")
    axis.set_ylim(0, 1.25 * max(run["during_ms"]["p99"] for run in runs))
    axis.legend(fontsize=8, loc="upper left")
    stamp(figure, report, f"GET /api/v1/status on {part['connections']} connections, alone and during log-ins")
    return figure


PLOTS = {"rest": plot_rest, "echo": plot_echo, "sockets": plot_sockets, "scale": plot_scale,
         "redis": plot_redis, "stalled": plot_stalled, "logins": plot_logins}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path, help="the JSON file bench/run.py --json wrote")
    parser.add_argument("folder", type=Path, help="where to write <part>.png")
    args = parser.parse_args()
    report = json.loads(args.results.read_text())
    args.folder.mkdir(parents=True, exist_ok=True)
    for part, numbers in report["parts"].items():
        if part not in PLOTS:  # cycles: one number, stated in the page
            continue
        figure = PLOTS[part](numbers, report)
        path = args.folder / f"{part}.png"
        figure.savefig(path, dpi=110)
        plt.close(figure)
        print(path)


if __name__ == "__main__":
    main()
