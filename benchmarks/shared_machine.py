"""A node on a shared machine: its steps beside a busy process, by OpenMP wait policy and thread count.

Runs ``sapo-node --max-steps N`` (the embedded model, evaluation off, no peers, its status page off) beside a
controlled busy process (a pure-Python loop, one core), alternating the settings (``--settings``) run by run:

- ``default``: OpenMP's own wait policy (threads spin a while before they sleep), as the node ran before it set one
  (``OMP_WAIT_POLICY`` given an empty value, which the node keeps and GNU OpenMP reads as its default);
- ``passive``: ``OMP_WAIT_POLICY=PASSIVE``, what the node sets now (`sapo.speed.threads`);
- either with ``-K`` (``passive-1``): ``OMP_NUM_THREADS=K`` math threads instead of the cores this process may use.

``--alone`` adds the same runs without the busy process (what a setting costs a node that has the machine to
itself). Each run reports its seconds per step (median of the steps after the first, from the node's
``metrics.jsonl``), the wall-clock of the whole process, and the busy process's CPU seconds per wall second (how much
of its core it kept); each setting is compared with the first one listed.

Usage:
    python -m benchmarks.shared_machine                       # 4 steps, 3 runs per setting, beside a busy process
    python -m benchmarks.shared_machine --alone --runs 2
    python -m benchmarks.shared_machine --quick               # a tiny random model, 2 steps, 1 run: a smoke test
    python -m benchmarks.shared_machine --quick --steps 4 --runs 2 --alone    # the tiny model, measured
    python -m benchmarks.shared_machine --settings passive,passive-1    # all cores against one math thread

Writes ``shared_machine.{json,md}`` into ``--output-dir`` (default benchmarks/results).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import RESULTS, cpu_seconds, record_lines, run_record, stop_processes, write_report

POLICIES = {"default": "", "passive": "PASSIVE"}
"""Wait policy -> the value of ``OMP_WAIT_POLICY`` the node starts with (empty: OpenMP's default)."""

BUSY_LOOP = "while True: pass"


def node_command(steps: int, output_dir: Path, model: str | None) -> list[str]:
    """The ``sapo-node`` command line of one run: the node's defaults, evaluation off, no peers, no status page."""
    node_bin = Path(sys.executable).parent / "sapo-node"
    cmd = [str(node_bin), "--max-steps", str(steps), "--output-dir", str(output_dir), "--eval-strategy", "no",
           "--status-port", "none"]  # fmt: skip
    if model:
        cmd += ["--model", model, "--dataset-size", "64", "--max-completion-length", "8"]
    return cmd


def parse_setting(setting: str) -> tuple[str, int | None]:
    """``"passive-1"`` -> ``("PASSIVE", 1)``: a setting's ``OMP_WAIT_POLICY`` value and its thread count (None: the
    node's own choice, the cores it may use)."""
    policy, _, threads = setting.partition("-")
    if policy not in POLICIES or (threads and (not threads.isdigit() or int(threads) < 1)):
        raise SystemExit(
            f"shared_machine: unknown setting {setting!r}; a setting is a wait policy ({', '.join(POLICIES)}), "
            "optionally with -K math threads (passive-1)"
        )
    return POLICIES[policy], int(threads) if threads else None


def node_environment(setting: str) -> dict[str, str]:
    """This process's environment with the setting's wait policy and thread count, no other OpenMP variable of ours
    (without a count the node picks its own)."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
    env["OMP_WAIT_POLICY"], threads = parse_setting(setting)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def step_seconds(metrics_path: Path) -> list[float]:
    """Seconds between consecutive training log lines of a node's ``metrics.jsonl`` (one per step)."""
    if not metrics_path.exists():
        return []
    records = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    times = [r["time"] for r in records if "loss" in r]
    return [b - a for a, b in zip(times, times[1:], strict=False)]


def run_once(setting: str, busy: bool, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """One node run with ``setting``, beside the busy process when ``busy``; its timings."""
    output_dir = Path(tempfile.mkdtemp(prefix="sapo-shared-", dir=workdir))
    spinner = subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) if busy else None
    log_path = output_dir / "node.log"
    node = None
    try:
        started = time.monotonic()
        with open(log_path, "w") as log:
            node = subprocess.Popen(node_command(args.steps, output_dir, args.model), env=node_environment(setting),
                                    stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
            try:
                returncode = node.wait(timeout=args.timeout)
            except subprocess.TimeoutExpired:
                returncode = None
        wall = time.monotonic() - started
        busy_share = cpu_seconds(spinner.pid) / wall if spinner is not None else None
    finally:  # the node (and its p2pd) and the busy loop stop, also on failure
        stop_processes([p for p in (node, spinner) if p is not None])
    steps = step_seconds(output_dir / "metrics.jsonl")
    return {
        "setting": setting, "busy": busy, "returncode": returncode, "wall": wall, "step_seconds": steps,
        "median_step": statistics.median(steps) if steps else None, "busy_cpu_share": busy_share,
        "log": str(log_path),
    }  # fmt: skip


def summarize(runs: list[dict[str, Any]], settings: list[str]) -> dict[str, dict[str, Any]]:
    """Per (setting, beside a busy process or alone): medians over its runs, and each setting against the first."""
    out: dict[str, dict[str, Any]] = {}
    for busy in sorted({r["busy"] for r in runs}, reverse=True):
        where = "beside a busy process" if busy else "alone"
        for setting in settings:
            mine = [r for r in runs if r["busy"] == busy and r["setting"] == setting and r["median_step"] is not None]
            if not mine:
                continue
            shares = [r["busy_cpu_share"] for r in mine if r["busy_cpu_share"] is not None]
            out[f"{setting}, {where}"] = {
                "runs": len(mine),
                "step_seconds": statistics.median(r["median_step"] for r in mine),
                "step_seconds_each": [round(r["median_step"], 2) for r in mine],
                "wall": statistics.median(r["wall"] for r in mine),
                "busy_cpu_share": statistics.median(shares) if shares else None,
            }
        base = out.get(f"{settings[0]}, {where}")
        for setting in settings[1:]:
            mine = out.get(f"{setting}, {where}")
            if base and mine:
                out[f"{setting} / {settings[0]}, {where}"] = {"step_ratio": mine["step_seconds"] / base["step_seconds"],
                                                              "wall_ratio": mine["wall"] / base["wall"]}  # fmt: skip
    return out


def report_lines(data: dict[str, Any]) -> list[str]:
    """The markdown page."""
    s = data["settings"]
    lines = [
        "# A node on a shared machine: OpenMP's wait policy and thread count",
        "",
        *record_lines(data["record"]),
        "",
        f"`sapo-node --max-steps {s['steps']}` ({s['model']}, evaluation off, no peers), {s['runs']} runs per "
        f"setting, settings alternating run by run; beside a pure-Python busy loop (one core) "
        f"{'and alone' if s['alone'] else 'only'}. Threads: the cores this process may use ({s['threads']}), or K "
        "where a setting ends in -K. `default`: OpenMP's own wait policy (spin, then sleep), as the node ran before; "
        "`passive`: `OMP_WAIT_POLICY=PASSIVE`, what `sapo-node` sets now. Seconds per step: the median of each run's "
        "steps after the first (from `metrics.jsonl`), then the median over runs; wall: the whole process "
        "(start-up and model loading included). Busy share: the busy loop's CPU seconds per wall second.",
        "",
        "| setting | runs | s/step (median) | s/step per run | wall s | busy loop's CPU share |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in data["summary"].items():
        if "step_ratio" in row:
            lines.append(f"| **{name}** | | **{row['step_ratio']:.2f}x** | | **{row['wall_ratio']:.2f}x** | |")
            continue
        share = "" if row["busy_cpu_share"] is None else f"{row['busy_cpu_share']:.2f}"
        lines.append(f"| {name} | {row['runs']} | {row['step_seconds']:.2f} | {row['step_seconds_each']} | "
                     f"{row['wall']:.1f} | {share} |")  # fmt: skip
    failed = [r for r in data["runs"] if r.get("returncode", 0) != 0 or r["median_step"] is None]
    if failed:
        lines += ["", f"{len(failed)} runs failed or logged fewer than two steps (left out): see their logs."]
    lines += ["", f"Other processes on the machine meanwhile: {data['settings']['shared_with'] or 'none recorded'}."]
    return lines


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.shared_machine", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--settings", default="default,passive", help="settings to alternate, compared with the first (default,passive)"
    )
    parser.add_argument("--steps", type=int, default=None, help="training steps per node run (default 4; quick: 2)")
    parser.add_argument("--runs", type=int, default=None, help="runs per setting (default 3; quick: 1)")
    parser.add_argument("--alone", action="store_true", help="also run each setting without the busy process")
    parser.add_argument("--model", default=None, help="model directory (default: the embedded SmolLM2-135M)")
    parser.add_argument("--quick", action="store_true", help="a tiny random model (default: 2 steps, 1 run)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds one node run may take (default 1800)")
    parser.add_argument("--shared-with", default="", help="what else ran on the machine meanwhile (for the page)")
    parser.add_argument("--output-dir", type=Path, default=RESULTS, help="where the json and md go")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the alternating node runs and write the page."""
    from tqdm.auto import tqdm

    from sapo.speed.threads import usable_cores

    args = parse_args(argv)
    settings = args.settings.split(",")
    for setting in settings:
        parse_setting(setting)
    workdir = Path(tempfile.mkdtemp(prefix="sapo-shared-machine-"))
    if args.quick:
        from sapo.models import save_tiny_model

        args.model = str(save_tiny_model(workdir / "tiny", seed=0))
    args.steps = args.steps or (2 if args.quick else 4)
    args.runs = args.runs or (1 if args.quick else 3)
    plan = [(setting, busy) for _ in range(args.runs) for busy in ([True, False] if args.alone else [True])
            for setting in settings]  # fmt: skip
    runs = []
    for setting, busy in tqdm(plan, desc="node runs", unit="run", dynamic_ncols=True):
        runs.append(run_once(setting, busy, args, workdir))
    described = {
        "settings": settings,
        "steps": args.steps,
        "runs": args.runs,
        "alone": args.alone,
        "threads": usable_cores(),
        "model": args.model or "the embedded SmolLM2-135M-Instruct",
        "shared_with": args.shared_with,
    }
    data = {"record": run_record(), "settings": described, "runs": runs, "summary": summarize(runs, settings)}
    paths = write_report(args.output_dir, "shared_machine", data, report_lines(data))
    print("\n".join(report_lines(data)))
    print(f"wrote {', '.join(str(p) for p in paths.values())}")
    return 0 if all(r["returncode"] == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
