"""Compute-matched report of sapo_table's archived runs: held-out pass@1 against steps, own completions generated
and seconds, time to reach a held-out level, and the paper's per-step cumulative reward, with 95 % intervals.

A 4/4 peer generates about half the completions of an 8/0 peer per step (it trains on the swarm's for the rest),
so comparing settings per step leaves out what sharing saves. This page puts the archived runs of one profile
(``benchmarks/results/sapo_table_runs/<profile>/``) on three axes:

- **steps** (what sapo_table and held_out_table compare);
- **own completions generated** per peer: ``(I + fill-ins) x G`` per step, summed (machine-independent);
- **seconds on a machine to itself**: each run's training seconds (``step_time``, evaluation excluded), rescaled
  to the run that had the machine alone (``machine_notes.json`` beside the archives says which, from the commits
  that archived them). A run that shared the machine ran slower by a factor read from its own steps: the median
  of the non-generation part of a step (the GRPO update on I + J groups of G completions, the same work in every
  setting) over that of the lone run. Its seconds divided by that factor are what it would have taken alone. This
  is a model (it assumes the slowdown was the same for generation and the update); the measured seconds are in
  the JSON beside it and cannot be compared between runs that shared the machine differently.

Statistics: :mod:`benchmarks.stats`, as in held_out_table (its docstring): a value between two evaluations is
interpolated linearly, question by question where the run archived per-question outcomes (its error then clustered
by question), else from the two evaluations' figures with the same mix of their errors (an upper bound). Differences
between settings are paired by seed, and by question where both runs archived their outcomes; their mean over seeds
(and a setting's mean gain per compute) has the interval of :func:`benchmarks.stats.seeds_and_questions` (seed and
question terms, each at its own t quantile; the question term bounded by the per-seed errors without outcomes),
with the plain t-interval over seeds beside it. Time to accuracy and the cumulative training reward have no shared
questions: the plain t-interval over the seeds (those that reached the level; none when fewer than 2 did).

    python -m benchmarks.compute_report --profile cpu-learn
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.harness import commit_label
from benchmarks.held_out_table import (
    RunCurve,
    archive_arguments,
    difference,
    over_seeds,
    paper_label,
    question_differences,
    read_profile,
)
from benchmarks.results_archive import restored
from benchmarks.sharing_counts import run_counts, sharing_lines
from benchmarks.stats import Estimate, t_over_seeds, t_quantile

AXES = ("steps", "own_completions", "alone_seconds")
AXIS_LABELS = {
    "steps": "step",
    "own_completions": "own completions generated per peer",
    "alone_seconds": "training seconds per peer, machine to itself (modelled)",
}


@dataclass
class RunCompute:
    """One archived run on every axis: cumulative values per step (index = step; 0 at step 0), means over peers."""

    curve: RunCurve
    own_completions: list[float]
    measured_seconds: list[float]
    local_reward: list[float]  # per step, summed over peers (the paper's per-step reward)
    generation_seconds: float  # median over peers and steps
    update_seconds: float  # median of step_time - generation: the same work in every setting
    machine: dict[str, Any]
    sharing: Counter = field(default_factory=Counter)  # what sharing carried (benchmarks.sharing_counts)
    slowdown: float = 1.0
    axes: dict[str, list[float]] = field(default_factory=dict)

    @property
    def key(self) -> str:
        """``"I-J/seed-S"``, as the archive names the run."""
        return f"{self.curve.setting}/seed-{self.curve.seed}"

    def at_evaluations(self, axis: str) -> list[float]:
        """The run's position on ``axis`` at each of its held-out evaluations."""
        return [self.axes[axis][step] for step in self.curve.steps]


def training_lines(metrics: Path) -> dict[int, dict[str, Any]]:
    """A node's training lines (those with a step time) by step; a step logged twice (a resumed run) keeps its last."""
    by_step: dict[int, dict[str, Any]] = {}
    for line in metrics.read_text().splitlines():
        row = json.loads(line)
        if "step_time" in row:
            by_step[int(row["step"])] = row
    return by_step


def _cumulative(values: Sequence[float]) -> list[float]:
    out, total = [0.0], 0.0
    for value in values:
        total += value
        out.append(total)
    return out


