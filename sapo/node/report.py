"""`sapo-node report RUN_DIR`: every node's training reward and held-out pass@1 (PNG) and a summary table."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any, NamedTuple

from sapo.jsonl_files import read_jsonl

HELD_OUT_KEY = "eval/pass@1"  # a line that carries it is a held-out evaluation line, not a training line
HELD_OUT_SE_KEY = "eval/pass@1_se"
HELD_OUT_QUESTIONS_KEY = "eval/questions"


def is_evaluation_line(record: dict[str, Any]) -> bool:
    """Whether a metrics.jsonl line (or a metrics dict) is a held-out evaluation, not a training step."""
    return HELD_OUT_KEY in record


def load_runs(run_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """Every node's metrics.jsonl under ``run_dir`` (the directory itself, or its node subdirectories), its rotated
    files (``metrics.jsonl.N``) first: :func:`sapo.jsonl_files.read_jsonl`."""
    files = sorted(run_dir.glob("*/metrics.jsonl"))
    if (run_dir / "metrics.jsonl").exists():
        files.insert(0, run_dir / "metrics.jsonl")
    return {path.parent.name: list(read_jsonl(path)) for path in files}


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


class NodeLines(NamedTuple):
    """A node's metrics.jsonl lines, split by kind."""

    training: list[dict[str, Any]]
    """Training lines, in file order."""
    evaluations: list[dict[str, Any]]
    """Held-out evaluation lines, one per step (the last one logged for it), in step order, each with its "step"."""


def split_lines(rows: list[dict[str, Any]]) -> NodeLines:
    """Training lines and held-out evaluation lines of one node; a step evaluated twice (a restart) keeps its last."""
    training: list[dict[str, Any]] = []
    evaluation_by_step: dict[int, dict[str, Any]] = {}
    for i, row in enumerate(rows):
        if is_evaluation_line(row):
            step = int(row.get("step", i))
            evaluation_by_step[step] = {**row, "step": step}
        else:
            training.append(row)
    return NodeLines(training, [evaluation_by_step[step] for step in sorted(evaluation_by_step)])


def held_out_series(evaluations: list[dict[str, Any]]) -> tuple[list[int], list[float], list[float]]:
    """(steps, pass@1, standard error) of the evaluations whose pass@1 is a number; a missing s.e. reads 0."""
    steps, pass_at_1, standard_errors = [], [], []
    for row in evaluations:
        value = float(row.get(HELD_OUT_KEY, math.nan))
        if math.isnan(value):
            continue
        steps.append(int(row["step"]))
        pass_at_1.append(value)
        se = float(row.get(HELD_OUT_SE_KEY, 0.0))
        standard_errors.append(0.0 if math.isnan(se) else se)
    return steps, pass_at_1, standard_errors


def summary(runs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per node: steps, mean local reward in the first and last quarter of its training lines, groups taken
    and shared, and held-out pass@1 at its first and last evaluation (NaN without one)."""
    table = []
    for name, rows in runs.items():
        training, evaluations = split_lines(rows)
        _, local = series(training, "sapo/local_reward")
        _, external = series(training, "sapo/external_reward")
        _, held_out, _ = held_out_series(evaluations)
        quarter = max(1, len(local) // 4)
        last_training = training[-1] if training else {}
        table.append(
            {
                "node": name,
                "steps": max((int(r.get("step", 0)) for r in rows), default=0),
                "reward_first": _nanmean(local[:quarter]),
                "reward_last": _nanmean(local[-quarter:]),
                "reward_swarm": _nanmean(external),
                "cumulative_reward": sum(v for v in local if not math.isnan(v)),
                "held_out_start": held_out[0] if held_out else math.nan,
                "held_out_end": held_out[-1] if held_out else math.nan,
                "taken": int(last_training.get("sapo/total/external_groups", 0)),
                "shared": int(last_training.get("sapo/total/published_groups", 0)),
                "peers": int(last_training.get("sapo/peers", 0)),
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
    ("held-out(start)", "held_out_start", ">15.3f"),
    ("held-out(end)", "held_out_end", ">13.3f"),
    ("taken", "taken", ">6"),
    ("shared", "shared", ">7"),
    ("peers", "peers", ">6"),
)


def format_table(rows: list[dict[str, Any]]) -> str:
    """The summary as a fixed-width text table; a figure that is NaN (no data) reads `-`."""
    header = " ".join(f"{title:{fmt.split('.')[0]}}" for title, _, fmt in _COLUMNS)
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(" ".join(_cell(r[key], fmt) for _, key, fmt in _COLUMNS))
    return "\n".join(lines)


def _cell(value: Any, fmt: str) -> str:
    if isinstance(value, float) and math.isnan(value):
        return f"{'-':{fmt.split('.')[0]}}"
    return f"{value:{fmt}}"


def plot(runs: dict[str, list[dict[str, Any]]], path: Path, window: int = 10) -> Path:
    """Each node's local reward (moving average), its local vs swarm reward, and, when any node evaluated, its
    held-out pass@1 at every evaluation with ±1 standard error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines_by_node = {name: split_lines(rows) for name, rows in runs.items()}
    evaluated = {
        name: lines.evaluations for name, lines in lines_by_node.items() if held_out_series(lines.evaluations)[0]
    }
    panels = 3 if evaluated else 2
    fig, axes = plt.subplots(1, panels, figsize=(6.5 * panels, 4.8))
    ax_local, ax_mix = axes[0], axes[1]
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    node_colors = {name: palette[i % len(palette)] for i, name in enumerate(runs)}
    for name, lines in lines_by_node.items():
        color = node_colors[name]
        steps, local = series(lines.training, "sapo/local_reward")
        ax_local.plot(steps, moving_average(local, window), color=color, label=name)
        ax_mix.plot(steps, moving_average(local, window), color=color, label=f"{name} own groups")
        _, external = series(lines.training, "sapo/external_reward")
        if any(not math.isnan(v) for v in external):
            ax_mix.plot(steps, moving_average(external, window), "--", color=color, label=f"{name} swarm groups")
    ax_local.set(
        title=f"Reward of each node's own completions (moving average, {window} steps)", xlabel="step", ylabel="reward"
    )
    ax_mix.set(title="Own vs swarm groups, scored by the receiving node", xlabel="step", ylabel="reward")
    if evaluated:
        _plot_held_out(axes[2], evaluated, node_colors)
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _plot_held_out(ax: Any, evaluations_by_node: dict[str, list[dict[str, Any]]], node_colors: dict[str, str]) -> None:
    """Held-out pass@1 per node on a 0..1 axis; error bars of ±1 s.e., cut at 0 and 1 where pass@1 cannot go."""
    for name, evaluations in evaluations_by_node.items():
        steps, pass_at_1, standard_errors = held_out_series(evaluations)
        below = [min(se, p) for p, se in zip(pass_at_1, standard_errors, strict=True)]
        above = [min(se, 1.0 - p) for p, se in zip(pass_at_1, standard_errors, strict=True)]
        questions = evaluations[-1].get(HELD_OUT_QUESTIONS_KEY)
        label = f"{name} ({int(questions)} questions)" if questions is not None else name
        ax.errorbar(
            steps,
            pass_at_1,
            yerr=[below, above],
            marker="o",
            markersize=4,
            capsize=3,
            color=node_colors[name],
            label=label,
            clip_on=False,
        )
    ax.set(title="Held-out pass@1 (greedy, ±1 standard error)", xlabel="step", ylabel="pass@1", ylim=(0.0, 1.0))


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
