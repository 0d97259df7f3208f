"""The pre-registered campaign's report: each experiment's endpoints from its run directories, its page and plot.

Two experiments are registered in ``benchmarks/preregistered/``:

- ``specialists`` (specialists_replicated.md): 3 specialists of ``--profile cpu-hard-specialists``, 8/0 (run as 2/0)
  against 4/4 (1/1), seeds 3-8. Primary: held-out pass@1 at step 60 on the tasks a peer does not train on ("others'
  tasks": per question, the mean of the two peers that do not train on its task), 4/4 minus 8/0. Secondary: the same
  on basic_arithmetic alone, the own task, the gain per compute, what sharing carried.
- ``stronger`` (stronger_peers.md): ``--profile cpu-hard-strong``, nodes 0 and 2 students, 1 and 3 stronger peers,
  4/0 against 2/2, seeds 0-3. Primary: the students' pass@1 at step 60 (the two students averaged question by
  question), 2/2 minus 4/0. Secondary: the gain per compute, what sharing carried (from whom), whether the sampler
  comparison is due (usable groups exceeding the swarm slots in at least half of the steps), the stronger peers'
  own pass@1. Exploratory, not pre-registered: students and stronger peers on each task's questions alone.

Every figure is paired by seed and question: per seed pair, the per-question difference of the two settings at step
60 (each node's ``held_out.jsonl``), a seeds x questions table whose mean gets the interval of
:func:`benchmarks.stats.seeds_and_questions`, with the plain t-interval over the seed pairs
(:func:`benchmarks.stats.t_over_seeds`) beside it. The decision rule is the pre-registration's: a gain if the 95 %
interval's lower bound is above 0, a loss if its upper bound is below 0, otherwise no difference resolved, with the
gain and loss it excludes. A setting whose step-0 to step-60 change is not resolved is reported as no learning.

Only runs that count are used: complete (``run-complete.json``), evaluated at steps 0 and 60 with per-question
outcomes, on the registered node code (the run's commit has the ``sapo/``, ``swarm/`` and ``rewards/`` of d74d755; a
commit this clone does not hold is flagged unverified). A partial campaign is reported on the seed pairs it has, with
how many of the registered ones that is.

``--archive DEST`` first copies every complete run's small files (metrics, held-out outcomes, group logs, senders,
node-run.json, node.log, the harness's markers and node configs; never checkpoints, models or identity keys) to
``DEST/<experiment>/<profile>/<I-J>/seed-S``, the layout of sapo_table's ``--runs-dir``: pointed there, sapo_table
counts an archived run as complete and skips it, and this report reads it like a run directory; under the results
tree the runs' raw files then move into ``results/archive`` (:mod:`benchmarks.results_archive`).

    python -m benchmarks.campaign_report --experiment specialists RUNS_DIR [RUNS_DIR ...]
    python -m benchmarks.campaign_report --experiment stronger RUNS_DIR --archive benchmarks/results/campaign
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from benchmarks.compute_report import own_completions, training_lines, training_seconds
from benchmarks.harness import RESULTS, ROOT, commit_label, json_safe, pyplot
from benchmarks.held_out_table import (
    RunCurve,
    over_seeds,
    over_seeds_text,
    paper_label,
    question_differences,
    read_run,
    verdict,
)
from benchmarks.results_archive import RAW_RUN_FILES, pack, restored
from benchmarks.sharing_counts import node_dirs, run_counts, sharing_lines
from benchmarks.stats import paired_difference

NODE_CODE = ("sapo", "swarm", "rewards")
NODE_FILES = ("metrics.jsonl", "held_out.jsonl", "senders.json", "node-run.json", "node.log", "groups.jsonl*")
RUN_FILES = ("run-complete.json", "attempts.jsonl", "node-config*.yaml")
COMPLETE = "run-complete.json"
ARCHIVE_IGNORE = (
    "checkpoint-*/",
    "final/",
    "bootstrap/",
    "identity.key*",
    "p2pd-state.json",
    "node.out",
    "status.json",
)
"""What a run resumed in an archive folder writes that git must not take: models, keys, scratch files."""


@dataclass(frozen=True)
class Measure:
    """Held-out outcomes of a run reduced to one value per question: the mean over ``nodes``, or for specialists
    over the peers that train (``own_task``) or do not train on each question's task; ``task``: its questions only."""

    name: str
    nodes: tuple[int, ...] | None = None
    own_task: bool | None = None
    task: str | None = None

    def values(self, curve: RunCurve, position: int) -> list[float] | None:
        """Per question, at the ``position``-th evaluation (None where the outcomes are missing)."""
        if self.own_task is not None:
            values = curve.by_training_task(position, self.own_task)
        else:
            outcomes = curve.outcomes_at(position)
            if outcomes is None or (self.nodes and max(self.nodes) >= len(outcomes)):
                return None
            rows = [outcomes[i] for i in self.nodes] if self.nodes else outcomes
            values = [sum(column) / len(column) for column in zip(*rows, strict=True)]
        if values is None or self.task is None:
            return values
        return [v for v, task in zip(values, curve.question_tasks, strict=True) if task == self.task]


