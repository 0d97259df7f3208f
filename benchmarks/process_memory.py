"""Memory of the sapo-node processes running on this machine, sampled over hours: peaks, growth, a plot.

A long campaign or a node left running is where memory that grows without bound shows. This benchmark watches
whatever runs (it starts nothing): every ``--interval`` seconds it reads the RSS of every ``sapo-node`` process
(a node, or ``local-swarm``) and every ``p2pd`` daemon from ``/proc`` and appends one JSON line; ``report`` turns the
lines into each kind's peak, each process's growth per hour (the medians of the 2nd and of the last quarter of its
life: RSS is a sawtooth, and the first quarter is model loading and the first evaluation) and a plot.

    python -m benchmarks.process_memory sample --out runs/process_memory.jsonl       # until stopped (Ctrl-C)
    python -m benchmarks.process_memory report runs/process_memory.jsonl --name campaign_memory
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.harness import RESULTS, pyplot, quarter_growth_per_hour, rss_mb, run_record, write_report

KINDS = ("node", "local-swarm", "p2pd")


def process_kind(argv: Sequence[str]) -> str | None:
    """What a process is, from its command line: ``node``, ``local-swarm``, ``p2pd``, or None (not watched)."""
    if not argv:
        return None
    if Path(argv[0]).name == "p2pd":
        return "p2pd"
    words = list(argv)
    is_node = "sapo.node.cli" in words or Path(words[0]).name == "sapo-node" or "sapo.cli" in words
    if not is_node:
        return None
    return "local-swarm" if "local-swarm" in words else "node"


def _argv(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [part.decode(errors="replace") for part in f.read().split(b"\0") if part]
    except OSError:
        return []


def _option(argv: Sequence[str], *names: str) -> str | None:
    """The value after the first of ``names`` in ``argv`` (None if absent)."""
    for i, word in enumerate(argv[:-1]):
        if word in names:
            return argv[i + 1]
    return None


def sample() -> dict[str, Any]:
    """One reading: the time, the 1-minute load and every watched process (pid, kind, RSS MB, its run or output
    directory)."""
    processes = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        argv = _argv(int(entry))
        kind = process_kind(argv)
        rss = rss_mb(int(entry)) if kind else None
        if kind and rss is not None:
            where = _option(argv, "--run-dir", "--output_dir", "--output-dir")
            processes.append({"pid": int(entry), "kind": kind, "rss_mb": round(rss, 1), "dir": where})
    with open("/proc/loadavg") as f:
        load = float(f.read().split()[0])
    return {"time": time.time(), "load1": load, "processes": processes}


def lives(samples: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each process's readings, keyed ``<kind> <pid>``: its kind, directory and (time, RSS MB) points."""
    out: dict[str, dict[str, Any]] = {}
    for reading in samples:
        for p in reading["processes"]:
            life = out.setdefault(f"{p['kind']} {p['pid']}", {"kind": p["kind"], "dir": p.get("dir"), "points": []})
            life["points"].append((reading["time"], p["rss_mb"]))
    return out


