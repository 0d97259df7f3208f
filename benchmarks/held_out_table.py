"""Held-out pass@1 of sapo_table's archived runs: start and end per setting and seed, differences with standard
errors, and the curves.

sapo_table.py ranks settings by the reward of the peers' own completions; this page answers the question that
matters more, on questions training never draws: did the peers of one setting end up solving more held-out
questions than those of another? It reads the archives only (``benchmarks/results/sapo_table_runs/<profile>/``),
so it runs in seconds and starts nothing.

    python -m benchmarks.held_out_table --profile cpu-learn

Statistics: each node evaluates the same held-out questions greedily (one completion per question), so its
pass@1 has a binomial standard error ``se_i`` (logged beside it). A run's figure is the mean over its peers, with
standard error ``sqrt(sum se_i^2) / peers``; this treats the peers as independent and so overstates the error when
peers agree on the same questions, which keeps the comparison conservative. A difference between two settings on
the same seed has standard error ``sqrt(se_a^2 + se_b^2)`` (unpaired: conservative again, since both answer the
same questions). Over seeds, the mean difference has the standard error of the per-seed differences.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.harness import ROOT, commit_label
from sapo.node.report import is_evaluation_line

RESULTS = ROOT / "benchmarks" / "results"
PAPER_GROUPS_PER_STEP = 8  # the paper's I + J


@dataclass(frozen=True)
class RunCurve:
    """One archived run's held-out curve: mean pass@1 over its peers at each evaluated step, and its error."""

    setting: str  # "I-J" as run
    seed: int
    steps: list[int]
    pass_at_1: list[float]
    standard_error: list[float]
    peers: int
    commit: str


def paper_label(setting: str) -> str:
    """``"1-1"`` -> ``"4/4 (run as 1/1)"``: the paper's I/J for a setting scaled down to fewer groups per step."""
    local, external = (int(x) for x in setting.split("-"))
    scale = PAPER_GROUPS_PER_STEP // max(1, local + external)
    return f"{local * scale}/{external * scale} (run as {local}/{external})"


def evaluations_by_step(metrics: Path) -> dict[int, dict[str, float]]:
    """A node's evaluation lines by step; a step evaluated twice (a resumed run) keeps its last line."""
    by_step: dict[int, dict[str, float]] = {}
    for line in metrics.read_text().splitlines():
        row = json.loads(line)
        if is_evaluation_line(row):
            by_step[int(row["step"])] = row
    return by_step


def read_run(run_dir: Path) -> RunCurve | None:
    """The held-out curve of one archived run, or None if it is not complete (no completion marker)."""
    marker_path = run_dir / "run-complete.json"
    if not marker_path.exists():
        return None
    marker = json.loads(marker_path.read_text())
    nodes = [evaluations_by_step(path) for path in sorted(run_dir.glob("node-*/metrics.jsonl"))]
    common = sorted(set.intersection(*(set(node) for node in nodes))) if nodes else []
    means, errors = [], []
    for step in common:
        means.append(statistics.fmean(node[step]["eval/pass@1"] for node in nodes))
        errors.append(math.sqrt(sum(node[step]["eval/pass@1_se"] ** 2 for node in nodes)) / len(nodes))
    code = marker.get("code") or {}
    commit = str(code.get("commit", "?"))[:10] + (" (dirty)" if code.get("dirty") else "")
    return RunCurve(
        setting=run_dir.parent.name,
        seed=int(run_dir.name.split("-")[1]),
        steps=common,
        pass_at_1=means,
        standard_error=errors,
        peers=len(nodes),
        commit=commit,
    )


def read_profile(archive: Path) -> list[RunCurve]:
    """Every complete run archived for one profile, ordered by setting (most local first) and seed."""
    runs = [read_run(path) for path in sorted(archive.glob("*-*/seed-*"))]
    complete = [run for run in runs if run is not None and run.steps]
    return sorted(complete, key=lambda r: (-int(r.setting.split("-")[0]), r.seed))


def compare(runs: Sequence[RunCurve], baseline: str) -> dict[str, Any]:
    """Per setting: each seed's end-minus-baseline difference (same seed) with its SE, and the mean over seeds."""
    base = {run.seed: run for run in runs if run.setting == baseline}
    out: dict[str, Any] = {}
    for setting in sorted({run.setting for run in runs if run.setting != baseline}):
        rows = []
        for run in (r for r in runs if r.setting == setting and r.seed in base):
            other = base[run.seed]
            difference = run.pass_at_1[-1] - other.pass_at_1[-1]
            error = math.hypot(run.standard_error[-1], other.standard_error[-1])
            rows.append({"seed": run.seed, "difference": difference, "se": error, "z": difference / error})
        differences = [row["difference"] for row in rows]
        mean = statistics.fmean(differences) if differences else None
        spread = statistics.stdev(differences) / math.sqrt(len(differences)) if len(differences) > 1 else None
        out[setting] = {"per_seed": rows, "mean_difference": mean, "se_over_seeds": spread}
    return out