@dataclass(frozen=True)
class Experiment:
    """A pre-registered experiment: its runs, its endpoints and the nodes whose compute and groups count."""

    name: str
    profile: str
    baseline: str  # setting as run, I-J
    shared: str
    seeds: tuple[int, ...]
    step: int
    primary: Measure
    secondary: tuple[Measure, ...]
    per_compute: tuple[Measure, ...]  # the gains reported per unit of compute
    receivers: tuple[int, ...] | None  # nodes whose compute and group logs count (None: all)
    roles: dict[int, str] = field(default_factory=dict)
    sampler_check: bool = False  # report whether usable received groups exceeded the slots in half of the steps
    by_task: tuple[Measure, ...] = ()  # exploratory, not pre-registered: these measures on each task's questions
    node_code: str = "d74d755"
    preregistration: str = ""


OTHERS_TASKS = Measure("others' tasks", own_task=False)
OWN_TASK = Measure("own task", own_task=True)
BASIC_ARITHMETIC = Measure("basic_arithmetic, the two peers that do not train on it", own_task=False,
                           task="basic_arithmetic")  # fmt: skip
STUDENTS = Measure("students (nodes 0 and 2)", nodes=(0, 2))
STRONGER = Measure("stronger peers (nodes 1 and 3)", nodes=(1, 3))

EXPERIMENTS = {
    "specialists": Experiment(
        name="specialists", profile="cpu-hard-specialists", baseline="2-0", shared="1-1", seeds=(3, 4, 5, 6, 7, 8),
        step=60, primary=OTHERS_TASKS, secondary=(BASIC_ARITHMETIC, OWN_TASK), per_compute=(OTHERS_TASKS, OWN_TASK),
        receivers=None, preregistration="benchmarks/preregistered/specialists_replicated.md",
    ),
    "stronger": Experiment(
        name="stronger", profile="cpu-hard-strong", baseline="4-0", shared="2-2", seeds=(0, 1, 2, 3), step=60,
        primary=STUDENTS, secondary=(STRONGER,), per_compute=(STUDENTS,), receivers=(0, 2),
        roles={0: "student", 1: "stronger", 2: "student", 3: "stronger"}, sampler_check=True,
        by_task=(STUDENTS, STRONGER),
        preregistration="benchmarks/preregistered/stronger_peers.md",
    ),
}  # fmt: skip


@dataclass
class CampaignRun:
    """One complete run: its held-out curve, where it is, what it ran on, and its compute per node."""

    setting: str
    seed: int
    run_dir: Path
    curve: RunCurve
    marker: dict[str, Any]
    node_code: bool | None  # the registered node code; None: unverified
    problems: list[str]
    completions: dict[int, float]  # per node: own completions generated over the run
    seconds: dict[int, float]  # per node: training seconds (step times)
    reward: dict[int, list[float]]  # per node: sapo/local_reward per step

    def position(self, step: int) -> int | None:
        """The index of the evaluation at ``step`` (None: not evaluated there)."""
        return self.curve.steps.index(step) if step in self.curve.steps else None


# ----------------------------------------------------------------------------------------------------
# finding and checking runs


def same_node_code(commit: str, reference: str) -> bool | None:
    """Whether ``commit`` holds ``reference``'s node code (sapo/, swarm/, rewards/); None when this clone lacks one.
    ``commit`` may carry the note a copy without ``.git`` (a device machine's) records after the sha."""
    commit = commit.split(" ", 1)[0]

    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=ROOT)

    if any(git("rev-parse", "--verify", "--quiet", f"{c}^{{commit}}").returncode for c in (commit, reference)):
        return None
    return git("diff", "--quiet", reference, commit, "--", *NODE_CODE).returncode == 0


