"""A node (or a local swarm) on a CUDA GPU: step time, GPU memory and held-out pass@1, measured while it runs.

Issue 24 asks for the default node on a GPU (bf16 and gradient checkpointing as ``device_defaults()`` decides) and
issue 22 for the paper's batch on one. This script runs any such command, samples the GPU through ``nvidia-smi``
every ``--interval`` seconds (memory used by the whole card and by each process, utilisation), and then reads every
node directory under ``--run-dir`` (a directory holding ``metrics.jsonl``): steps done, the first step's time (model
loading and warm-up included), the median of the later steps, the median generation time, and held-out pass@1 by
step. ``report`` turns one or more such JSON files into a result page.

    python -m benchmarks.gpu_node run --name node --run-dir /tmp/node --out OUT -- \\
        python -m sapo.node.cli --max-steps 10 --output-dir /tmp/node
    python -m benchmarks.gpu_node report OUT/node.json OUT/paper.json --name gpu_node

A copy of the tree without ``.git`` (the device machine gets one) names its commit with ``SAPO_GIT_COMMIT``.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.harness import (
    RESULTS,
    json_safe,
    record_lines,
    run_record,
    split_at_double_dash,
    stop_processes,
    write_report,
)
from benchmarks.sapo_table_report import load_metrics

GPU_QUERY = "memory.used,memory.total,utilization.gpu"


def read_gpu() -> dict[str, Any]:
    """One ``nvidia-smi`` reading: the card's memory used and total (MiB), its utilisation (%), and the memory of
    each compute process (``{pid: MiB}``)."""
    card = subprocess.run(
        ["nvidia-smi", f"--query-gpu={GPU_QUERY}", "--format=csv,noheader,nounits"],
        capture_output=True, text=True, check=True,
    ).stdout.splitlines()[0]  # fmt: skip
    used, total, util = (float(v) for v in card.split(","))
    apps = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
        capture_output=True, text=True, check=False,
    ).stdout.splitlines()  # fmt: skip
    processes = {}
    for line in apps:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit():
            try:
                processes[parts[0]] = float(parts[1])
            except ValueError:  # "[N/A]" where the driver hides per-process figures
                pass
    return {"time": time.time(), "memory_used_mib": used, "memory_total_mib": total, "utilization": util,
            "process_mib": processes}  # fmt: skip


class GpuSampler(threading.Thread):
    """Reads the GPU every ``interval`` seconds on a background thread until :meth:`stop`."""

    def __init__(self, interval: float) -> None:
        super().__init__(daemon=True)
        self.interval = interval
        self.samples: list[dict[str, Any]] = []
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                self.samples.append(read_gpu())
            except (OSError, subprocess.CalledProcessError, ValueError, IndexError) as e:
                self.samples.append({"time": time.time(), "error": str(e)})
            self._halt.wait(self.interval)

    def stop(self) -> list[dict[str, Any]]:
        self._halt.set()
        self.join(timeout=10)
        return self.samples


def node_dirs(run_dir: Path) -> list[Path]:
    """Every node directory under ``run_dir`` (it holds a ``metrics.jsonl``), sorted by path."""
    return sorted(p.parent for p in run_dir.rglob("metrics.jsonl"))


def node_summary(node_dir: Path) -> dict[str, Any]:
    """Steps done, step times (first, median of the later), median generation time and held-out pass@1 by step."""
    training, evaluations = load_metrics(node_dir / "metrics.jsonl")
    times = [float(r["step_time"]) for r in training if isinstance(r.get("step_time"), (int, float))]
    generation = [float(r["sapo/time/generation"]) for r in training if "sapo/time/generation" in r]
    return {
        "node": node_dir.name,
        "steps": len(training),
        "first_step_seconds": times[0] if times else None,
        "median_step_seconds": statistics.median(times[1:]) if len(times) > 1 else None,
        "median_generation_seconds": statistics.median(generation[1:]) if len(generation) > 1 else None,
        "mean_reward": _mean_of(training, "reward"),  # TRL's: every row of the batch, external ones included
        "mean_local_reward": _mean_of(training, "sapo/local_reward"),  # the node's own rows only
        "held_out": [{"step": int(r["step"]), "pass@1": r.get("eval/pass@1")} for r in evaluations],
    }


def _mean_of(rows: Sequence[dict[str, Any]], key: str) -> float | None:
    values = [float(r[key]) for r in rows if isinstance(r.get(key), (int, float))]
    return statistics.fmean(values) if values else None


def _rewards(node: dict[str, Any]) -> tuple[float | None, float | None]:
    """(mean reward of every row, of the node's own rows) of a node summary; summaries written before 2026-11-25's
    second session kept TRL's all-rows reward under ``mean_local_reward`` and had no own-rows figure."""
    if "mean_reward" in node:
        return node["mean_reward"], node["mean_local_reward"]
    return node.get("mean_local_reward"), None


def gpu_summary(samples: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Peak and median card memory, peak per-process memory, mean utilisation over the readings."""
    good = [s for s in samples if "memory_used_mib" in s]
    if not good:
        return {"readings": 0, "errors": sorted({s.get("error", "") for s in samples})[:3]}
    per_process = [mib for s in good for mib in s["process_mib"].values()]
    return {
        "readings": len(good),
        "memory_total_mib": good[0]["memory_total_mib"],
        "peak_memory_used_mib": max(s["memory_used_mib"] for s in good),
        "median_memory_used_mib": statistics.median(s["memory_used_mib"] for s in good),
        "peak_process_mib": max(per_process) if per_process else None,
        "peak_processes": max(len(s["process_mib"]) for s in good),
        "mean_utilization": statistics.fmean(s["utilization"] for s in good),
    }


def run(args: argparse.Namespace, command: list[str]) -> int:
    """Run ``command`` while sampling the GPU, then write ``<out>/<name>.json`` with the summaries."""
    if shutil.which("nvidia-smi") is None:
        raise SystemExit("gpu_node: nvidia-smi not found; this benchmark needs an NVIDIA GPU and its driver tools")
    if not command:
        raise SystemExit("gpu_node: give the command to run after --, e.g. -- python -m sapo.node.cli --max-steps 5")
    sampler = GpuSampler(args.interval)
    sampler.start()
    started = time.time()
    log = Path(args.out) / f"{args.name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
        try:
            code = process.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            print(f"gpu_node: {args.name} still running after {args.timeout:.0f} s: stopping it (SIGTERM)")
            code = stop_processes([process])[0]
    wall = time.time() - started
    samples = sampler.stop()
    result = {
        **run_record(" ".join(command)),
        "name": args.name,
        "exit_code": code,
        "wall_seconds": wall,
        "gpu": gpu_summary(samples),
        "nodes": [node_summary(d) for d in node_dirs(Path(args.run_dir))],
        "samples": samples,
    }
    path = Path(args.out) / f"{args.name}.json"
    path.write_text(json.dumps(json_safe(result), indent=1) + "\n")
    print(json.dumps({k: v for k, v in json_safe(result).items() if k != "samples"}, indent=1))
    return 0 if code == 0 else 1


def _fmt(value: Any, spec: str = ".1f") -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def report_lines(results: Sequence[dict[str, Any]], notes: str = "") -> list[str]:
    """A result page: per run its command, commit and machine, the GPU's figures, and one row per node."""
    lines = ["# Nodes on a CUDA GPU: step time, memory, held-out evaluation", ""]
    for r in results:
        g = r["gpu"]
        lines += [f"## {r['name']}", "", *record_lines(r), ""]
        peak, total = _fmt(g.get("peak_memory_used_mib"), ".0f"), _fmt(g.get("memory_total_mib"), ".0f")
        lines.append(
            f"Exit code {r['exit_code']}, {r['wall_seconds']:.0f} s wall. GPU: peak {peak} of {total} MiB used on the"
            f" card (median {_fmt(g.get('median_memory_used_mib'), '.0f')}), largest process "
            f"{_fmt(g.get('peak_process_mib'), '.0f')} MiB, up to {g.get('peak_processes', '-')} processes, mean "
            f"utilisation {_fmt(g.get('mean_utilization'))} % ({g.get('readings', 0)} readings)."
        )
        lines += ["", "| node | steps | first step (s) | later steps, median (s) | generation, median (s) |"
                  " mean reward, all rows | own rows | held-out pass@1 by step |",
                  "|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for n in r["nodes"]:
            held = ", ".join(f"{h['step']}: {_fmt(h['pass@1'], '.3f')}" for h in n["held_out"]) or "-"
            times = f"{_fmt(n['first_step_seconds'])} | {_fmt(n['median_step_seconds'], '.2f')}"
            every_row, own_rows = _rewards(n)
            lines.append(
                f"| {n['node']} | {n['steps']} | {times} | {_fmt(n['median_generation_seconds'], '.2f')}"
                f" | {_fmt(every_row, '.3f')} | {_fmt(own_rows, '.3f')} | {held} |"
            )
        lines.append("")
    if notes:
        lines += [notes, ""]
    return lines


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    argv, command = split_at_double_dash(argv)
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_node", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="action", required=True)
    r = sub.add_parser("run", help="run a command (after --) while sampling the GPU")
    r.add_argument("--name", required=True, help="the run's name: <out>/<name>.json and .log")
    r.add_argument("--run-dir", required=True, help="where the command's node directories (metrics.jsonl) go")
    r.add_argument("--out", required=True, help="directory for <name>.json and <name>.log")
    r.add_argument("--interval", type=float, default=1.0, help="seconds between GPU readings (default 1)")
    r.add_argument("--timeout", type=float, default=540.0, help="stop the command after this many seconds")
    p = sub.add_parser("report", help="a result page from run JSON files")
    p.add_argument("results", nargs="+", help="JSON files written by run")
    p.add_argument("--name", default="gpu_node", help="page stem under --results-dir (default gpu_node)")
    p.add_argument("--results-dir", default=str(RESULTS), help="where the page goes")
    p.add_argument("--notes", default="", help="a paragraph appended to the page")
    return parser.parse_args(argv), command


def main(argv: Sequence[str] | None = None) -> int:
    args, command = parse_args(sys.argv[1:] if argv is None else argv)
    if args.action == "run":
        return run(args, command)
    results = [json.loads(Path(p).read_text()) for p in args.results]
    data = {"runs": [{k: v for k, v in r.items() if k != "samples"} for r in results]}
    paths = write_report(Path(args.results_dir), args.name, data, report_lines(results, args.notes))
    print(f"wrote {paths['json']}, {paths['md']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