def own_completions(node: dict[int, dict[str, Any]], steps: range, local: int, generations: int) -> list[float]:
    """A node's own completions generated, cumulative per step (0 at step 0): ``(I + fill-ins) x G`` a step."""
    return _cumulative([(local + node[s].get("sapo/fill_ins", 0.0)) * generations for s in steps])


def training_seconds(node: dict[int, dict[str, Any]], steps: range) -> list[float]:
    """A node's training seconds (step times, evaluation excluded), cumulative per step (0 at step 0)."""
    return _cumulative([node[s]["step_time"] for s in steps])


def update_times(node: dict[int, dict[str, Any]], steps: range) -> list[float]:
    """A node's seconds per step outside generation (``step_time`` minus ``sapo/time/generation``): the GRPO update on
    I + J groups of G completions, the same work in every setting, so its median over a run measures how much what
    shared the machine slowed the run."""
    return [node[s]["step_time"] - node[s]["sapo/time/generation"] for s in steps]


def slowdowns(
    update_seconds: Mapping[str, float], alone: Collection[str], arm: Callable[[str], str] = lambda key: "every arm"
) -> tuple[dict[str, float], dict[str, float]]:
    """The model of a machine alone that this page and :mod:`benchmarks.campaign_runs` share. A run that shared the
    machine ran slower by its median seconds outside generation (``update_seconds``, by run key) over the mean of
    those of the runs made alone (the keys in ``alone``) of its arm (``arm`` maps a key to its arm; by default every
    run is one arm); an arm without a run made alone is set against all of them. Returns the references (by arm, and
    ``"every arm"``) and each run's slowdown; both empty without a run made alone. Runs without a positive figure
    (no generation times logged) get no slowdown and serve no reference."""
    measured = {key: seconds for key, seconds in update_seconds.items() if seconds > 0}  # nan compares False
    lone = [key for key in measured if key in alone]
    if not lone:
        return {}, {}
    references = {a: statistics.fmean(measured[k] for k in lone if arm(k) == a) for a in sorted({arm(k) for k in lone})}
    references["every arm"] = statistics.fmean(measured[k] for k in lone)
    slowdown = {key: seconds / references.get(arm(key), references["every arm"]) for key, seconds in measured.items()}
    return references, slowdown


def read_compute(run_dir: Path, curve: RunCurve, notes: dict[str, Any]) -> RunCompute:
    """The compute figures of one archived run (its held-out ``curve`` already read)."""
    marker = json.loads((run_dir / "run-complete.json").read_text())
    identity = marker["identity"]
    local, generations = int(identity["num_local"]), int(identity["num_generations"])
    nodes = [training_lines(path) for path in sorted(restored(run_dir).glob("node-*/metrics.jsonl"))]
    last = min(max(node) for node in nodes)
    steps = range(1, last + 1)
    completions, seconds, rewards, generation, update = [], [], [], [], []
    for node in nodes:
        completions.append(own_completions(node, steps, local, generations))
        seconds.append(training_seconds(node, steps))
        generation += [node[s]["sapo/time/generation"] for s in steps]
        update += update_times(node, steps)
    for s in steps:
        rewards.append(sum(node[s]["sapo/local_reward"] for node in nodes))
    return RunCompute(
        curve=curve,
        own_completions=[statistics.fmean(column) for column in zip(*completions, strict=True)],
        measured_seconds=[statistics.fmean(column) for column in zip(*seconds, strict=True)],
        local_reward=rewards,
        generation_seconds=statistics.median(generation),
        update_seconds=statistics.median(update),
        machine=notes.get(f"{curve.setting}/seed-{curve.seed}", {"alone": None, "note": "not recorded"}),
        sharing=run_counts(run_dir),
    )


def read_runs(archive: Path) -> list[RunCompute]:
    """Every complete run of the archive with its compute axes; seconds rescaled to the lone run (if any)."""
    notes_path = archive / "machine_notes.json"
    notes = json.loads(notes_path.read_text())["runs"] if notes_path.exists() else {}
    runs = [
        read_compute(archive / curve.setting / f"seed-{curve.seed}", curve, notes) for curve in read_profile(archive)
    ]
    alone = {run.key for run in runs if run.machine.get("alone")}
    _, slowdown = slowdowns({run.key: run.update_seconds for run in runs}, alone)
    for run in runs:
        run.slowdown = slowdown.get(run.key, 1.0)
        run.axes = {
            "steps": [float(s) for s in range(len(run.own_completions))],
            "own_completions": run.own_completions,
            "alone_seconds": [s / run.slowdown for s in run.measured_seconds] if slowdown else [],
        }
    return runs