def find_run(runs_dirs: Sequence[Path], profile: str, setting: str, seed: int) -> Path | None:
    """The first complete run of (setting, seed) under the run directories (sapo_table's ``--runs-dir`` layout, or
    a profile folder itself)."""
    for root in runs_dirs:
        for candidate in (root / profile / setting / f"seed-{seed}", root / setting / f"seed-{seed}"):
            if (candidate / COMPLETE).is_file():
                return candidate
    return None


def read_campaign_run(run_dir: Path, experiment: Experiment) -> CampaignRun | None:
    """A complete run with what excludes it from the endpoints (``problems``), or None if it is not complete."""
    curve = read_run(run_dir)
    if curve is None:
        return None
    marker = json.loads((run_dir / COMPLETE).read_text())
    identity = marker.get("identity") or {}
    code = marker.get("code") or {}
    matches = same_node_code(str(code.get("commit", "")), experiment.node_code) if code.get("commit") else None
    problems = []
    if identity.get("profile", experiment.profile) != experiment.profile:
        problems.append(f"profile {identity['profile']}, not {experiment.profile}")
    if matches is False:
        problems.append(f"node code differs from {experiment.node_code}'s")
    for step in (0, experiment.step):
        if step not in curve.outcomes:
            problems.append(f"no per-question outcomes at step {step}")
        elif experiment.primary.values(curve, curve.steps.index(step)) is None:
            problems.append(f"no outcomes of the {experiment.primary.name} at step {step}")
    problems += role_problems(run_dir, curve, experiment)
    local, generations = int(identity.get("num_local", 0)), int(identity.get("num_generations", 0))
    completions, seconds, reward = {}, {}, {}
    for node in node_dirs(restored(run_dir)):  # metrics packed into results/archive are read from there
        index, lines = int(node.name.split("-")[1]), training_lines(node / "metrics.jsonl")
        steps = range(1, max(lines, default=0) + 1)
        if not lines or any(s not in lines for s in steps):
            problems.append(f"{node.name} logged no step time for some step")
            continue
        completions[index] = own_completions(lines, steps, local, generations)[-1]
        seconds[index] = training_seconds(lines, steps)[-1]
        reward[index] = [float(lines[s].get("sapo/local_reward", float("nan"))) for s in steps]
    return CampaignRun(curve.setting, curve.seed, run_dir, curve, marker, matches, problems, completions, seconds,
                       reward)  # fmt: skip


def role_problems(run_dir: Path, curve: RunCurve, experiment: Experiment) -> list[str]:
    """Where the nodes' own records (node-run.json) contradict the roles the report gives them."""
    records = {}
    for node in node_dirs(run_dir):
        if (node / "node-run.json").is_file():
            records[int(node.name.split("-")[1])] = json.loads((node / "node-run.json").read_text())
    problems = []
    if curve.peer_tasks is not None:  # specialists: node i trains on the i-th task of the mix
        for index, record in records.items():
            trained = [task["name"] for task in record.get("tasks") or []]
            if trained and trained != [curve.peer_tasks[index]]:
                problems.append(f"node-{index} trained on {trained}, not [{curve.peer_tasks[index]}]")
    models = {role: {records[i].get("model") for i, r in experiment.roles.items() if r == role and i in records}
              for role in set(experiment.roles.values())}  # fmt: skip
    if any(len(names) > 1 for names in models.values()) or (len(models) > 1 and len(set.union(*models.values())) < 2):
        problems.append(f"the nodes' models do not match their roles: {models}")
    return problems


def collect(runs_dirs: Sequence[Path], experiment: Experiment) -> list[CampaignRun]:
    """Every complete run of the experiment's registered settings and seeds under the run directories."""
    runs = []
    for seed in experiment.seeds:
        for setting in (experiment.baseline, experiment.shared):
            path = find_run(runs_dirs, experiment.profile, setting, seed)
            run = None if path is None else read_campaign_run(path, experiment)
            if run is not None:
                runs.append(run)
    return runs