def markdown(profile: str, runs: Sequence[RunCurve], comparison: dict[str, Any], baseline: str, plot: str) -> str:
    """The report page."""
    lines = [
        f"# Held-out pass@1 of the SAPO table, profile `{profile}`",
        "",
        f"Command: `python -m benchmarks.held_out_table --profile {profile}`  ",
        f"Report code: `{commit_label()}`; each run's own commit is in the table.",
        "",
        "Greedy pass@1 on held-out questions (task seeds training never draws), mean over each run's peers; ± is one "
        "standard error (see the module docstring of benchmarks/held_out_table.py for how it is computed).",
        "",
        "| I/J (paper) | seed | peers | start | end | change | run's commit |",
        "|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        lines.append(
            f"| {paper_label(run.setting)} | {run.seed} | {run.peers} | {run.pass_at_1[0]:.3f} ± "
            f"{run.standard_error[0]:.3f} | {run.pass_at_1[-1]:.3f} ± {run.standard_error[-1]:.3f} | "
            f"{run.pass_at_1[-1] - run.pass_at_1[0]:+.3f} | {run.commit} |"
        )
    lines += ["", f"## End of training: each setting minus {paper_label(baseline)}, same seed", ""]
    for setting, result in comparison.items():
        for row in result["per_seed"]:
            lines.append(
                f"- {paper_label(setting)}, seed {row['seed']}: {row['difference']:+.3f} ± {row['se']:.3f} "
                f"({row['z']:+.1f} standard errors)"
            )
        if result["mean_difference"] is not None:
            spread = result["se_over_seeds"]
            shown = f" ± {spread:.3f} over {len(result['per_seed'])} seeds" if spread is not None else " (one seed)"
            lines.append(f"- {paper_label(setting)}, mean over seeds: {result['mean_difference']:+.3f}{shown}")
    lines += ["", f"![held-out curves]({plot})", ""]
    return "\n".join(lines)


def plot_curves(runs: Sequence[RunCurve], path: Path, profile: str) -> None:
    """Held-out pass@1 against step: one line per run, a colour per setting, a band of one standard error."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings = sorted({run.setting for run in runs}, key=lambda s: -int(s.split("-")[0]))
    colours = {setting: f"C{i}" for i, setting in enumerate(settings)}
    figure, axis = plt.subplots(figsize=(8, 4.5))
    for run in runs:
        low = [m - e for m, e in zip(run.pass_at_1, run.standard_error, strict=True)]
        high = [m + e for m, e in zip(run.pass_at_1, run.standard_error, strict=True)]
        colour = colours[run.setting]
        label = f"{paper_label(run.setting)} seed {run.seed}"
        axis.plot(run.steps, run.pass_at_1, marker="o", color=colour, label=label)
        axis.fill_between(run.steps, low, high, color=colour, alpha=0.12)
    axis.set_xlabel("step")
    axis.set_ylabel("held-out pass@1 (mean over peers)")
    axis.set_title(f"Held-out pass@1, profile {profile} (band: one standard error)")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Read the archives of ``--profile``, write sapo_table_<profile>_held_out.{md,json,png} and print the page."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.held_out_table", description=__doc__.split("\n")[0])
    parser.add_argument("--profile", default="cpu-learn", help="sapo_table profile whose archived runs to read")
    parser.add_argument("--baseline", default="2-0", help="setting compared against, as run (I-J)")
    parser.add_argument("--results-dir", default=str(RESULTS), help="where the archives are and the outputs go")
    args = parser.parse_args(argv)
    results = Path(args.results_dir)
    archive = results / "sapo_table_runs" / args.profile
    runs = read_profile(archive)
    if not runs:
        raise SystemExit(f"held_out_table: no complete run archived under {archive}; run benchmarks/sapo_table.py")
    comparison = compare(runs, args.baseline)
    stem = f"sapo_table_{args.profile}_held_out"
    plot_curves(runs, results / f"{stem}.png", args.profile)
    page = markdown(args.profile, runs, comparison, args.baseline, f"{stem}.png")
    (results / f"{stem}.md").write_text(page)
    data = {"runs": [vars(run) for run in runs], "comparison": comparison}
    (results / f"{stem}.json").write_text(json.dumps(data, indent=1) + "\n")
    print(page)
    return data


if __name__ == "__main__":
    main()
