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
- Over seeds (:func:`benchmarks.stats.over_seeds`), the mean difference gets a t-interval whose variance is the
  spread over seeds plus the question-sampling error the seeds share (the same questions in every seed).

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
from benchmarks.stats import (
    Estimate,
    clustered_mean,
    mean_over_peers,
    over_seeds,
    paired_difference,
    unpaired_difference,
)
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
    for line in held_out.read_text().splitlines():
        row = json.loads(line)
        questions = sorted(row["questions"], key=lambda q: q["index"])
        by_step[int(row["step"])] = [1.0 if q["correct"] else 0.0 for q in questions]
    return by_step


def question_tasks(held_out: Path) -> list[str]:
    """The task of each question (ordered by question index) in a node's first held-out line."""
    for line in held_out.read_text().splitlines():
        return [q["task"] for q in sorted(json.loads(line)["questions"], key=lambda q: q["index"])]
    return []


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
    node_dirs = sorted(path.parent for path in run_dir.glob("node-*/metrics.jsonl"))
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
    with an interval that includes the shared question-sampling error (also given without it, for comparison)."""
    base = {run.seed: run for run in runs if run.setting == baseline}
    out: dict[str, Any] = {}
    for setting in sorted({run.setting for run in runs if run.setting != baseline}):
        per_seed = {
            run.seed: difference(
                run.outcomes_at(-1), base[run.seed].outcomes_at(-1), run.estimate(-1), base[run.seed].estimate(-1)
            )
            for run in runs
            if run.setting == setting and run.seed in base
        }
        out[setting] = seed_differences(per_seed)
    return out


def seed_differences(per_seed: dict[int, Estimate]) -> dict[str, Any]:
    """Same-seed differences as report rows, and (from one seed on) their mean over seeds with and without the shared
    questions' error."""
    rows = [{"seed": seed, "difference": e.value, "z": e.z(), **e.to_json()} for seed, e in per_seed.items()]
    result: dict[str, Any] = {"per_seed": rows, "seeds": len(rows)}
    if rows:
        result["over_seeds"] = over_seeds(list(per_seed.values())).to_json()
        result["over_seeds_spread_only"] = over_seeds(list(per_seed.values()), shared_questions=False).to_json()
    return result


def compare_by_training_task(runs: Sequence[RunCurve], baseline: str) -> dict[str, Any]:
    """For specialists: per setting and for the peers' own task and the others' tasks, each run's change (end minus
    start, paired by question), each seed's end-minus-baseline difference (same seed, paired by question) and the
    mean over seeds. Empty when no run has specialists with per-question outcomes."""
    base = {run.seed: run for run in runs if run.setting == baseline}
    out: dict[str, Any] = {}
    for which, own in (("own task", True), ("others' tasks", False)):
        changes = []
        for run in runs:
            end, start = run.by_training_task(-1, own), run.by_training_task(0, own)
            if end is not None and start is not None:
                estimate = paired_difference([end], [start])
                changes.append({"setting": run.setting, "seed": run.seed, "start": sum(start) / len(start),
                                "end": sum(end) / len(end), **estimate.to_json()})  # fmt: skip
        if not changes:
            continue
        versus: dict[str, Any] = {}
        for setting in sorted({run.setting for run in runs if run.setting != baseline}):
            per_seed = {}
            for run in runs:
                if run.setting != setting or run.seed not in base:
                    continue
                end, base_end = run.by_training_task(-1, own), base[run.seed].by_training_task(-1, own)
                if end is not None and base_end is not None:
                    per_seed[run.seed] = paired_difference([end], [base_end])
            versus[setting] = seed_differences(per_seed)
        out[which] = {"changes": changes, "versus_baseline": versus}
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
        for setting, versus in result["versus_baseline"].items():
            for row in versus["per_seed"]:
                lines.append(f"- {which}, {paper_label(setting)} minus {paper_label(baseline)}, seed {row['seed']}: "
                             f"{_interval(row)}")  # fmt: skip
            if versus["seeds"] > 1:
                lines.append(f"- **{which}, {paper_label(setting)} minus {paper_label(baseline)}, mean over "
                             f"{versus['seeds']} seeds: {_interval(versus['over_seeds'])}**")  # fmt: skip
    return lines


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
        if "over_seeds" not in result:
            continue
        if result["seeds"] < 2:
            lines.append(f"- {paper_label(setting)}: one seed, no interval over seeds")
            continue
        both, spread = result["over_seeds"], result["over_seeds_spread_only"]
        lines += [
            f"- **{paper_label(setting)}, mean over {result['seeds']} seeds: {_interval(both)}**, t-interval on "
            f"{both['df']:.1f} degrees of freedom (spread over seeds plus the question-sampling error the seeds "
            f"share): a gain above {both['ci_high']:+.3f} is excluded at 95 %.",
            f"- The spread over seeds alone (which leaves out the shared questions' error) gives "
            f"{_interval(spread)} on {spread['df']:.0f} degrees of freedom.",
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
    stem = f"sapo_table_{args.profile}_held_out"
    plot_curves(runs, results / f"{stem}.png", args.profile)
    page = markdown(args.profile, runs, comparison, args.baseline, f"{stem}.png", code, split)
    (results / f"{stem}.md").write_text(page)
    # the outcomes stay in the archives; the page's JSON says which steps had them
    listed = [{k: v for k, v in vars(run).items() if k != "outcomes"} for run in runs]
    data = {
        "runs": [{**row, "steps_with_outcomes": sorted(run.outcomes)} for row, run in zip(listed, runs, strict=True)],
        "comparison": comparison,
        "by_training_task": split,
    }
    (results / f"{stem}.json").write_text(json.dumps(data, indent=1) + "\n")
    print(page)
    return data


if __name__ == "__main__":
    main()
