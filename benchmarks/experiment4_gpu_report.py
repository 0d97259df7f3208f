"""Experiment 4's exploratory GPU run read out: steps reached, step time, held-out curves and paired contrasts.

``python -m benchmarks.experiment4_gpu_report RUNS --gpu-csv FILE --out DIR`` reads the three arms that
``benchmarks/experiment4_gpu.sh run`` left (RUNS holds ``8-0``, ``4-4`` and ``4-4r``) and writes ``DIR/report.md`` and
``DIR/report.json``. One seed: the intervals are over the 256 questions alone (paired by question, the peers'
mean outcome per question), never over seeds, and the page claims nothing (preregistered/default_mix_equal.md, "GPU").
Contrasts are taken at the last step every node of every arm evaluated; a node stopped by the deadline before its last
evaluation counts at the steps it reached.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import tarfile
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.held_out_table import outcomes_by_step, question_tasks
from benchmarks.stats import paired_difference

ARMS = {"4-4": "swarm 1/1", "4-4r": "self-replay 1/1", "8-0": "alone 2/0"}
OWN_GROUPS_PER_STEP = {"4-4": 1, "4-4r": 1, "8-0": 2}  # I of each arm: the groups a node generates every step
CONTRASTS = (("4-4", "4-4r"), ("4-4", "8-0"), ("4-4r", "8-0"))


def node_dirs(runs: Path, arm: str) -> list[Path]:
    """The node directories of one arm's run, in node order."""
    return sorted(runs.glob(f"runs/{arm}/*/*/seed-*/node-*"))


def first_attempt(runs: Path, arm: str) -> dict[str, Any]:
    """The first line of the arm's ``attempts.jsonl``: when it started, on which CPU, with which command."""
    (path,) = runs.glob(f"runs/{arm}/*/*/seed-*/attempts.jsonl")
    return json.loads(path.read_text().splitlines()[0])


def node_figures(node: Path, own_per_step: int, by_step: int) -> dict[str, Any]:
    """One node's steps trained, median step seconds, groups taken and fill-ins, the groups it generated itself up to
    ``by_step`` (its I a step and its fill-ins), held-out pass@1 by evaluated step."""
    rows = [json.loads(line) for line in (node / "metrics.jsonl").read_text().splitlines()]
    trained = [row for row in rows if "step_time" in row]
    held_out = outcomes_by_step(node / "held_out.jsonl")
    return {
        "steps": max((row["step"] for row in trained), default=0),
        "median_step_seconds": statistics.median(row["step_time"] for row in trained) if trained else None,
        "external_groups": sum(row.get("sapo/external_groups", 0.0) for row in trained),
        "replay_groups": sum(row.get("sapo/replay_groups", 0.0) for row in trained),
        "fill_ins": sum(row.get("sapo/fill_ins", 0.0) for row in trained),
        "own_groups_by_compared_step": sum(
            own_per_step + row.get("sapo/fill_ins", 0.0) for row in trained if row["step"] <= by_step
        ),
        "held_out": {step: statistics.fmean(outcomes) for step, outcomes in sorted(held_out.items())},
    }


def common_step(outcomes: dict[str, list[dict[int, list[float]]]]) -> int:
    """The last step that every node of every arm evaluated."""
    steps = set.intersection(*(set(node) for nodes in outcomes.values() for node in nodes))
    return max(steps)


def contrast(first: list[list[float]], second: list[list[float]], keep: Sequence[bool] | None = None) -> dict:
    """``first - second`` paired by question (rows: nodes), on the questions ``keep`` marks (all by default)."""
    if keep is not None:
        first = [[v for v, k in zip(row, keep, strict=True) if k] for row in first]
        second = [[v for v, k in zip(row, keep, strict=True) if k] for row in second]
    return paired_difference(first, second).to_json()


def analyse(runs: Path) -> dict[str, Any]:
    """Every figure of the report as a JSON-ready dict."""
    nodes = {arm: node_dirs(runs, arm) for arm in ARMS}
    outcomes = {arm: [outcomes_by_step(node / "held_out.jsonl") for node in dirs] for arm, dirs in nodes.items()}
    step = common_step(outcomes)
    tasks = question_tasks(nodes["4-4"][0] / "held_out.jsonl")
    at = {arm: [node[step] for node in outcomes[arm]] for arm in ARMS}
    start = {arm: [node[0] for node in outcomes[arm]] for arm in ARMS}
    attempts = {arm: first_attempt(runs, arm) for arm in ARMS}
    result: dict[str, Any] = {
        "started_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime(min(a["started"] for a in attempts.values()))),
        "cpus": sorted({a["cpu"] for a in attempts.values()}),
        "commands": {arm: " ".join(a["command"][1:]) for arm, a in attempts.items()},
        "compared_step": step,
        "questions": len(tasks),
        "arms": {
            arm: [node_figures(node, OWN_GROUPS_PER_STEP[arm], step) for node in dirs] for arm, dirs in nodes.items()
        },
        "change_from_step_0": {arm: contrast(at[arm], start[arm]) for arm in ARMS},
        "contrasts": {f"{a} - {b}": contrast(at[a], at[b]) for a, b in CONTRASTS},
        "per_task": {},
    }
    for task in sorted(set(tasks)):
        keep = [t == task for t in tasks]
        result["per_task"][task] = {
            "questions": sum(keep),
            **{f"{a} - {b}": contrast(at[a], at[b], keep) for a, b in CONTRASTS},
            **{f"{arm} change": contrast(at[arm], start[arm], keep) for arm in ARMS},
        }
    return result


