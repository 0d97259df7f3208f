"""Where the test suite spends its CPU: a pytest plugin recording each test's wall time, its process's CPU and the CPU
of the child processes it started and reaped, and a report of the records by test file.

    SUITE_PROFILE_LOG=/tmp/suite .venv/bin/python -m pytest -q -n 3 --dist loadfile --no-loadscope-reorder \
        -p benchmarks.suite_profile
    python -m benchmarks.suite_profile /tmp/suite          # the test files by CPU, the 30 costliest tests, then
                                                           # the tests by the CPU of the processes they started

A test's CPU is read from ``getrusage`` around its setup, call and teardown: its own process (every thread) and the
children reaped meanwhile (a node, an example, a local swarm and what they reaped in turn); a child left running past
the test, or never reaped, is not counted. A node forked warm (`sapo.node.warm_start`) is its server's child, not the
test's, so the plugin also puts ``benchmarks/suite_profile_hook`` first on ``PYTHONPATH``: every Python process the
suite starts, warm-forked ones included, appends its own CPU and the test that started it to
``$SUITE_PROFILE_LOG.procs`` at its exit (one killed by a signal, or ending by ``os._exit`` as multiprocessing's
children do, is missed; non-Python ones such as p2pd are not counted). Records are appended as JSON lines to
``$SUITE_PROFILE_LOG.tests``, one per test, by every xdist worker; without ``SUITE_PROFILE_LOG`` nothing is recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


def _cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


HOOK = Path(__file__).resolve().parent / "suite_profile_hook"
"""The folder whose ``sitecustomize`` makes each Python process record its CPU at exit."""


def pytest_configure(config: pytest.Config) -> None:
    """Put :data:`HOOK` first on the ``PYTHONPATH`` the suite's processes inherit (xdist's workers included)."""
    if os.environ.get("SUITE_PROFILE_LOG"):
        paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
        if str(HOOK) not in paths:
            os.environ["PYTHONPATH"] = os.pathsep.join([str(HOOK), *filter(None, paths)])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Record one test's wall time, own CPU and reaped children's CPU (setup, call and teardown together)."""
    log = os.environ.get("SUITE_PROFILE_LOG")
    began = time.monotonic(), _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN)
    yield
    if log:
        record = {
            "test": item.nodeid,
            "wall": time.monotonic() - began[0],
            "self_cpu": _cpu(resource.RUSAGE_SELF) - began[1],
            "children_cpu": _cpu(resource.RUSAGE_CHILDREN) - began[2],
            "worker": os.environ.get("PYTEST_XDIST_WORKER"),
        }
        with open(f"{log}.tests", "a") as f:
            f.write(json.dumps(record) + "\n")


def by_file(records: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per test file: tests, wall seconds, own CPU and children's CPU summed, costliest (own + children) first."""
    files: dict[str, dict[str, float]] = defaultdict(
        lambda: {"tests": 0, "wall": 0.0, "self_cpu": 0.0, "children_cpu": 0.0}
    )
    for record in records:
        totals = files[record["test"].split("::")[0]]
        totals["tests"] += 1
        for key in ("wall", "self_cpu", "children_cpu"):
            totals[key] += record[key]
    return dict(sorted(files.items(), key=lambda item: -(item[1]["self_cpu"] + item[1]["children_cpu"])))


def processes_by_test(processes: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per test (``None``: outside every test, e.g. a worker or a warm server): the Python processes it started that
    recorded themselves at exit, and their CPU, costliest first."""
    tests: dict[str, dict[str, float]] = defaultdict(lambda: {"processes": 0, "cpu": 0.0})
    for record in processes:
        totals = tests[(record.get("test") or "").rsplit(" (", 1)[0] or None]
        totals["processes"] += 1
        totals["cpu"] += record["cpu"]
    return dict(sorted(tests.items(), key=lambda item: -item[1]["cpu"]))


def report_lines(records: list[dict[str, Any]], top: int = 30, processes: list[dict[str, Any]] = ()) -> list[str]:
    """The page: totals, the test files by CPU, the ``top`` costliest tests, then, where processes recorded
    themselves, the ``top`` tests by the CPU of the Python processes they started (warm-forked ones included)."""
    cpu = sum(r["self_cpu"] + r["children_cpu"] for r in records)
    children = sum(r["children_cpu"] for r in records)
    lines = [f"{len(records)} tests: {cpu:.0f} CPU s, {children:.0f} of them in child processes", ""]
    lines += ["| test file | tests | wall s | own CPU s | children's CPU s |", "|---|---|---|---|---|"]
    for name, t in by_file(records).items():
        lines.append(f"| {name} | {t['tests']:.0f} | {t['wall']:.0f} | {t['self_cpu']:.0f} | {t['children_cpu']:.0f} |")
    lines += ["", "| test | wall s | own CPU s | children's CPU s |", "|---|---|---|---|"]
    for r in sorted(records, key=lambda r: -(r["self_cpu"] + r["children_cpu"]))[:top]:
        lines.append(f"| {r['test']} | {r['wall']:.0f} | {r['self_cpu']:.0f} | {r['children_cpu']:.0f} |")
    if processes:
        total = sum(p["cpu"] for p in processes)
        lines += ["", f"{len(processes)} Python processes recorded themselves: {total:.0f} CPU s", ""]
        lines += ["| started under | processes | their CPU s |", "|---|---|---|"]
        for test, t in list(processes_by_test(processes).items())[:top]:
            lines.append(f"| {test or '(no test: workers, servers)'} | {t['processes']:.0f} | {t['cpu']:.0f} |")
    return lines


def main(argv: list[str] | None = None) -> list[str]:
    """Print the page of the records under a ``SUITE_PROFILE_LOG`` prefix; returns its lines."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.suite_profile", description=__doc__.splitlines()[0])
    parser.add_argument("log", type=Path, help="the SUITE_PROFILE_LOG the suite ran with")
    parser.add_argument("--top", type=int, default=30, help="how many of the costliest tests to list")
    args = parser.parse_args(argv)
    path = Path(f"{args.log}.tests")
    if not path.is_file():
        parser.error(
            f"{path} does not exist: run the suite with SUITE_PROFILE_LOG={args.log} and -p benchmarks.suite_profile"
        )
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    procs = Path(f"{args.log}.procs")
    processes = [json.loads(line) for line in procs.read_text().splitlines() if line.strip()] if procs.is_file() else []
    lines = report_lines(records, args.top, processes)
    print("\n".join(lines))
    return lines


if __name__ == "__main__":
    main()
