"""`sapo-node report RUN_DIR`: reward curves of every node in a run directory (PNG) and a summary table."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any


def load_runs(run_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """Every node's metrics.jsonl under ``run_dir`` (the directory itself, or its node subdirectories)."""
    files = sorted(run_dir.glob("*/metrics.jsonl"))
    if (run_dir / "metrics.jsonl").exists():
        files.insert(0, run_dir / "metrics.jsonl")
    runs = {}
    for path in files:
        rows = []
        for line in path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a torn last line of a killed node
        runs[path.parent.name] = rows
    return runs


def moving_average(values: list[float], window: int) -> list[float]:
    """Trailing moving average that skips NaNs; NaN where the window holds no value."""
    out = []
    for i in range(len(values)):
        chunk = [v for v in values[max(0, i - window + 1) : i + 1] if not math.isnan(v)]
        out.append(sum(chunk) / len(chunk) if chunk else math.nan)
    return out


def series(rows: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of one metric, NaN where a step did not log it."""
    steps = [int(r.get("step", i)) for i, r in enumerate(rows)]
    return steps, [float(r.get(key, math.nan)) for r in rows]


def summary(runs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per node: steps, mean local reward in the first and last quarter, groups taken and shared."""
    table = []
    for name, rows in runs.items():
        _, local = series(rows, "sapo/local_reward")
        _, external = series(rows, "sapo/external_reward")
        quarter = max(1, len(local) // 4)
        last = rows[-1] if rows else {}
        table.append(
            {
                "node": name,
                "steps": int(last.get("step", 0)),
                "reward_first": _nanmean(local[:quarter]),
                "reward_last": _nanmean(local[-quarter:]),
                "reward_swarm": _nanmean(external),
                "cumulative_reward": sum(v for v in local if not math.isnan(v)),
                "taken": int(last.get("sapo/total/external_groups", 0)),
                "shared": int(last.get("sapo/total/published_groups", 0)),
                "peers": int(last.get("sapo/peers", 0)),
            }
        )
    return table


def _nanmean(values: list[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return sum(finite) / len(finite) if finite else math.nan


_COLUMNS = (  # (header, key, format)
    ("node", "node", "<12"),
    ("steps", "steps", ">6"),
    ("reward(first)", "reward_first", ">14.3f"),
    ("reward(last)", "reward_last", ">13.3f"),
    ("swarm reward", "reward_swarm", ">13.3f"),
    ("cum.", "cumulative_reward", ">8.2f"),
    ("taken", "taken", ">6"),
    ("shared", "shared", ">7"),
    ("peers", "peers", ">6"),
)


def format_table(rows: list[dict[str, Any]]) -> str:
    """The summary as a fixed-width text table."""
    header = " ".join(f"{title:{fmt.split('.')[0]}}" for title, _, fmt in _COLUMNS)
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(" ".join(f"{r[key]:{fmt}}" for _, key, fmt in _COLUMNS))
    return "\n".join(lines)


def plot(runs: dict[str, list[dict[str, Any]]], path: Path, window: int = 10) -> Path:
    """Two panels: each node's local reward (moving average), and its local vs swarm reward."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_local, ax_mix) = plt.subplots(1, 2, figsize=(13, 4.8))
    for name, rows in runs.items():
        steps, local = series(rows, "sapo/local_reward")
        ax_local.plot(steps, moving_average(local, window), label=name)
        line = ax_mix.plot(steps, moving_average(local, window), label=f"{name} own groups")[0]
        _, external = series(rows, "sapo/external_reward")
        if any(not math.isnan(v) for v in external):
            ax_mix.plot(
                steps, moving_average(external, window), "--", color=line.get_color(), label=f"{name} swarm groups"
            )
    ax_local.set(
        title=f"Reward of each node's own completions (moving average, {window} steps)", xlabel="step", ylabel="reward"
    )
    ax_mix.set(title="Own vs swarm groups, scored by the receiving node", xlabel="step", ylabel="reward")
    for ax in (ax_local, ax_mix):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str]) -> int:
    """Write RUN_DIR/report.png and print the table; exit 2 when RUN_DIR holds no metrics."""
    parser = argparse.ArgumentParser(prog="sapo-node report", description=__doc__)
    parser.add_argument("run_dir", type=Path, help="a node's output directory or a local-swarm run directory")
    parser.add_argument("--window", type=int, default=10, help="moving-average window in steps (default 10)")
    parser.add_argument("--output", type=Path, default=None, help="PNG path (default RUN_DIR/report.png)")
    args = parser.parse_args(argv)
    runs = {name: rows for name, rows in load_runs(args.run_dir).items() if rows}
    if not runs:
        print(f"sapo-node report: error: no metrics.jsonl with data under {args.run_dir}", flush=True)
        return 2
    png = plot(runs, args.output or args.run_dir / "report.png", window=args.window)
    print(format_table(summary(runs)))
    print(f"\nplot: {png}")
    return 0
