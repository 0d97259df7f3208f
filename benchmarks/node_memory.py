"""Memory of a sapo-node while it trains: RSS of the node process and its p2pd child, peak and steady state.

Runs ``sapo-node --max-steps N`` (default model, CPU defaults) as a subprocess and samples VmRSS of the node
and of its p2pd child every ``--sample-interval`` seconds (and the node's VmHWM, the kernel's high-water mark).

Usage:
    python -m benchmarks.node_memory             # default model, 4 steps (a few minutes on 2 cores)
    python -m benchmarks.node_memory --quick     # tiny model, 1 step, seconds

Writes ``node_memory.{json,md,png}`` into ``--output-dir`` (default benchmarks/results). A rerun with the same
settings as the saved results does nothing (``--force`` reruns). The node is stopped, also on failure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.harness import (
    RESULTS,
    children,
    model_label,
    pyplot,
    rss_mb,
    run_record,
    saved_settings_match,
    stop_processes,
    write_report,
)


def node_memory_settings(args: argparse.Namespace) -> dict[str, Any]:
    """Everything that defines a result: a rerun with the same settings may skip."""
    return {
        "model": model_label(args.quick, args.model),
        "quick": args.quick,
        "max_steps": args.steps,
        "interval_seconds": args.sample_interval,
    }


def node_command(args: argparse.Namespace, model_dir: str | None, output_dir: Path) -> list[str]:
    """The ``sapo-node`` command line: the node's defaults, or (``--quick``) a tiny round on ``model_dir``."""
    node_bin = Path(sys.executable).parent / "sapo-node"
    cmd = [str(node_bin), "--max-steps", str(args.steps), "--output-dir", str(output_dir)]
    if args.quick:
        cmd += ["--model", model_dir, "--dataset-size", "64", "--max-completion-length", "8"]
        cmd += ["--num-local", "2", "--num-external", "2", "--num-generations", "2"]
        cmd += ["--per-device-train-batch-size", "8"]  # the whole (2 + 2) x 2 round in one micro-batch
    elif model_dir:
        cmd += ["--model", model_dir]
    return cmd


def run_node_memory(args: argparse.Namespace, workdir: Path, model_dir: str | None) -> dict[str, Any]:
    """Run ``sapo-node --max-steps N`` and sample VmRSS of it and its p2pd child every ``sample_interval`` s."""
    from tqdm.auto import tqdm

    from swarm.daemon import is_p2pd

    output_dir = Path(tempfile.mkdtemp(prefix="sapo-node-memory-", dir="/tmp"))
    cmd = node_command(args, model_dir, output_dir)
    metrics = output_dir / "metrics.jsonl"
    samples: list[dict[str, float]] = []
    hwm_mb = 0.0
    p2pd: int | None = None
    started = time.monotonic()
    log_path = workdir / "node-memory.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=workdir)
        progress = tqdm(total=args.steps, desc="sapo-node steps", unit="step", dynamic_ncols=True)
        try:
            deadline = started + args.timeout
            while proc.poll() is None:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"sapo-node ran past {args.timeout:.0f} s; see {log_path}")
                if p2pd is None:
                    p2pd = next((pid for pid in children(proc.pid) if is_p2pd(pid)), None)
                node_mb = rss_mb(proc.pid) or 0.0
                hwm_mb = max(hwm_mb, rss_mb(proc.pid, "VmHWM") or 0.0)
                p2pd_mb = (rss_mb(p2pd) or 0.0) if p2pd else 0.0
                done = len(training_lines(metrics))
                if done > progress.n:
                    progress.update(done - progress.n)
                if node_mb:
                    samples.append(
                        {"t": time.monotonic() - started, "node_mb": node_mb, "p2pd_mb": p2pd_mb, "steps": done}
                    )
                time.sleep(args.sample_interval)
        finally:
            progress.close()
            stop_processes([proc])
    if proc.returncode != 0:
        raise RuntimeError(f"sapo-node exited with code {proc.returncode}:\n{log_path.read_text()[-2000:]}")
    return {
        "settings": node_memory_settings(args),
        "node_command": " ".join(["sapo-node", *cmd[1:]]),
        "samples": samples,
        "step_end_seconds": step_end_times(training_lines(metrics), started),
        "summary": memory_summary(samples, hwm_mb),
    }


def training_lines(path: Path) -> list[dict[str, Any]]:
    """The node's metrics.jsonl lines of training steps, in order: held-out evaluation lines and a torn last line
    are not steps."""
    from sapo.node.report import is_evaluation_line

    out = []
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict) and not is_evaluation_line(record):
                    out.append(record)
    return out


def step_end_times(lines: list[dict[str, Any]], started_monotonic: float) -> list[float]:
    """Seconds since the node started at which each training line was written."""
    offset = time.time() - time.monotonic()  # monotonic -> wall clock, for the metrics' time stamps
    return [line["time"] - offset - started_monotonic for line in lines if "time" in line]