def value_at(xs: Sequence[float], run: RunCurve, x: float) -> Estimate | None:
    """The run's held-out pass@1 at ``x``, interpolated linearly between its evaluations at ``xs`` (None outside)."""
    for i in range(len(xs) - 1):
        if xs[i] <= x <= xs[i + 1]:
            w = (x - xs[i]) / (xs[i + 1] - xs[i]) if xs[i + 1] > xs[i] else 1.0
            a, b = run.estimate(i), run.estimate(i + 1)
            return Estimate((1 - w) * a.value + w * b.value, (1 - w) * a.se + w * b.se, a.df)
    return None


def crossing(xs: Sequence[float], ys: Sequence[float], level: float) -> float | None:
    """The first ``x`` where the piecewise-linear curve through ``(xs, ys)`` reaches ``level`` (None: never)."""
    if ys[0] >= level:
        return xs[0]
    for i in range(len(xs) - 1):
        if ys[i] < level <= ys[i + 1]:
            return xs[i] + (level - ys[i]) / (ys[i + 1] - ys[i]) * (xs[i + 1] - xs[i])
    return None


def question_values_at(xs: Sequence[float], run: RunCurve, x: float) -> list[float] | None:
    """Per question, the run's mean outcome over its peers at ``x``, interpolated linearly between its evaluations
    at ``xs`` (None outside them, or where either evaluation has no per-question outcomes)."""
    for i in range(len(xs) - 1):
        if xs[i] <= x <= xs[i + 1]:
            w = (x - xs[i]) / (xs[i + 1] - xs[i]) if xs[i + 1] > xs[i] else 1.0
            a, b = run.question_means(i), run.question_means(i + 1)
            if a is None or b is None:
                return None
            return [(1 - w) * p + w * q for p, q in zip(a, b, strict=True)]
    return None


def _difference(
    mine: list[float] | None, theirs: list[float] | None, mine_estimate: Estimate, their_estimate: Estimate
) -> Estimate:
    """``mine - theirs``: paired by question when both per-question values are known (held_out_table's
    :func:`~benchmarks.held_out_table.difference`), else from the two estimates as if independent."""
    return difference(
        None if mine is None else [mine], None if theirs is None else [theirs], mine_estimate, their_estimate
    )


def matched_comparison(runs: Sequence[RunCompute], baseline: str, axis: str) -> dict[str, Any]:
    """Held-out pass@1 of every setting and the baseline at the same budget on ``axis`` (the largest budget every
    run reached), paired by seed (and by question where the outcomes were archived): per-seed differences and their
    mean over seeds (:func:`benchmarks.held_out_table.over_seeds`)."""
    budget = min(run.at_evaluations(axis)[-1] for run in runs)
    base = {run.curve.seed: run for run in runs if run.curve.setting == baseline}
    out: dict[str, Any] = {"budget": budget}
    for setting in sorted({run.curve.setting for run in runs} - {baseline}):
        per_seed, tables = {}, {}
        for run in (r for r in runs if r.curve.setting == setting and r.curve.seed in base):
            other = base[run.curve.seed]
            mine = value_at(run.at_evaluations(axis), run.curve, budget)
            theirs = value_at(other.at_evaluations(axis), other.curve, budget)
            if mine is None or theirs is None:
                continue
            my_questions = question_values_at(run.at_evaluations(axis), run.curve, budget)
            their_questions = question_values_at(other.at_evaluations(axis), other.curve, budget)
            per_seed[run.curve.seed] = _difference(my_questions, their_questions, mine, theirs)
            tables[run.curve.seed] = question_differences(my_questions, their_questions)
        out[setting] = over_seeds(per_seed, tables)
    return out