def seed_pairs(runs: Sequence[CampaignRun], experiment: Experiment) -> dict[int, tuple[CampaignRun, CampaignRun]]:
    """Seed -> (shared run, baseline run), for the seeds where both runs count."""
    counted = {(run.setting, run.seed): run for run in runs if not run.problems}
    return {
        seed: (counted[(experiment.shared, seed)], counted[(experiment.baseline, seed)])
        for seed in experiment.seeds
        if (experiment.shared, seed) in counted and (experiment.baseline, seed) in counted
    }


# ----------------------------------------------------------------------------------------------------
# endpoints


def decided(result: dict[str, Any], kind: str) -> dict[str, Any]:
    """``result`` (:func:`benchmarks.held_out_table.over_seeds`) with its verdict under the decision rule."""
    if result["seeds"] == 0:
        return {**result, "verdict": "no seed pair yet"}
    if "over_seeds" not in result:
        return {**result, "verdict": "one seed pair: no interval over seeds"}
    return {**result, "verdict": verdict(result, kind)}


def difference_at(pairs: dict[int, tuple[CampaignRun, CampaignRun]], measure: Measure, step: int) -> dict[str, Any]:
    """The shared setting minus the baseline at ``step``, per seed pair and over them, paired by question."""
    per_seed, tables = {}, {}
    for seed, (mine, base) in pairs.items():
        a = measure.values(mine.curve, mine.position(step))
        b = measure.values(base.curve, base.position(step))
        per_seed[seed], tables[seed] = paired_difference([a], [b]), question_differences(a, b)
    return decided(over_seeds(per_seed, tables), "difference")


def change_over(runs: Sequence[CampaignRun], measure: Measure, step: int, per: dict[int, float] | None = None):
    """Each run's change from step 0 to ``step`` (divided by ``per[seed]`` where given) and its mean over the runs,
    paired by question."""
    per_seed, tables = {}, {}
    for run in runs:
        end, start = measure.values(run.curve, run.position(step)), measure.values(run.curve, run.position(0))
        scale = 1.0 if per is None else 1.0 / per[run.seed]
        end, start = [v * scale for v in end], [v * scale for v in start]
        per_seed[run.seed], tables[run.seed] = paired_difference([end], [start]), question_differences(end, start)
    return decided(over_seeds(per_seed, tables), "change")


def task_breakdown(pairs: dict[int, tuple[CampaignRun, CampaignRun]], measure: Measure, experiment: Experiment):
    """``measure`` on each task's questions alone: each setting's pass@1 at step 0 and at the endpoint per seed
    pair, and the shared setting minus the baseline at the endpoint."""
    if not pairs:
        return {}
    seeds = sorted(pairs)
    question_tasks = pairs[seeds[0]][0].curve.question_tasks
    breakdown = {}
    for task in dict.fromkeys(question_tasks):
        on_task = replace(measure, name=f"{measure.name}, {task}", task=task)
        entry: dict[str, Any] = {"questions": question_tasks.count(task)}
        for side, setting in ((1, experiment.baseline), (0, experiment.shared)):
            runs = [pairs[seed][side] for seed in seeds]
            entry[setting] = {
                step: [mean_of(on_task.values(run.curve, run.position(step))) for run in runs]
                for step in (0, experiment.step)
            }
        entry["difference"] = difference_at(pairs, on_task, experiment.step)
        breakdown[task] = entry
    return breakdown


def compute_of(run: CampaignRun, nodes: tuple[int, ...] | None, axis: str) -> float:
    """Own completions or training seconds per peer over the run (mean over ``nodes``; None: every node)."""
    values = run.completions if axis == "completions" else run.seconds
    chosen = [values[i] for i in (nodes if nodes is not None else values)]
    return sum(chosen) / len(chosen)


COMPUTE_AXES = {"completions": ("own completions generated per peer", 100.0), "seconds": ("training seconds", 3600.0)}