def memory_summary(samples: list[dict[str, float]], node_hwm_mb: float) -> dict[str, Any]:
    """Peak and steady state of node, p2pd and both: the median over the samples taken after the first step
    ended and before the last one did (the node then saves its final checkpoint and leaves the swarm)."""
    if not samples:
        raise ValueError("no memory samples")
    last = max(s["steps"] for s in samples)
    steady = (
        [s for s in samples if 1 <= s["steps"] < last]  # training, after the first step, before the final save
        or [s for s in samples if s["steps"] >= 1 and s["p2pd_mb"] > 0]  # a one-step run: until the swarm closes
        or samples
    )
    return {
        "peak_node_mb": max(s["node_mb"] for s in samples),
        "peak_p2pd_mb": max(s["p2pd_mb"] for s in samples),
        "peak_total_mb": max(s["node_mb"] + s["p2pd_mb"] for s in samples),
        "node_vmhwm_mb": node_hwm_mb,
        "steady_node_mb": statistics.median(s["node_mb"] for s in steady),
        "steady_p2pd_mb": statistics.median(s["p2pd_mb"] for s in steady),
        "steady_total_mb": statistics.median(s["node_mb"] + s["p2pd_mb"] for s in steady),
        "steady_samples": len(steady),
        "samples": len(samples),
    }


def memory_notes() -> list[str]:
    """Notes of the memory table, naming the node defaults the measured node ran with."""
    from sapo.node.options import NODE_DEFAULTS

    d = NODE_DEFAULTS
    return [
        f"- The node runs on its CPU defaults (num_generations {d['num_generations']}, {d['num_local']} local + "
        f"{d['num_external']} external groups, {d['max_completion_length']} completion tokens, per-device batch "
        f"{d['per_device_train_batch_size']}, no gradient checkpointing), alone in a new swarm (its external slots "
        "are filled in locally), and saves a checkpoint at its last step.",
        "- peak: largest sample; VmHWM: the kernel's high-water mark of the node process (catches peaks between "
        "samples). steady state: median of the samples taken after the first training step ended and before the "
        "last one did (then the node saves its final checkpoint, closes the swarm and exits).",
    ]


def write_node_memory(result: dict[str, Any], out: Path, notes: list[str]) -> None:
    """node_memory.json, .md (the peak / steady-state table) and .png (RSS over time) in ``out``."""
    s = result["summary"]
    lines = [
        "# Memory of a default sapo-node during training (node process + its p2pd child)",
        "",
        f"Command: `{result['command']}` (runs `{result['node_command']}`)  ",
        f"Commit: `{result['git_commit']}`, {result['date']}, {result['machine']}  ",
        f"Sampling: VmRSS from /proc/<pid>/status every {result['settings']['interval_seconds']} s "
        f"({s['samples']} samples)",
        "",
        "| process | peak MB | steady-state MB (median from step 1 to the last step) |",
        "|---|---|---|",
        f"| sapo-node (Python) | {s['peak_node_mb']:.0f} (VmHWM {s['node_vmhwm_mb']:.0f}) "
        f"| {s['steady_node_mb']:.0f} |",
        f"| p2pd | {s['peak_p2pd_mb']:.0f} | {s['steady_p2pd_mb']:.0f} |",
        f"| both | {s['peak_total_mb']:.0f} | {s['steady_total_mb']:.0f} |",
        "",
        *notes,
    ]
    write_report(out, "node_memory", result, lines)

    plt = pyplot()
    t = [x["t"] for x in result["samples"]]
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot(t, [x["node_mb"] for x in result["samples"]], label="sapo-node")
    ax.plot(t, [x["p2pd_mb"] for x in result["samples"]], label="p2pd")
    ax.plot(t, [x["node_mb"] + x["p2pd_mb"] for x in result["samples"]], label="both", ls="--")
    for k, end in enumerate(result["step_end_seconds"]):
        ax.axvline(end, color="grey", lw=0.6, ls=":", label="step end" if k == 0 else None)
    ax.set_xlabel("seconds since start")
    ax.set_ylabel("RSS (MB)")
    ax.set_title("sapo-node memory (default model, CPU)" if not result["settings"]["quick"] else "sapo-node (quick)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "node_memory.png", dpi=120)
    plt.close(fig)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The benchmark's options; ``--steps`` defaults to 4 (``--quick``: 1)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny model, 1 step, seconds")
    parser.add_argument("--model", default=None, help="local HF model directory (default: the embedded default)")
    parser.add_argument("--steps", type=int, default=None, help="sapo-node steps (default 4, quick 1)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds the node may run")
    parser.add_argument("--sample-interval", type=float, default=0.2, help="seconds between two samples")
    parser.add_argument("--output-dir", default=str(RESULTS))
    parser.add_argument("--force", action="store_true", help="rerun even if results with these settings are saved")
    args = parser.parse_args(argv)
    if args.steps is None:
        args.steps = 1 if args.quick else 4
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Measure, write the report, print the figures; the result, or {} when skipped."""
    args = parse_args(argv)
    out = Path(args.output_dir)
    if not args.force and saved_settings_match(out / "node_memory.json", node_memory_settings(args)):
        print(f"node memory: results with these settings already in {out / 'node_memory.json'}; skipped")
        return {}
    record = run_record()  # at the start: the commit the measured code ran on
    with tempfile.TemporaryDirectory(prefix="node-memory-") as tmp:
        workdir = Path(tmp)
        model_dir = args.model
        if args.quick and not model_dir:
            from sapo.models import save_tiny_model

            model_dir = str(save_tiny_model(workdir / "tiny-model"))
        result = run_node_memory(args, workdir, model_dir)
    result.update(record)
    write_node_memory(result, out, memory_notes())
    s = result["summary"]
    print(
        f"sapo-node memory: peak {s['peak_total_mb']:.0f} MB (node {s['peak_node_mb']:.0f}, p2pd "
        f"{s['peak_p2pd_mb']:.0f}), steady {s['steady_total_mb']:.0f} MB (node {s['steady_node_mb']:.0f}, "
        f"p2pd {s['steady_p2pd_mb']:.0f})"
    )
    return result


if __name__ == "__main__":
    main()