def gain_per_completions(runs: Sequence[RunCompute], baseline: str, per: float = 100.0) -> dict[str, Any]:
    """Held-out gain (end minus start) per ``per`` own completions of each run, each setting's mean over seeds, and
    each setting's difference from the baseline paired by seed (and by question where the outcomes were archived)."""
    rates, tables = {}, {}
    for run in runs:
        change, scale = run.curve.change(), per / run.at_evaluations("own_completions")[-1]
        rates[run.key] = Estimate(change.value * scale, change.se * scale, change.df)
        gains = question_differences(run.curve.question_means(-1), run.curve.question_means(0))
        tables[run.key] = None if gains is None else [g * scale for g in gains]
    out: dict[str, Any] = {"per_run": {key: e.to_json() for key, e in rates.items()}, "per": per}
    for setting in sorted({run.curve.setting for run in runs}):
        keys = {run.curve.seed: run.key for run in runs if run.curve.setting == setting}
        out[setting] = {
            "mean": over_seeds({s: rates[k] for s, k in keys.items()}, {s: tables[k] for s, k in keys.items()})
        }
        if setting != baseline:
            pairs = {s: (k, f"{baseline}/seed-{s}") for s, k in keys.items() if f"{baseline}/seed-{s}" in rates}
            per_seed = {s: _difference(tables[a], tables[b], rates[a], rates[b]) for s, (a, b) in pairs.items()}
            differences = {s: question_differences(tables[a], tables[b]) for s, (a, b) in pairs.items()}
            out[setting]["minus_baseline"] = over_seeds(per_seed, differences)
    return out


def time_to_accuracy(runs: Sequence[RunCompute], levels: Sequence[float]) -> dict[str, Any]:
    """Per level and setting: where each run first reaches the level on every axis, and the mean over the seeds
    that reached it with the plain t-interval over them."""
    out: dict[str, Any] = {}
    for level in levels:
        by_setting: dict[str, Any] = {}
        for setting in sorted({run.curve.setting for run in runs}, key=lambda s: -int(s.split("-")[0])):
            mine = [run for run in runs if run.curve.setting == setting]
            entry: dict[str, Any] = {"runs": len(mine)}
            for axis in AXES:
                if not mine[0].axes[axis]:
                    continue
                reached = [crossing(run.at_evaluations(axis), run.curve.pass_at_1, level) for run in mine]
                values = [x for x in reached if x is not None]
                entry[axis] = {
                    "per_seed": {run.curve.seed: x for run, x in zip(mine, reached, strict=True)},
                    "reached": len(values),
                    "mean": t_over_seeds(values).to_json() if values else None,
                }
            by_setting[setting] = entry
        out[f"{level:.3f}"] = by_setting
    return out


def cumulative_reward(runs: Sequence[RunCompute], baseline: str) -> dict[str, Any]:
    """The paper's metric: the sum over peers and steps of each peer's own-completion reward; per setting the mean
    over seeds with its plain t-interval, and the difference from the baseline paired by seed (training questions
    differ between seeds, so the spread over seeds holds all the noise)."""
    totals = {run.key: sum(run.local_reward) for run in runs}
    out: dict[str, Any] = {"per_run": totals}
    base = statistics.fmean(totals[k] for k in totals if k.startswith(f"{baseline}/"))
    for setting in sorted({run.curve.setting for run in runs}):
        seeds = sorted(run.curve.seed for run in runs if run.curve.setting == setting)
        mean = t_over_seeds([totals[f"{setting}/seed-{s}"] for s in seeds])
        entry: dict[str, Any] = {"mean": mean.to_json(), "gain_vs_baseline": mean.value / base - 1}
        if setting != baseline:
            paired = [
                totals[f"{setting}/seed-{s}"] - totals[f"{baseline}/seed-{s}"]
                for s in seeds
                if f"{baseline}/seed-{s}" in totals
            ]
            entry["minus_baseline"] = t_over_seeds(paired).to_json() if paired else None
        out[setting] = entry
    return out


def setting_sharing(runs: Sequence[RunCompute], setting: str) -> Counter:
    """What sharing carried in a setting's runs, summed over seeds and peers."""
    total: Counter = Counter()
    for run in runs:
        if run.curve.setting == setting:
            total.update(run.sharing)
    return total