def gain_per_compute(pairs, measure: Measure, experiment: Experiment) -> dict[str, Any]:
    """Per axis: each setting's gain from step 0 to the last step per unit of compute (per 100 own completions, per
    hour of training), its mean over seeds, and the shared setting's minus the baseline's, paired by seed and
    question."""
    out: dict[str, Any] = {}
    for axis, (_, unit) in COMPUTE_AXES.items():
        entry: dict[str, Any] = {"per": unit}
        rates: dict[str, dict[int, list[float]]] = {}
        for side, setting in ((0, experiment.shared), (1, experiment.baseline)):
            runs = [pair[side] for pair in pairs.values()]
            per = {run.seed: compute_of(run, experiment.receivers, axis) / unit for run in runs}
            entry[setting] = change_over(runs, measure, experiment.step, per)
            rates[setting] = {}
            for run in runs:
                end = measure.values(run.curve, run.position(experiment.step))
                start = measure.values(run.curve, run.position(0))
                rates[setting][run.seed] = [(e - s) / per[run.seed] for e, s in zip(end, start, strict=True)]
        per_seed = {seed: paired_difference([rates[experiment.shared][seed]], [rates[experiment.baseline][seed]])
                    for seed in pairs}  # fmt: skip
        tables = {s: question_differences(rates[experiment.shared][s], rates[experiment.baseline][s]) for s in pairs}
        entry["difference"] = decided(over_seeds(per_seed, tables), "difference")
        out[axis] = entry
    return out


def sharing(pairs, experiment: Experiment) -> dict[str, Counter]:
    """Per setting, what sharing carried to the receivers (summed over seed pairs), senders named with their role."""
    out = {}
    for side, setting in ((1, experiment.baseline), (0, experiment.shared)):
        total: Counter = Counter()
        for pair in pairs.values():
            total.update(run_counts(pair[side].run_dir, experiment.receivers))
        for index, role in experiment.roles.items():
            key = f"taken_from/node-{index}"
            if key in total:
                total[f"{key} ({role})"] = total.pop(key)
        out[setting] = total
    return out


def analyse(runs: Sequence[CampaignRun], experiment: Experiment) -> dict[str, Any]:
    """Every endpoint of the experiment on the seed pairs that count."""
    pairs = seed_pairs(runs, experiment)
    data: dict[str, Any] = {
        "pairs": sorted(pairs),
        "registered_pairs": list(experiment.seeds),
        # the decision rule applies to the registered pairs; fewer give a verdict that claims nothing yet
        "interim": len(pairs) < len(experiment.seeds),
        "primary": {"measure": experiment.primary.name, **difference_at(pairs, experiment.primary, experiment.step)},
        "learning": {
            m.name: {
                setting: change_over([pair[side] for pair in pairs.values()], m, experiment.step)
                for side, setting in ((1, experiment.baseline), (0, experiment.shared))
            }
            for m in (experiment.primary, *experiment.secondary)
        },
        "secondary": {m.name: difference_at(pairs, m, experiment.step) for m in experiment.secondary},
        "per_compute": {m.name: gain_per_compute(pairs, m, experiment) for m in experiment.per_compute},
    }
    data["by_task"] = {m.name: task_breakdown(pairs, m, experiment) for m in experiment.by_task}
    counts = sharing(pairs, experiment)
    data["sharing"] = {setting: dict(c) for setting, c in counts.items()}  # settings as run, I-J
    shared = counts[experiment.shared]
    if experiment.sampler_check and "steps_with_surplus" in shared and shared["peer_steps"]:
        share = shared["steps_with_surplus"] / shared["peer_steps"]
        data["sampler_condition"] = {"share_of_steps_with_surplus": share, "met": share >= 0.5}
    return data


# ----------------------------------------------------------------------------------------------------
# archive


def archive_run(run_dir: Path, dest: Path) -> Path:
    """Copy a complete run's small files to ``dest`` (its completion marker last); returns ``dest``."""
    if dest.resolve() == run_dir.resolve():
        return dest
    for pattern in NODE_FILES:
        for path in run_dir.glob(f"node-*/{pattern}"):
            target = dest / path.parent.name / path.name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
    for pattern in RUN_FILES:
        for path in sorted(run_dir.glob(pattern), key=lambda p: p.name == COMPLETE):
            dest.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, dest / path.name)
    return dest