def gpu_readings(path: Path) -> dict[str, float]:
    """Mean utilisation (%) and the largest memory in use (MiB) over ``nvidia-smi``'s samples with any memory used."""
    with open(path) as f:
        rows = [[cell.strip() for cell in row] for row in csv.reader(f)][1:]
    busy = [row for row in rows if len(row) >= 3 and float(row[2].split()[0]) > 0]
    return {
        "samples": len(busy),
        "mean_utilisation_percent": statistics.fmean(float(row[1].split()[0]) for row in busy) if busy else 0.0,
        "max_memory_mib": max((float(row[2].split()[0]) for row in busy), default=0.0),
    }


def interval(figure: dict[str, float]) -> str:
    """``+0.137 (+0.076 to +0.198)``."""
    return f"{figure['value']:+.3f} ({figure['ci_low']:+.3f} to {figure['ci_high']:+.3f})"


def markdown(result: dict[str, Any]) -> str:
    """The report page."""
    step = result["compared_step"]
    lines = [
        "# Experiment 4 on a GPU, exploratory (seed 20, three arms side by side)",
        "",
        'Registered as exploratory (`benchmarks/preregistered/default_mix_equal.md`, "GPU"): it does not enter the',
        "registered analysis. One seed: every interval below is over the "
        f"{result['questions']} held-out questions alone (paired by question), none over seeds.",
        "",
        f"Code: {result.get('commit', 'not given')}. Started {result['started_utc']} UTC; the three arms ran at once "
        f"on one GPU and its host's CPU ({', '.join(result['cpus'])}), nothing else beside them, so a node's step "
        "time depends on the other arms' load: compare the arms per step, not per second.",
        "",
        "| arm | node | steps trained | median s / step | taken from the swarm | replayed | fill-ins | held-out |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for arm, label in ARMS.items():
        for index, node in enumerate(result["arms"][arm]):
            curve = ", ".join(f"{s}: {v:.3f}" for s, v in node["held_out"].items())
            seconds = f"{node['median_step_seconds']:.2f}" if node["median_step_seconds"] is not None else "-"
            lines.append(
                f"| {label} | {index} | {node['steps']} | {seconds} | {node['external_groups']:.0f} | "
                f"{node['replay_groups']:.0f} | {node['fill_ins']:.0f} | {curve} |"
            )
    lines += ["", f"## At step {step}, the last step every node evaluated", ""]
    own = ", ".join(
        f"{label} {statistics.fmean(node['own_groups_by_compared_step'] for node in result['arms'][arm]):.0f}"
        for arm, label in ARMS.items()
    )
    lines += [f"Groups each node generated itself by then (its own and fill-ins, mean of nodes): {own}.", ""]
    for arm, label in ARMS.items():
        lines.append(f"- {label}, change from step 0: {interval(result['change_from_step_0'][arm])}")
    for name, figure in result["contrasts"].items():
        a, b = name.split(" - ")
        lines.append(f"- {ARMS[a]} minus {ARMS[b]}: {interval(figure)}")
    lines += ["", "Per task (questions):", ""]
    for task, figures in result["per_task"].items():
        changes = ", ".join(f"{ARMS[arm]} {interval(figures[f'{arm} change'])}" for arm in ARMS)
        contrasts = ", ".join(f"{ARMS[a].split()[0]} - {ARMS[b].split()[0]} {interval(figures[f'{a} - {b}'])}"
                              for a, b in CONTRASTS)  # fmt: skip
        lines.append(f"- {task} ({figures['questions']}): change {changes}; {contrasts}")
    if "gpu" in result:
        gpu = result["gpu"]
        lines += [
            "",
            f"GPU: {gpu['mean_utilisation_percent']:.0f} % mean utilisation, "
            f"at most {gpu['max_memory_mib'] / 1024:.1f} GiB in use "
            f"({gpu['samples']} samples of nvidia-smi, 5 s apart).",
        ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Read the runs, write the page and its JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path, help="the folder (or .tar.xz) holding runs/8-0, runs/4-4 and runs/4-4r")
    parser.add_argument("--commit", default=None, help="the commit the runs ran on (a device copy has no .git)")
    parser.add_argument("--gpu-csv", type=Path, default=None, help="nvidia-smi's samples (gpu.csv of the run)")
    parser.add_argument("--out", type=Path, required=True, help="where report.md and report.json go")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as unpacked:
        runs = args.runs
        if runs.is_file():
            with tarfile.open(runs) as archive:
                archive.extractall(unpacked, filter="data")
            runs = Path(unpacked)
        result = analyse(runs)
    if args.commit is not None:
        result["commit"] = args.commit
    if args.gpu_csv is not None:
        result["gpu"] = gpu_readings(args.gpu_csv)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "report.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "report.md").write_text(markdown(result))
    print(markdown(result))
    return result


if __name__ == "__main__":
    main()