def summarize(samples: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per kind: processes seen, peak RSS, the median of their lives' medians, the largest growth per hour of a
    life long enough to tell (8 readings or more); the readings' span in hours."""
    per_life = lives(samples)
    kinds = {}
    for kind in KINDS:
        group = [life for life in per_life.values() if life["kind"] == kind]
        if not group:
            continue
        growths = [quarter_growth_per_hour(life["points"])[2] for life in group]
        kinds[kind] = {
            "processes": len(group),
            "peak_mb": max(v for life in group for _, v in life["points"]),
            "median_mb": statistics.median(statistics.median(v for _, v in life["points"]) for life in group),
            "longest_life_hours": max((life["points"][-1][0] - life["points"][0][0]) / 3600 for life in group),
            "max_growth_mb_per_hour": max((g for g in growths if g is not None), default=None),
        }
    span = (samples[-1]["time"] - samples[0]["time"]) / 3600 if samples else 0.0
    return {"readings": len(samples), "hours": span, "kinds": kinds}


def plot(samples: Sequence[dict[str, Any]], path: Path, title: str) -> Path:
    """RSS over time, one line per process (nodes solid, p2pd dashed, local-swarm dotted)."""
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(10, 5))
    start = samples[0]["time"] if samples else 0.0
    styles = {"node": "-", "p2pd": "--", "local-swarm": ":"}
    for life in lives(samples).values():
        hours = [(t - start) / 3600 for t, _ in life["points"]]
        axis.plot(hours, [v for _, v in life["points"]], styles[life["kind"]], lw=0.9, label=None)
    for kind, style in styles.items():
        axis.plot([], [], style, color="grey", label=kind)
    axis.set_xlabel("hours since the first reading")
    axis.set_ylabel("RSS (MB)")
    axis.set_title(title)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def only_under(samples: Sequence[dict[str, Any]], prefix: str) -> list[dict[str, Any]]:
    """The readings with only the processes whose run or output directory lies under ``prefix`` (other nodes that
    shared the machine, e.g. a test suite's, left out; p2pd daemons name no directory and are left out too)."""
    return [{**r, "processes": [p for p in r["processes"] if (p.get("dir") or "").startswith(prefix)]} for r in samples]


def report(path: Path, name: str, out_dir: Path, note: str, prefix: str | None = None) -> dict[str, Any]:
    """Write ``<name>.{json,md,png}`` from the readings in ``path`` (only processes under ``prefix`` if given);
    returns the summary."""
    samples = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if prefix is not None:
        samples = only_under(samples, prefix)
    if not samples:
        raise SystemExit(f"process_memory: {path} holds no readings; sample first")
    summary = summarize(samples)
    only = f" --only-under {prefix}" if prefix is not None else ""
    record = run_record(f"python -m benchmarks.process_memory report {path} --name {name}{only}")
    lines = [
        f"# Memory of sapo-node processes: {name}",
        "",
        f"Report: `{record['command']}`, code `{record['git_commit']}`, {record['machine']}  ",
        f"Readings: {summary['readings']} over {summary['hours']:.2f} h. {note}".rstrip(),
        "",
        "| kind | processes | peak RSS MB | median RSS MB (median of lives) | longest life h | largest growth MB/h |",
        "|---|---|---|---|---|---|",
    ]
    for kind, k in summary["kinds"].items():
        growth = "-" if k["max_growth_mb_per_hour"] is None else f"{k['max_growth_mb_per_hour']:+.0f}"
        lines.append(
            f"| {kind} | {k['processes']} | {k['peak_mb']:.0f} | {k['median_mb']:.0f} | "
            f"{k['longest_life_hours']:.2f} | {growth} |"
        )
    lines += ["", f"![RSS over time]({name}.png)"]
    write_report(out_dir, name, {"record": record, "note": note, "summary": summary, "samples": samples}, lines)
    plot(samples, out_dir / f"{name}.png", f"RSS of sapo-node processes ({name})")
    return summary


def main(argv: Sequence[str] | None = None) -> None:
    """Sample until stopped, or report on readings."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.process_memory", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    sampling = commands.add_parser("sample", help="append one reading every --interval seconds until stopped")
    sampling.add_argument("--out", required=True, help="JSON-lines file the readings are appended to")
    sampling.add_argument("--interval", type=float, default=60.0, help="seconds between readings")
    reporting = commands.add_parser("report", help="peaks, growth and a plot of the readings")
    reporting.add_argument("readings", help="a file written by `sample`")
    reporting.add_argument("--name", required=True, help="stem of the outputs (<name>.md/.json/.png)")
    reporting.add_argument("--note", default="", help="what ran while sampling, for the page")
    reporting.add_argument("--output-dir", default=str(RESULTS))
    reporting.add_argument("--only-under", default=None, help="keep only processes whose directory starts with this")
    args = parser.parse_args(argv)
    if args.command == "report":
        summary = report(Path(args.readings), args.name, Path(args.output_dir), args.note, args.only_under)
        print(json.dumps(summary, indent=1))
        return
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        while True:
            with open(out, "a") as f:
                f.write(json.dumps(sample()) + "\n")
            time.sleep(args.interval)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