def _ci(result: dict[str, float] | None, digits: int = 3, signed: bool = True) -> str:
    if result is None:
        return "-"
    sign = "+" if signed else ""
    if result["se"] != result["se"]:
        return f"{result['value']:{sign}.{digits}f} (one run)"
    return (
        f"{result['value']:{sign}.{digits}f} ± {result['se']:.{digits}f} (95 % CI {result['ci_low']:{sign}.{digits}f} "
        f"to {result['ci_high']:{sign}.{digits}f})"
    )


def _both(result: dict[str, Any]) -> str:
    """Two table cells: the mean over seeds with the seeds-and-questions interval, and the plain t-interval."""
    if "over_seeds" not in result:
        return f"{_ci(result['per_seed'][0]) if result['per_seed'] else '-'} (one seed) | -"
    plain = result["t_over_seeds"]
    return f"{_ci(result['over_seeds'])} | {plain['ci_low']:+.3f} to {plain['ci_high']:+.3f}"


def markdown(profile: str, runs: Sequence[RunCompute], data: dict[str, Any], baseline: str, code: str) -> str:
    """The report page."""
    label = paper_label
    has_alone = bool(runs[0].axes["alone_seconds"])
    questions = sorted({run.curve.questions for run in runs})
    gaps = sorted({b - a for run in runs for a, b in zip(run.curve.steps, run.curve.steps[1:], strict=False)})
    spacing = f"{gaps[0]}-{gaps[-1]}" if gaps and gaps[0] != gaps[-1] else "".join(map(str, gaps[:1]))
    lines = [
        f"# Sharing per unit of compute: SAPO table, profile `{profile}`",
        "",
        f"Command: `python -m benchmarks.compute_report --profile {profile}`  ",
        f"Report code: `{code}`; it reads the archived runs only (their own commits below).",
        "",
        f"Held-out pass@1 (greedy, the same {'/'.join(map(str, questions))} questions for every peer, step, run) and "
        "the paper's cumulative reward "
        "of the archived runs, per step and per unit of compute. Every ± is one standard error and every interval "
        "is 95 %; how they are computed: the docstrings of benchmarks/compute_report.py and benchmarks/stats.py.",
        "",
        "## Runs, compute and the machine",
        "",
        "| I/J (paper) | seed | commit | machine | own completions / peer | measured s / step (median) | generation "
        "s | update s | slowdown vs lone run | s / step alone (modelled) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        steps = len(run.own_completions) - 1
        alone = f"{run.axes['alone_seconds'][-1] / steps:.1f}" if has_alone else "-"
        lines.append(
            f"| {label(run.curve.setting)} | {run.curve.seed} | {run.curve.commit} | "
            f"{'alone' if run.machine.get('alone') else 'shared'}: {run.machine.get('note', '')} | "
            f"{run.own_completions[-1]:.0f} | {run.measured_seconds[-1] / steps:.1f} | {run.generation_seconds:.1f} | "
            f"{run.update_seconds:.1f} | {run.slowdown:.2f} | {alone} |"
        )
    shared = [run.key for run in runs if not run.machine.get("alone")]
    lines += [
        "",
        f"Only {', '.join(r.key for r in runs if r.machine.get('alone')) or 'no run'} had the machine alone; "
        f"{len(shared)} of {len(runs)} runs shared it with other work, so their measured step times are not "
        "comparable. The modelled seconds put every run at the lone run's speed (module docstring); they rest on one "
        "lone run and on the assumption that sharing slowed generation and the update alike.",
        "",
        f"## Held-out pass@1 at the same budget (each setting minus {label(baseline)}, paired by seed)",
        "",
        "| budget | I/J (paper) | difference, mean over seeds (seeds and questions) | plain t over seeds | per seed |",
        "|---|---|---|---|---|",
    ]
    for axis in AXES:
        matched = data["matched"].get(axis)
        if not matched:
            continue
        for setting, result in matched.items():
            if setting == "budget":
                continue
            per_seed = ", ".join(f"{row['value']:+.3f}" for row in result["per_seed"])
            lines.append(
                f"| {matched['budget']:.0f} {AXIS_LABELS[axis]} | {label(setting)} | {_both(result)} | {per_seed} |"
            )
    gains = data["gain_per_completions"]
    lines += [
        "",
        f"## Held-out gain per {gains['per']:.0f} own completions (end minus start, over the run)",
        "",
        "| I/J (paper) | mean over seeds (seeds and questions) | plain t over seeds | minus the baseline, paired by "
        "seed (seeds and questions) | plain t over seeds |",
        "|---|---|---|---|---|",
    ]
    for setting in sorted({run.curve.setting for run in runs}, key=lambda s: -int(s.split("-")[0])):
        minus = gains[setting].get("minus_baseline")
        lines.append(f"| {label(setting)} | {_both(gains[setting]['mean'])} | {_both(minus) if minus else '- | -'} |")
    lines += [
        "",
        "## Time to accuracy: where the held-out curve first reaches a level",
        "",
        "| level | I/J (paper) | runs that reach it | steps | own completions | seconds alone (modelled) |",
        "|---|---|---|---|---|---|",
    ]
    if not data["time_to_accuracy"]:
        lines.append(
            f"| - | - | - | - | - | - |\n\n{label(baseline)} ends at or below its start on average (no gain): there "
            "is no level above the start to time."
        )
    for level, by_setting in data["time_to_accuracy"].items():
        for setting, entry in by_setting.items():
            cells = []
            for axis in AXES:
                if axis not in entry:
                    cells.append("-")
                    continue
                result = entry[axis]
                cells.append(_ci(result["mean"], digits=0 if axis != "steps" else 1, signed=False))
            lines.append(
                f"| {level} | {label(setting)} | {entry['steps']['reached']} of {entry['runs']} | "
                + " | ".join(cells)
                + " |"
            )
    reward = data["cumulative_reward"]
    lines += [
        "",
        "Levels: the start plus half of 8/0's mean gain, and 8/0's mean final level. Runs that never reach a level are "
        "left out of its mean (the count says how many reached it); a time is interpolated between evaluations "
        f"{spacing} steps apart, so it "
        "is coarse.",
        "",
        "## The paper's metric: cumulative reward per step",
        "",
        "Sum over peers and steps of each peer's mean reward on its own completions (`sapo/local_reward`).",
        "",
        "| I/J (paper) | cumulative reward, mean over seeds | gain vs baseline | minus the baseline, paired by seed |",
        "|---|---|---|---|",
    ]
    for setting in sorted({run.curve.setting for run in runs}, key=lambda s: -int(s.split("-")[0])):
        entry = reward[setting]
        lines.append(
            f"| {label(setting)} | {_ci(entry['mean'], 2, False)} | {entry['gain_vs_baseline']:+.0%} | "
            f"{_ci(entry.get('minus_baseline'), 2)} |"
        )
    lines += ["", "## What sharing carried (the nodes' group logs, summed over seeds and peers)", ""]
    lines += sharing_lines([(label(s), setting_sharing(runs, s)) for s in sorted({r.curve.setting for r in runs})])
    commits = sorted({run.curve.commit for run in runs})
    lines += [
        "",
        "## Caveats",
        "",
        f"- The runs ran on {len(commits)} commit(s) ({', '.join(commits)}); a figure mixes them.",
        "- Held-out differences are paired by question where both runs archived per-question outcomes (cpu-hard on), "
        "else they combine the two sides' errors as if independent (an upper bound). Over seeds, *seeds and "
        "questions* is `benchmarks.stats.seeds_and_questions` (its coverage: `results/interval_coverage.md`); the "
        "plain t-interval over the per-seed figures, which treats the questions as fixed, is beside it.",
        f"- Time to accuracy rests on evaluations {spacing} steps apart and on the modelled seconds; a t-interval "
        "over 2 or 3 seeds (t = 4.30 for 2 degrees of freedom) is wide and may extend below zero.",
        "",
        f"![curves](sapo_table_{profile}_compute.png)",
        "",
    ]
    return "\n".join(lines)


def plot(runs: Sequence[RunCompute], path: Path, profile: str) -> None:
    """Held-out pass@1 against each axis and the cumulative reward against steps; thin lines per run, thick per
    setting's mean over seeds (at the runs' mean axis positions)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings = sorted({run.curve.setting for run in runs}, key=lambda s: -int(s.split("-")[0]))
    colours = {setting: f"C{i}" for i, setting in enumerate(settings)}
    axes_shown = [axis for axis in AXES if runs[0].axes[axis]]
    figure, panels = plt.subplots(1, len(axes_shown) + 1, figsize=(5 * (len(axes_shown) + 1), 4.2))
    for panel, axis in zip(panels, axes_shown, strict=False):
        for setting in settings:
            mine = [run for run in runs if run.curve.setting == setting]
            for run in mine:
                panel.plot(run.at_evaluations(axis), run.curve.pass_at_1, color=colours[setting], alpha=0.3, lw=0.8)
            common = sorted(set.intersection(*(set(run.curve.steps) for run in mine)))
            xs = [statistics.fmean(run.axes[axis][s] for run in mine) for s in common]
            ys = [statistics.fmean(run.curve.pass_at_1[run.curve.steps.index(s)] for run in mine) for s in common]
            panel.plot(xs, ys, color=colours[setting], lw=2.2, marker="o", label=paper_label(setting))
        panel.set_xlabel(AXIS_LABELS[axis])
        panel.set_ylabel("held-out pass@1 (mean over peers)")
        panel.grid(alpha=0.3)
    reward_panel = panels[-1]
    for setting in settings:
        for run in (r for r in runs if r.curve.setting == setting):
            totals = [0.0]
            for value in run.local_reward:
                totals.append(totals[-1] + value)
            reward_panel.plot(range(len(totals)), totals, color=colours[setting], alpha=0.6, lw=1)
        reward_panel.plot([], [], color=colours[setting], label=paper_label(setting))
    reward_panel.set_xlabel("step")
    reward_panel.set_ylabel("cumulative reward (sum over peers)")
    reward_panel.grid(alpha=0.3)
    reward_panel.legend(fontsize=8)
    panels[0].legend(fontsize=8)
    figure.suptitle(f"Profile {profile}: per step and per unit of compute (thin: one run; thick: mean over seeds)")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Read the archives of ``--profile``; write sapo_table_<profile>_compute.{md,json,png} and print the page."""
    args = archive_arguments("benchmarks.compute_report", __doc__).parse_args(argv)
    code = commit_label()  # before the outputs change the tree
    results = Path(args.results_dir)
    archive = results / "sapo_table_runs" / args.profile
    runs = read_runs(archive)
    if not runs or not any(run.curve.setting == args.baseline for run in runs):
        raise SystemExit(f"compute_report: no complete {args.baseline} run archived under {archive}")
    base = [run for run in runs if run.curve.setting == args.baseline]
    start = statistics.fmean(run.curve.pass_at_1[0] for run in base)
    end = statistics.fmean(run.curve.pass_at_1[-1] for run in base)
    data: dict[str, Any] = {
        "profile": args.profile,
        "code": code,
        "runs": [
            {
                "run": run.key,
                "commit": run.curve.commit,
                "machine": run.machine,
                "steps_evaluated": run.curve.steps,
                "pass_at_1": run.curve.pass_at_1,
                "standard_error": run.curve.standard_error,
                "own_completions": run.own_completions,
                "measured_seconds": run.measured_seconds,
                "alone_seconds": run.axes["alone_seconds"],
                "generation_seconds_median": run.generation_seconds,
                "update_seconds_median": run.update_seconds,
                "slowdown": run.slowdown,
                "local_reward_per_step": run.local_reward,
                "sharing": dict(run.sharing),
            }
            for run in runs
        ],
        "matched": {axis: matched_comparison(runs, args.baseline, axis) for axis in AXES if runs[0].axes[axis]},
        "gain_per_completions": gain_per_completions(runs, args.baseline),
        # a baseline that did not gain leaves no level above the start: every run would "reach" it at step 0
        "time_to_accuracy": time_to_accuracy(runs, [round(start + (end - start) / 2, 3), round(end, 3)])
        if end > start
        else {},
        "cumulative_reward": cumulative_reward(runs, args.baseline),
        "t_975": {str(df): t_quantile(0.975, df) for df in (2, 63)},
    }
    stem = f"sapo_table_{args.profile}_compute"
    plot(runs, results / f"{stem}.png", args.profile)
    page = markdown(args.profile, runs, data, args.baseline, code)
    (results / f"{stem}.md").write_text(page)
    (results / f"{stem}.json").write_text(json.dumps(data, indent=1) + "\n")
    print(page)
    return data


if __name__ == "__main__":
    main()