def archive_all(runs_dirs: Sequence[Path], experiment: Experiment, archive: Path) -> list[Path]:
    """Archive every complete run of the experiment found under ``runs_dirs`` into ``archive/<experiment>``, whose
    ``.gitignore`` keeps out the checkpoints and keys of a run that sapo_table resumes there. Under the results tree
    the runs' raw files (metrics, group logs, node logs) then go into ``results/archive/<folder>_<experiment>.tar.xz``,
    from which the reports read them."""
    (archive / experiment.name).mkdir(parents=True, exist_ok=True)
    (archive / experiment.name / ".gitignore").write_text("".join(f"{pattern}\n" for pattern in ARCHIVE_IGNORE))
    done = []
    for seed in experiment.seeds:
        for setting in (experiment.baseline, experiment.shared):
            path = find_run(runs_dirs, experiment.profile, setting, seed)
            if path is not None:
                dest = archive / experiment.name / experiment.profile / setting / f"seed-{seed}"
                done.append(archive_run(path, dest))
    if archive.resolve().is_relative_to(RESULTS.resolve()):
        raw = [f for pattern in RAW_RUN_FILES for f in (archive / experiment.name).glob(f"**/node-*/{pattern}")]
        pack(f"{archive.name}_{experiment.name}", raw)
    return done


def mean_of(values: Sequence[float]) -> float:
    """The mean of a non-empty sequence."""
    return sum(values) / len(values)


# ----------------------------------------------------------------------------------------------------
# the page


def _estimate(row: dict[str, Any]) -> str:
    return f"{row['value']:+.3f} ± {row['se']:.3f} (95 % CI {row['ci_low']:+.3f} to {row['ci_high']:+.3f})"


def result_lines(name: str, result: dict[str, Any]) -> list[str]:
    """Per seed pair, then over the pairs with both intervals and the verdict."""
    lines = [f"- {name}, seed {row['seed']}: {_estimate(row)}" for row in result["per_seed"]]
    over = f"{over_seeds_text(result)}: " if "over_seeds" in result else ""
    return [*lines, f"- **{name}, over {result['seeds']} seed pair(s): {over}{result['verdict']}**"]


