"""Held-out pass@1 of sapo_table's archived runs: start and end per setting and seed, differences with 95 %
intervals, and the curves.

sapo_table.py ranks settings by the reward of the peers' own completions; this page answers the question that
matters more, on questions training never draws: did the peers of one setting end up solving more held-out
questions than those of another? It reads the archives only (``benchmarks/results/sapo_table_runs/<profile>/``),
so it runs in seconds and starts nothing.

    python -m benchmarks.held_out_table --profile cpu-learn

Statistics (:mod:`benchmarks.stats`): every peer of every run answers the same held-out questions greedily. Where a
run's archive holds every node's per-question outcomes (``held_out.jsonl``, archived since the cpu-hard profile),
the figures are exact:

- a run's figure at a step is the mean over peers and questions, its error clustered by question
  (:func:`benchmarks.stats.clustered_mean`);
- a run's change and a same-seed difference between settings are paired by question
  (:func:`benchmarks.stats.paired_difference`): both sides answered the same questions, so the luck of the draw of
  questions cancels.

Older archives keep each node's pass@1 and its binomial standard error only. Then:

- A run's figure is the mean over its peers; its error is the mean of the peers' errors
  (:func:`benchmarks.stats.mean_over_peers`), exact when the peers answer alike (step 0: all peers are the base
  model) and an upper bound otherwise. The former formula, ``sqrt(sum se_i^2) / peers``, treated the peers as
  independent and halved the step-0 error of 4 identical peers (0.018 instead of 0.037).
- A same-seed difference between settings combines the two runs' errors as if independent
  (:func:`benchmarks.stats.unpaired_difference`): the pairing by question cannot be used without per-question
  outcomes, and ignoring it is conservative as long as the two settings do not answer the shared questions in
  opposite ways.

Over seeds, a setting's difference from the baseline (same seed) and a setting's change (end minus start) are
seeds x questions tables: :func:`benchmarks.stats.seeds_and_questions` gives their mean an interval that holds
whether the seeds or the questions dominate (seed and question terms, each at its own t quantile; its coverage:
``python -m benchmarks.interval_coverage``); where a run lacks per-question outcomes the question term is bounded by
the per-seed errors (:func:`benchmarks.stats.seeds_and_questions_bounded`). The plain t-interval over the per-seed
figures (:func:`benchmarks.stats.t_over_seeds`), which treats the questions as fixed, is printed beside it. A change
whose interval holds zero is reported as no learning.

Every difference is stated with its 95 % interval.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.harness import ROOT, commit_label
from benchmarks.results_archive import resolved, restored
from benchmarks.stats import (
    Estimate,
    clustered_mean,
    mean_over_peers,
    paired_difference,
    seeds_and_questions,
    seeds_and_questions_bounded,
    t_over_seeds,
    unpaired_difference,
)
from sapo.jsonl_files import read_jsonl
from sapo.node.report import is_evaluation_line

RESULTS = ROOT / "benchmarks" / "results"
PAPER_GROUPS_PER_STEP = 8  # the paper's I + J


@dataclass(frozen=True)
class RunCurve:
    """One archived run's held-out curve: mean pass@1 over its peers at each evaluated step, and its error (the
    bound of :func:`benchmarks.stats.mean_over_peers`)."""

    setting: str  # "I-J" as run
    seed: int
    steps: list[int]
    pass_at_1: list[float]
    standard_error: list[float]
    peers: int
    commit: str
    questions: int
    # per evaluated step, outcomes[peer][question] (1.0 correct), where every node archived them
    outcomes: dict[int, list[list[float]]] = field(default_factory=dict)
    question_tasks: list[str] = field(default_factory=list)  # the task of each question, in question order
    # specialists profiles: the one task each peer trains on (peer i takes the i-th task); None: every peer the mix
    peer_tasks: list[str] | None = None

    def estimate(self, position: int) -> Estimate:
        """The figure at the ``position``-th evaluation (``-1``: the last) with its error."""
        return Estimate(self.pass_at_1[position], self.standard_error[position], self.questions - 1)

    def outcomes_at(self, position: int) -> list[list[float]] | None:
        """The per-question outcomes at the ``position``-th evaluation, or None where they were not archived."""
        return self.outcomes.get(self.steps[position])

    def question_means(self, position: int) -> list[float] | None:
        """Per question, the mean outcome over the run's peers at the ``position``-th evaluation (None where the
        outcomes were not archived)."""
        outcomes = self.outcomes_at(position)
        return None if outcomes is None else [sum(column) / len(column) for column in zip(*outcomes, strict=True)]

    def by_training_task(self, position: int, own: bool) -> list[float] | None:
        """Per question, the mean outcome over the peers that train on its task (``own``) or do not (others'):
        a specialist's own task against the tasks only the swarm's other peers train on. None where the run has
        no specialists or no per-question outcomes at that evaluation."""
        outcomes = self.outcomes_at(position)
        if outcomes is None or self.peer_tasks is None or not self.question_tasks:
            return None
        values = []
        for question, task in enumerate(self.question_tasks):
            peers = [peer for peer, trained in enumerate(self.peer_tasks) if (trained == task) == own]
            if not peers:
                return None
            values.append(sum(outcomes[peer][question] for peer in peers) / len(peers))
        return values

    def change(self) -> Estimate:
        """End minus start of this run: paired by question where the outcomes were archived, else unpaired
        (conservative)."""
        return difference(self.outcomes_at(-1), self.outcomes_at(0), self.estimate(-1), self.estimate(0))


def difference(
    after: list[list[float]] | None,
    before: list[list[float]] | None,
    after_estimate: Estimate,
    before_estimate: Estimate,
) -> Estimate:
    """``after - before``: paired by question when both sides' outcomes are known on the same questions, else from
    the two estimates as if independent (conservative)."""
    if after is not None and before is not None and len(after[0]) == len(before[0]):
        return paired_difference(after, before)
    return unpaired_difference(after_estimate, before_estimate)


def outcomes_by_step(held_out: Path) -> dict[int, list[float]]:
    """One node's per-question outcomes (1.0 correct, ordered by question index) by evaluated step; a step evaluated
    twice (a resumed run) keeps its last line."""
    by_step: dict[int, list[float]] = {}
    for row in read_jsonl(resolved(held_out)):  # its rotated files first
        questions = sorted(row["questions"], key=lambda q: q["index"])
        by_step[int(row["step"])] = [1.0 if q["correct"] else 0.0 for q in questions]
    return by_step


def question_tasks(held_out: Path) -> list[str]:
    """The task of each question (ordered by question index) in a node's first held-out line."""
    for row in read_jsonl(resolved(held_out)):
        return [q["task"] for q in sorted(row["questions"], key=lambda q: q["index"])]
    return []


def paper_label(setting: str) -> str:
    """``"1-1"`` -> ``"4/4 (run as 1/1)"``: the paper's I/J for a setting scaled down to fewer groups per step
    (``"1-1-replay"``, J filled by self-replay: ``"4/4r (run as 1/1, self-replay)"``)."""
    replay = setting.endswith("-replay")
    local, external = (int(x) for x in setting.removesuffix("-replay").split("-"))
    scale = PAPER_GROUPS_PER_STEP // max(1, local + external)
    label = f"{local * scale}/{external * scale}{'r' if replay else ''} (run as {local}/{external}"
    return label + (", self-replay)" if replay else ")")


def evaluations_by_step(metrics: Path) -> dict[int, dict[str, float]]:
    """A node's evaluation lines by step; a step evaluated twice (a resumed run) keeps its last line."""
    by_step: dict[int, dict[str, float]] = {}
    for line in metrics.read_text().splitlines():
        row = json.loads(line)
        if is_evaluation_line(row):
            by_step[int(row["step"])] = row
    return by_step


def read_run(run_dir: Path) -> RunCurve | None:
    """The held-out curve of one archived run, or None if it is not complete (no completion marker); files packed
    into ``results/archive`` are read from there."""
    marker_path = run_dir / "run-complete.json"
    if not marker_path.exists():
        return None
    marker = json.loads(marker_path.read_text())
    node_dirs = sorted(path.parent for path in restored(run_dir).glob("node-*/metrics.jsonl"))
    nodes = [evaluations_by_step(node / "metrics.jsonl") for node in node_dirs]
    common = sorted(set.intersection(*(set(node) for node in nodes))) if nodes else []
    archived = [outcomes_by_step(node / "held_out.jsonl") for node in node_dirs if (node / "held_out.jsonl").exists()]
    means, errors, questions, outcomes = [], [], 0, {}
    for step in common:
        questions = int(min(node[step]["eval/questions"] for node in nodes))
        matrix = [node[step] for node in archived if step in node]
        if len(matrix) == len(nodes) and all(len(row) == questions for row in matrix):
            outcomes[step] = matrix
            estimate = clustered_mean(matrix)
        else:
            estimate = mean_over_peers(
                [node[step]["eval/pass@1"] for node in nodes],
                [node[step]["eval/pass@1_se"] for node in nodes],
                questions,
            )
        means.append(estimate.value)
        errors.append(estimate.se)
    code = marker.get("code") or {}
    commit = str(code.get("commit", "?"))[:10] + (" (dirty)" if code.get("dirty") else "")
    identity = marker.get("identity") or {}
    peer_tasks = None
    if identity.get("specialists") and identity.get("tasks"):  # sapo_table gives node i the i-th task's config
        names = [task["name"] for task in identity["tasks"]]
        peer_tasks = [names[i % len(names)] for i in range(len(nodes))]
    held_out = [node / "held_out.jsonl" for node in node_dirs if (node / "held_out.jsonl").exists()]
    return RunCurve(
        setting=run_dir.parent.name,
        seed=int(run_dir.name.split("-")[1]),
        steps=common,
        pass_at_1=means,
        standard_error=errors,
        peers=len(nodes),
        commit=commit,
        questions=questions,
        outcomes=outcomes,
        question_tasks=question_tasks(held_out[0]) if held_out else [],
        peer_tasks=peer_tasks,
    )


def read_profile(archive: Path) -> list[RunCurve]:
    """Every complete run archived for one profile, ordered by setting (most local first) and seed."""
    runs = [read_run(path) for path in sorted(archive.glob("*-*/seed-*"))]
    complete = [run for run in runs if run is not None and run.steps]
    return sorted(complete, key=lambda r: (-int(r.setting.split("-")[0]), r.seed))


def compare(runs: Sequence[RunCurve], baseline: str) -> dict[str, Any]:
    """Per setting: each seed's end-minus-baseline difference (same seed) with its error, and the mean over seeds
    (:func:`over_seeds`)."""
    base = {run.seed: run for run in runs if run.setting == baseline}
    out: dict[str, Any] = {}
    for setting in sorted({run.setting for run in runs if run.setting != baseline}):
        pairs = [(run, base[run.seed]) for run in runs if run.setting == setting and run.seed in base]
        per_seed = {
            run.seed: difference(run.outcomes_at(-1), other.outcomes_at(-1), run.estimate(-1), other.estimate(-1))
            for run, other in pairs
        }
        tables = {
            run.seed: question_differences(run.question_means(-1), other.question_means(-1)) for run, other in pairs
        }
        out[setting] = over_seeds(per_seed, tables)
    return out


def compare_changes(runs: Sequence[RunCurve]) -> dict[str, Any]:
    """Per setting: each run's change (end minus start) and the mean change over its seeds (:func:`over_seeds`)."""
    out: dict[str, Any] = {}
    for setting in sorted({run.setting for run in runs}, key=lambda s: -int(s.split("-")[0])):
        mine = [run for run in runs if run.setting == setting]
        tables = {run.seed: question_differences(run.question_means(-1), run.question_means(0)) for run in mine}
        out[setting] = over_seeds({run.seed: run.change() for run in mine}, tables)
    return out


def question_differences(after: list[float] | None, before: list[float] | None) -> list[float] | None:
    """Per question, ``after - before`` (None when a side is missing)."""
    if after is None or before is None or len(after) != len(before):
        return None
    return [a - b for a, b in zip(after, before, strict=True)]


def over_seeds(per_seed: dict[int, Estimate], tables: dict[int, list[float] | None]) -> dict[str, Any]:
    """Per-seed figures as report rows, and (from two seeds on) their mean over seeds: from the seeds x questions
    table where every seed has its per-question values (``tables``), else from the per-seed errors (the question
    term bounded); the plain t-interval over seeds beside it."""
    rows = [{"seed": seed, "difference": e.value, "z": e.z(), **e.to_json()} for seed, e in per_seed.items()]
    result: dict[str, Any] = {"per_seed": rows, "seeds": len(rows)}
    if len(rows) < 2:
        return result
    values = [tables.get(seed) for seed in per_seed]
    paired = all(v is not None for v in values)
    estimate = seeds_and_questions(values) if paired else seeds_and_questions_bounded(list(per_seed.values()))
    result["over_seeds"] = estimate.to_json()
    result["paired_by_question"] = paired
    result["t_over_seeds"] = t_over_seeds([e.value for e in per_seed.values()]).to_json()
    return result


def compare_by_training_task(runs: Sequence[RunCurve], baseline: str) -> dict[str, Any]:
    """For specialists: per setting and for the peers' own task and the others' tasks, each run's change (end minus
    start, paired by question), its mean over seeds, each seed's end-minus-baseline difference (same seed, paired by
    question) and the mean over seeds. Empty when no run has specialists with per-question outcomes."""
    base = {run.seed: run for run in runs if run.setting == baseline}
    out: dict[str, Any] = {}
    for which, own in (("own task", True), ("others' tasks", False)):
        changes, change_over_seeds = [], {}
        for setting in sorted({run.setting for run in runs}, key=lambda s: -int(s.split("-")[0])):
            per_seed, tables = {}, {}
            for run in (r for r in runs if r.setting == setting):
                end, start = run.by_training_task(-1, own), run.by_training_task(0, own)
                if end is None or start is None:
                    continue
                per_seed[run.seed] = paired_difference([end], [start])
                tables[run.seed] = question_differences(end, start)
                changes.append({"setting": run.setting, "seed": run.seed, "start": sum(start) / len(start),
                                "end": sum(end) / len(end), **per_seed[run.seed].to_json()})  # fmt: skip
            if per_seed:
                change_over_seeds[setting] = over_seeds(per_seed, tables)
        if not changes:
            continue
        versus: dict[str, Any] = {}
        for setting in sorted({run.setting for run in runs if run.setting != baseline}):
            per_seed, tables = {}, {}
            for run in runs:
                if run.setting != setting or run.seed not in base:
                    continue
                end, base_end = run.by_training_task(-1, own), base[run.seed].by_training_task(-1, own)
                if end is not None and base_end is not None:
                    per_seed[run.seed] = paired_difference([end], [base_end])
                    tables[run.seed] = question_differences(end, base_end)
            versus[setting] = over_seeds(per_seed, tables)
        out[which] = {"changes": changes, "changes_over_seeds": change_over_seeds, "versus_baseline": versus}
    return out


def training_task_lines(split: dict[str, Any], baseline: str) -> list[str]:
    """The specialists' section of the page (empty without specialists)."""
    if not split:
        return []
    lines = ["", "## Specialists: the task a peer trains on, and the tasks only the others train on", "",
             "Each peer trains on one task of the mix and is evaluated on all of them. *Own task*: per question, the "
             "peers that train on its task; *others' tasks*: the peers that do not, which alone (8/0) never see a "
             "question of it, and with sharing only through the swarm's groups. Paired by question.", "",
             "| part | I/J (paper) | seed | start | end | change (95 % CI) |", "|---|---|---|---|---|---|"]  # fmt: skip
    for which, result in split.items():
        for row in result["changes"]:
            change = f"{row['value']:+.3f} ({row['ci_low']:+.3f} to {row['ci_high']:+.3f})"
            lines.append(f"| {which} | {paper_label(row['setting'])} | {row['seed']} | {row['start']:.3f} | "
                         f"{row['end']:.3f} | {change} |")  # fmt: skip
    lines.append("")
    for which, result in split.items():
        for setting, changes in result["changes_over_seeds"].items():
            if changes["seeds"] > 1:
                lines.append(f"- {which}, {paper_label(setting)}, change over {changes['seeds']} seeds: "
                             f"{over_seeds_text(changes)}: {verdict(changes, 'change')}")  # fmt: skip
        for setting, versus in result["versus_baseline"].items():
            for row in versus["per_seed"]:
                lines.append(f"- {which}, {paper_label(setting)} minus {paper_label(baseline)}, seed {row['seed']}: "
                             f"{_interval(row)}")  # fmt: skip
            if versus["seeds"] > 1:
                lines.append(f"- **{which}, {paper_label(setting)} minus {paper_label(baseline)}, mean over "
                             f"{versus['seeds']} seeds: {over_seeds_text(versus)}**: "
                             f"{verdict(versus, 'difference')}")  # fmt: skip
    return lines


def over_seeds_text(result: dict[str, Any]) -> str:
    """``"+0.015 ± 0.021 (95 % CI -0.070 to +0.100; seed term ± 0.019 on 2 df, question term ± 0.009 on 127 df;
    plain t over seeds -0.068 to +0.098)"``: the mean over seeds of :func:`over_seeds` with both intervals."""
    both, plain = result["over_seeds"], result["t_over_seeds"]
    (seed_term, seed_df), (question_term, question_df) = ((t["variance"], t["df"]) for t in both["terms"])
    question = (
        f"question term ± {question_term**0.5:.3f} on {question_df:.0f} df"
        if result["paired_by_question"]
        else f"question term ± {question_term**0.5:.3f}, bounded by the per-seed errors"
    )
    return (
        f"{both['value']:+.3f} ± {both['se']:.3f} (95 % CI {both['ci_low']:+.3f} to {both['ci_high']:+.3f}; seed "
        f"term ± {seed_term**0.5:.3f} on {seed_df:.0f} df, {question}; plain t over seeds {plain['ci_low']:+.3f} to "
        f"{plain['ci_high']:+.3f})"
    )


def verdict(result: dict[str, Any], kind: str) -> str:
    """What the interval over seeds says: of a ``"change"`` (learning) or a ``"difference"`` (between settings)."""
    low, high = result["over_seeds"]["ci_low"], result["over_seeds"]["ci_high"]
    if low > 0:
        return "learning resolved over seeds" if kind == "change" else "a gain resolved"
    if high < 0:
        return "a loss resolved over seeds" if kind == "change" else "a loss resolved"
    if kind == "change":
        return "no learning resolved over seeds"
    return f"no difference resolved (a gain above {high:+.3f} and a loss below {low:+.3f} excluded)"


def _interval(result: dict[str, float]) -> str:
    return f"{result['value']:+.3f} ± {result['se']:.3f} (95 % CI {result['ci_low']:+.3f} to {result['ci_high']:+.3f})"


def markdown(
    profile: str,
    runs: Sequence[RunCurve],
    comparison: dict[str, Any],
    baseline: str,
    plot: str,
    code: str,
    split: dict[str, Any] | None = None,
    changes: dict[str, Any] | None = None,
) -> str:
    """The report page; ``code`` names the commit the report ran on (taken before any output is written)."""
    lines = [
        f"# Held-out pass@1 of the SAPO table, profile `{profile}`",
        "",
        f"Command: `python -m benchmarks.held_out_table --profile {profile}`  ",
        f"Report code: `{code}`; each run's own commit is in the table.",
        "",
        "Greedy pass@1 on held-out questions (task seeds training never draws; the same questions for every peer, "
        "step, setting and seed), mean over each run's peers; ± is one standard error: clustered by question where the "
        "run archived per-question outcomes, else bounded by the mean of the peers' errors (exact at step 0, where "
        "all peers are the base model; module docstring of benchmarks/held_out_table.py). Change: end minus start "
        "with its 95 % interval.",
        "",
        "| I/J (paper) | seed | peers | questions | start | end | change (95 % CI) | run's commit |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        change = run.change()
        low, high = change.interval()
        lines.append(
            f"| {paper_label(run.setting)} | {run.seed} | {run.peers} | {run.questions} | {run.pass_at_1[0]:.3f} ± "
            f"{run.standard_error[0]:.3f} | {run.pass_at_1[-1]:.3f} ± {run.standard_error[-1]:.3f} | "
            f"{change.value:+.3f} ({low:+.3f} to {high:+.3f}) | {run.commit} |"
        )
    lines += ["", f"## End of training: each setting minus {paper_label(baseline)}, same seed", ""]
    for setting, result in comparison.items():
        for row in result["per_seed"]:
            lines.append(
                f"- {paper_label(setting)}, seed {row['seed']}: {_interval(row)}, {row['z']:+.1f} standard errors"
            )
        if result["seeds"] < 2:
            lines.append(f"- {paper_label(setting)}: one seed, no interval over seeds")
            continue
        lines.append(
            f"- **{paper_label(setting)}, mean over {result['seeds']} seeds: {over_seeds_text(result)}**: "
            f"{verdict(result, 'difference')}."
        )
    lines += ["", "## Learning: each setting's change (end minus start) over its seeds", ""]
    for setting, result in (changes or {}).items():
        if result["seeds"] > 1:
            lines.append(
                f"- {paper_label(setting)}, over {result['seeds']} seeds: {over_seeds_text(result)}: "
                f"{verdict(result, 'change')}."
            )
    lines += [
        "",
        "Over seeds: `benchmarks.stats.seeds_and_questions` on the seeds x questions table (seed and question terms, "
        "each at its own t quantile; its coverage: `results/interval_coverage.md`), the question term bounded by "
        "the per-seed errors where a run archived no per-question outcomes; the plain t-interval over the per-seed "
        "figures beside it.",
    ]
    lines += training_task_lines(split or {}, baseline)
    paired = all(run.outcomes_at(0) is not None and run.outcomes_at(-1) is not None for run in runs)
    lines += [
        "",
        "Every run archived its per-question outcomes: figures are clustered by question and every change and "
        "difference is paired by question (benchmarks.stats.paired_difference)."
        if paired
        else "Some runs' archives hold no per-question outcomes: their intervals combine the two sides' errors as if "
        "independent (conservative, and wide); runs with outcomes are clustered and paired by question.",
        "",
        f"![held-out curves]({plot})",
        "",
    ]
    return "\n".join(lines)


SEED_STYLES = [("o", "-"), ("s", "--"), ("^", ":"), ("D", "-.")]
"""(marker, line style) of a seed's curves, so that the seeds of one setting can be told apart."""


def plot_curves(runs: Sequence[RunCurve], path: Path, profile: str) -> None:
    """Held-out pass@1 against step: one line per run, a colour per setting, a line style and marker per seed, a band
    of one standard error."""
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
        style = SEED_STYLES[run.seed % len(SEED_STYLES)]
        axis.plot(run.steps, run.pass_at_1, marker=style[0], linestyle=style[1], color=colour, label=label)
        axis.fill_between(run.steps, low, high, color=colour, alpha=0.12)
    axis.set_xlabel("step")
    axis.set_ylabel("held-out pass@1 (mean over peers)")
    axis.set_title(f"Held-out pass@1, profile {profile} (band: one standard error, bounded)")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def archive_arguments(module: str, doc: str) -> argparse.ArgumentParser:
    """The command line of a report over sapo_table's archived runs (profile, baseline, results directory)."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=doc.split("\n")[0])
    parser.add_argument("--profile", default="cpu-learn", help="sapo_table profile whose archived runs to read")
    parser.add_argument("--baseline", default="2-0", help="setting compared against, as run (I-J)")
    parser.add_argument("--results-dir", default=str(RESULTS), help="where the archives are and the outputs go")
    return parser


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Read the archives of ``--profile``, write sapo_table_<profile>_held_out.{md,json,png} and print the page."""
    args = archive_arguments("benchmarks.held_out_table", __doc__).parse_args(argv)
    results = Path(args.results_dir)
    archive = results / "sapo_table_runs" / args.profile
    code = commit_label()  # before the outputs change the tree
    runs = read_profile(archive)
    if not runs:
        raise SystemExit(f"held_out_table: no complete run archived under {archive}; run benchmarks/sapo_table.py")
    comparison = compare(runs, args.baseline)
    split = compare_by_training_task(runs, args.baseline)
    changes = compare_changes(runs)
    stem = f"sapo_table_{args.profile}_held_out"
    plot_curves(runs, results / f"{stem}.png", args.profile)
    page = markdown(args.profile, runs, comparison, args.baseline, f"{stem}.png", code, split, changes)
    (results / f"{stem}.md").write_text(page)
    # the outcomes stay in the archives; the page's JSON says which steps had them
    listed = [{k: v for k, v in vars(run).items() if k != "outcomes"} for run in runs]
    data = {
        "runs": [{**row, "steps_with_outcomes": sorted(run.outcomes)} for row, run in zip(listed, runs, strict=True)],
        "comparison": comparison,
        "changes": changes,
        "by_training_task": split,
    }
    (results / f"{stem}.json").write_text(json.dumps(data, indent=1) + "\n")
    print(page)
    return data


if __name__ == "__main__":
    main()