def run_table(runs: Sequence[CampaignRun], experiment: Experiment, pairs: Sequence[int]) -> list[str]:
    lines = ["| setting | seed | commit | node code of " + experiment.node_code + " | minutes (last attempt) | "
             "finished (UTC) | counts |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for run in runs:
        code = run.marker.get("code") or {}
        commit = str(code.get("commit", "?"))[:10] + (" (dirty tree)" if code.get("dirty") else "")
        same = {True: "yes", False: "no", None: "unverified"}[run.node_code]
        finished = run.marker.get("finished")
        when = (
            datetime.datetime.fromtimestamp(finished, datetime.timezone.utc).strftime("%F %H:%M") if finished else "-"
        )
        minutes = (run.marker.get("last_attempt_seconds") or float("nan")) / 60
        counts = "; ".join(run.problems) or ("yes" if run.seed in pairs else "its pair is not complete")
        lines.append(
            f"| {paper_label(run.setting)} | {run.seed} | {commit} | {same} | {minutes:.0f} | {when} | {counts} |"
        )
    return lines


INTERIM = (
    "**Interim: the decision rule applies at the pre-registered pairs; the verdicts below describe the pairs so far "
    "and claim nothing.**"
)


def markdown(experiment: Experiment, runs: Sequence[CampaignRun], data: dict[str, Any], code: str, argv) -> str:
    """The report page."""
    pairs, base, shared = data["pairs"], paper_label(experiment.baseline), paper_label(experiment.shared)
    lines = [
        f"# Campaign, experiment `{experiment.name}`: {shared} against {base}, profile `{experiment.profile}`",
        "",
        f"Pre-registration: `{experiment.preregistration}`  ",
        f"Command: `python -m benchmarks.campaign_report {' '.join(argv)}`  ",
        f"Report code: `{code}`; each run's own commit below.",
        "",
        f"**Coverage: {len(pairs)} of the {len(experiment.seeds)} pre-registered seed pairs** (seeds "
        f"{', '.join(map(str, pairs)) or 'none'} of {', '.join(map(str, experiment.seeds))}).",
        *([INTERIM] if data["interim"] else []),
        "",
        *run_table(runs, experiment, pairs),
        "",
        "Which other work shared the machine during each run: `/work/logs/shared.log` at the times above.",
        "",
        f"## Primary endpoint: {data['primary']['measure']}, held-out pass@1 at step {experiment.step}, "
        f"{shared} minus {base}",
        "",
        *result_lines(data["primary"]["measure"], data["primary"]),
        "",
        "Paired by seed and question: `benchmarks.stats.seeds_and_questions` on the seeds x questions table of "
        "differences (seed and question terms, each at its own t quantile); the plain t-interval over the seed pairs "
        "beside it. Decision rule: a gain if the interval's lower bound is above 0, a loss if its upper bound is below "
        "0, otherwise no difference resolved.",
        "",
        f"## Learning: step 0 to step {experiment.step} (a change not resolved is no learning)",
        "",
    ]
    for name, by_setting in data["learning"].items():
        for setting, result in by_setting.items():
            lines += result_lines(f"{name}, {paper_label(setting)}, change", result)
    lines += ["", "## Secondary endpoints (no claim of their own)", ""]
    for name, result in data["secondary"].items():
        lines += result_lines(f"{name}, {shared} minus {base}", result)
    for name, axes in data["per_compute"].items():
        for axis, entry in axes.items():
            label, unit = COMPUTE_AXES[axis]
            lines += ["", f"Gain of {name} from step 0 to {experiment.step} per {unit:.0f} {label}:"]
            for setting in (experiment.baseline, experiment.shared):
                lines += result_lines(paper_label(setting), entry[setting])
            lines += result_lines(f"{shared} minus {base}", entry["difference"])
    lines += ["", "## What sharing carried (group logs of the receiving nodes, summed over the seed pairs)", ""]
    lines += sharing_lines([(paper_label(setting), Counter(counts)) for setting, counts in data["sharing"].items()])
    if "sampler_condition" in data:
        condition = data["sampler_condition"]
        lines += ["", f"Usable received groups (scored, with reward spread) exceeded the swarm slots in "
                  f"{100 * condition['share_of_steps_with_surplus']:.0f} % of the {shared} receivers' steps: the "
                  f"pre-registered sampler comparison is {'due' if condition['met'] else 'not due'}."]  # fmt: skip
    lines += by_task_lines(experiment, data["by_task"], pairs)
    lines += ["", f"![curves](campaign_{experiment.name}.png)", ""]
    return "\n".join(lines)


def by_task_lines(experiment: Experiment, by_task: dict[str, dict[str, Any]], pairs: Sequence[int]) -> list[str]:
    """The exploratory table: each measure on each task's questions, step 0 and the endpoint per seed pair."""
    if not any(by_task.values()):
        return []
    base, shared, step = paper_label(experiment.baseline), paper_label(experiment.shared), experiment.step
    lines = ["", "## By task (exploratory, not pre-registered: it claims nothing)", "",
             f"Held-out pass@1 on each task's questions alone: the mean at step 0, then step {step} per seed pair "
             f"(seeds {', '.join(map(str, pairs))}); the difference paired by seed and question as above.",
             "", f"| measure | task | questions | {base}: step 0 -> {step} | {shared}: step 0 -> {step} | "
             f"{shared} minus {base} at step {step} |", "|---|---|---|---|---|---|"]  # fmt: skip
    for name, tasks in by_task.items():
        for task, entry in tasks.items():
            cells = []
            for setting in (experiment.baseline, experiment.shared):
                starts, ends = entry[setting][0], entry[setting][step]
                cells.append(f"{mean_of(starts):.3f} -> {', '.join(f'{v:.3f}' for v in ends)}")
            difference = entry["difference"]
            over = difference.get("over_seeds")
            estimate = (f"{over['value']:+.3f} ({over['ci_low']:+.3f} to {over['ci_high']:+.3f})" if over
                        else difference["verdict"])  # fmt: skip
            lines.append(f"| {name} | {task} | {entry['questions']} | {cells[0]} | {cells[1]} | {estimate} |")
    return lines


def plot(experiment: Experiment, runs: Sequence[CampaignRun], pairs: Sequence[int], path: Path) -> None:
    """Held-out pass@1 of the primary measure against step and against own completions, and the own groups' training
    reward against step (thin: one run; thick: the mean over the seed pairs)."""
    from sapo.node.report import moving_average

    plt = pyplot()
    figure, (by_step, by_compute, by_reward) = plt.subplots(1, 3, figsize=(16, 4.5))
    for colour, setting in enumerate((experiment.baseline, experiment.shared)):
        mine = [run for run in runs if run.setting == setting and run.seed in pairs]
        if not mine:
            continue
        ys = [[mean_of(experiment.primary.values(r.curve, r.position(s))) for s in (0, experiment.step)] for r in mine]
        xs = [[0.0, compute_of(r, experiment.receivers, "completions")] for r in mine]
        rewards = [[sum(col) / len(col) for col in zip(*(r.reward[i] for i in (experiment.receivers or r.reward)),
                                                      strict=False)] for r in mine]  # fmt: skip
        for x, y, reward in zip(xs, ys, rewards, strict=True):
            by_step.plot([0, experiment.step], y, color=f"C{colour}", alpha=0.3, lw=0.8)
            by_compute.plot(x, y, color=f"C{colour}", alpha=0.3, lw=0.8)
            by_reward.plot(range(1, len(reward) + 1), moving_average(reward, 5), color=f"C{colour}", alpha=0.3, lw=0.8)
        mean = [sum(y[k] for y in ys) / len(ys) for k in (0, 1)]
        mean_reward = [mean_of(column) for column in zip(*rewards, strict=False)]
        label = f"{paper_label(setting)} ({len(mine)} seed(s))"
        by_step.plot([0, experiment.step], mean, color=f"C{colour}", lw=2.2, marker="o", label=label)
        by_compute.plot([0, sum(x[1] for x in xs) / len(xs)], mean, color=f"C{colour}", lw=2.2, marker="o")
        by_reward.plot(range(1, len(mean_reward) + 1), moving_average(mean_reward, 5), color=f"C{colour}", lw=2.2)
    by_step.set(xlabel="step", ylabel=f"held-out pass@1, {experiment.primary.name}")
    by_compute.set(xlabel="own completions generated per peer", ylabel="held-out pass@1")
    by_reward.set(xlabel="step", ylabel="reward of own groups (5-step moving average)")
    for axis in (by_step, by_compute, by_reward):
        axis.grid(alpha=0.3)
    if by_step.get_legend_handles_labels()[0]:
        by_step.legend(fontsize=8)
    else:
        by_step.text(0.5, 0.5, "no seed pair yet", ha="center", va="center", transform=by_step.transAxes)
    figure.suptitle(f"Experiment {experiment.name}: {len(pairs)} of {len(experiment.seeds)} seed pairs")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.campaign_report", description=__doc__.split("\n")[0])
    parser.add_argument("runs_dirs", nargs="+", type=Path, help="run directories (sapo_table --runs-dir) or archives")
    parser.add_argument("--experiment", choices=sorted(EXPERIMENTS), required=True)
    parser.add_argument("--results-dir", type=Path, default=RESULTS / "campaign", help="where the page goes")
    parser.add_argument(
        "--archive", type=Path, default=None, metavar="DEST", help="first copy complete runs' small files to "
        "DEST/<experiment>/<profile>/<I-J>/seed-S (e.g. benchmarks/results/campaign) and read them there",
    )  # fmt: skip
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Archive (if asked), read the runs, write campaign_<experiment>.{md,json,png} and print the page."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    experiment = EXPERIMENTS[args.experiment]
    code = commit_label()  # before the outputs change the tree
    runs_dirs = list(args.runs_dirs)
    if args.archive is not None:
        archived = archive_all(runs_dirs, experiment, args.archive)
        print(f"archived {len(archived)} complete run(s) under {args.archive / experiment.name}")
        runs_dirs.insert(0, args.archive / experiment.name)
    runs = collect(runs_dirs, experiment)
    data = analyse(runs, experiment)
    results = args.results_dir
    results.mkdir(parents=True, exist_ok=True)
    plot(experiment, runs, data["pairs"], results / f"campaign_{experiment.name}.png")
    page = markdown(experiment, runs, data, code, argv)
    (results / f"campaign_{experiment.name}.md").write_text(page)
    data["runs"] = [{"setting": r.setting, "seed": r.seed, "run_dir": str(r.run_dir), "code": r.marker.get("code"),
                     "node_code": r.node_code, "problems": r.problems, "completions": r.completions,
                     "seconds": r.seconds} for r in runs]  # fmt: skip
    (results / f"campaign_{experiment.name}.json").write_text(json.dumps(json_safe(data), indent=1) + "\n")
    print(page)
    return data


if __name__ == "__main__":
    main()
