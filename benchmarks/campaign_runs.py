"""A pre-registered campaign's runs found, checked and paired by seed, and the endpoints computed on the pairs.

An :class:`Experiment` is one registered comparison of two settings (the shared one minus the baseline); experiment 3
registers several, each a :class:`Contrast` of a :class:`Registered` experiment. Every figure is paired by seed and
question: per seed pair, the per-question difference of the two settings at the endpoint (each node's
``held_out.jsonl``), a seeds x questions table whose mean gets :func:`benchmarks.stats.seeds_and_questions`'s
interval, with the plain t-interval over the pairs beside it (:func:`benchmarks.held_out_table.over_seeds`).
"""

from __future__ import annotations

import json
import statistics
import subprocess
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from benchmarks.compute_report import own_completions, slowdowns, training_lines, training_seconds, update_times
from benchmarks.harness import ROOT
from benchmarks.held_out_table import RunCurve, over_seeds, question_differences, read_run, verdict
from benchmarks.results_archive import restored
from benchmarks.sharing_counts import node_dirs, run_counts
from benchmarks.stats import clustered_mean, paired_difference

NODE_CODE = ("sapo", "swarm", "rewards")
COMPLETE = "run-complete.json"
Steps = tuple[int, ...]  # an endpoint: per question, the mean of the outcomes evaluated at these steps


@dataclass(frozen=True)
class Measure:
    """Held-out outcomes of a run reduced to one value per question: the mean over ``nodes``, or for specialists
    over the peers that train (``own_task``) or do not train on each question's task (in a run of generalists every
    peer trains on every task); ``task``: its questions only."""

    name: str
    nodes: tuple[int, ...] | None = None
    own_task: bool | None = None
    task: str | None = None

    def values(self, curve: RunCurve, position: int | None) -> list[float] | None:
        """Per question, at the ``position``-th evaluation (None where the outcomes are missing)."""
        if position is None:
            return None
        if self.own_task is not None and (curve.peer_tasks is not None or not self.own_task):
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
    """A pre-registered comparison: the shared setting minus the baseline, its runs, its endpoints and the nodes whose
    compute and groups count."""

    name: str
    profile: str
    baseline: str  # setting as run, I-J (a self-replay setting: I-J-replay)
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
    baseline_profile: str | None = None  # the baseline's profile where it is not ``profile``
    precision: str | None = None  # "float32": a run counts only if its nodes ran with --bf16 false
    eval_on_start: bool = True  # False: the runs evaluate at ``step`` only, step 0 comes from ``step0``
    step0: tuple[tuple[str, float], ...] | None = None  # per question (task, outcome) of the untrained model
    runs_dirs: tuple[Path, ...] = ()  # where its runs are, whatever the command names (archived originals)
    endpoint: Steps = ()  # the evaluated steps whose per-question mean is the endpoint value (empty: ``step``)
    baseline_endpoint: Steps = ()  # the baseline's, where it is read at other steps (empty: ``endpoint``)

    def sides(self) -> tuple[tuple[str, str], tuple[str, str]]:
        """``((profile, setting) of the shared side, that of the baseline)``."""
        return (self.profile, self.shared), (self.baseline_profile or self.profile, self.baseline)

    def ends(self) -> tuple[Steps, Steps]:
        """The endpoint's steps of the shared side and of the baseline (``step`` alone unless registered otherwise;
        the baseline at other steps: a contrast at equal own compute, such as 1/1 at step 60 against 2/0 at 30)."""
        shared = self.endpoint or (self.step,)
        return shared, self.baseline_endpoint or shared

    def has_start(self) -> bool:
        """Whether step 0 is known (the runs' own evaluation or a reference): learning and gains need it."""
        return self.eval_on_start or self.step0 is not None


@dataclass(frozen=True)
class Contrast:
    """One registered comparison of a :class:`Registered` experiment: its question, whether it is the question's
    primary endpoint, its labels for the two sides and, for a difference of differences, the contrast it is set
    against (``against``: that contrast's ``experiment.name``, this one's figures subtracted from it); ``decides``:
    what the registration lets its verdict decide."""

    question: str
    primary: bool
    experiment: Experiment
    labels: tuple[str, str]  # the shared side's, the baseline's
    against: str | None = None
    decides: str = ""


@dataclass(frozen=True)
class Registered:
    """An experiment registered as several contrasts (experiment 3), reported on one page."""

    name: str
    title: str
    preregistration: str
    contrasts: tuple[Contrast, ...]
    machine_log: str = ""  # what shared the machine during each run
    amendments: str = ""  # the pre-registration's amendments in brief, printed under its name
    machine_notes: str = ""  # JSON: which runs had the machine alone (``{"runs": {"PROFILE/I-J/seed-S": {"alone":
    # bool, "note": str}}}``), the reference of the modelled per-hour-alone figures


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
    update_seconds: float = float("nan")  # median over nodes and steps of the step's time outside generation
    own_by_step: dict[int, list[float]] = field(default_factory=dict)  # per node: own completions up to each step
    alone_seconds: dict[int, float] = field(default_factory=dict)  # per node: ``seconds`` modelled alone (if known)

    @property
    def key(self) -> str:
        """``"PROFILE/I-J/seed-S"``: the run's name in the machine notes."""
        return f"{(self.marker.get('identity') or {}).get('profile', '')}/{self.setting}/seed-{self.seed}"

    @property
    def arm(self) -> str:
        """``"PROFILE/I-J on COMMIT"``: the runs whose step times are alike (the same work on the same node code)."""
        commit = str((self.marker.get("code") or {}).get("commit", ""))[:7] or "an unnamed commit"
        return f"{self.key.rsplit('/', 1)[0]} on {commit}"

    def position(self, step: int) -> int | None:
        """The index of the evaluation at ``step`` (None: not evaluated there)."""
        return self.curve.steps.index(step) if step in self.curve.steps else None

    def values(self, measure: Measure, steps: int | Steps) -> list[float] | None:
        """Per question, ``measure``'s mean over the evaluations at ``steps`` (one step: its values as they are);
        None where one of them is missing."""
        rows = [measure.values(self.curve, self.position(s)) for s in ((steps,) if isinstance(steps, int) else steps)]
        if not rows or any(row is None for row in rows):
            return None
        return rows[0] if len(rows) == 1 else [sum(column) / len(rows) for column in zip(*rows, strict=True)]


Pairs = dict[int, tuple[CampaignRun, CampaignRun]]  # seed -> (shared run, baseline run)


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


def in_float32(identity: dict[str, Any]) -> bool:
    """Whether a run's nodes were told ``--bf16 false`` (sapo_table records the options after ``--``)."""
    args = [str(a).lower() for a in identity.get("node_args") or ()]
    return any(a == "--bf16" and b in ("false", "0", "no") for a, b in zip(args, args[1:], strict=False))


def with_start(curve: RunCurve, step0: tuple[tuple[str, float], ...]) -> RunCurve | str:
    """``curve`` with the reference evaluation as every peer's step 0, or why it cannot be (other questions)."""
    if [task for task, _ in step0] != curve.question_tasks:
        return f"the step-0 reference holds {len(step0)} other questions than the run's {len(curve.question_tasks)}"
    outcomes = [outcome for _, outcome in step0]
    estimate = clustered_mean([outcomes])
    return replace(curve, steps=[0, *curve.steps], pass_at_1=[estimate.value, *curve.pass_at_1],
                   standard_error=[estimate.se, *curve.standard_error],
                   outcomes={0: [outcomes] * curve.peers, **curve.outcomes})  # fmt: skip


def read_campaign_run(run_dir: Path, experiment: Experiment, profile: str | None = None) -> CampaignRun | None:
    """A complete run with what excludes it from the endpoints (``problems``), or None if it is not complete;
    ``profile``: the one it must have run (default: the experiment's)."""
    curve = read_run(run_dir)
    if curve is None:
        return None
    profile = profile or experiment.profile
    marker = json.loads((run_dir / COMPLETE).read_text())
    identity = marker.get("identity") or {}
    code = marker.get("code") or {}
    matches = same_node_code(str(code.get("commit", "")), experiment.node_code) if code.get("commit") else None
    problems = []
    if identity.get("profile", profile) != profile:
        problems.append(f"profile {identity['profile']}, not {profile}")
    if matches is False:
        problems.append(f"node code differs from {experiment.node_code}'s")
    if experiment.precision == "float32" and not in_float32(identity):
        problems.append("not run in float32 (its nodes lack --bf16 false)")
    if experiment.step0 is not None and 0 not in curve.outcomes and experiment.step in curve.outcomes:
        started = with_start(curve, experiment.step0)
        curve = started if isinstance(started, RunCurve) else curve
        problems += [] if isinstance(started, RunCurve) else [started]
    needed = sorted({experiment.step, *(s for steps in experiment.ends() for s in steps)})
    for step in [0, *needed] if experiment.eval_on_start else needed:
        if step not in curve.outcomes:
            problems.append(f"no per-question outcomes at step {step}")
        elif experiment.primary.values(curve, curve.steps.index(step)) is None:
            problems.append(f"no outcomes of the {experiment.primary.name} at step {step}")
    problems += role_problems(run_dir, curve, experiment)
    local, generations = int(identity.get("num_local", 0)), int(identity.get("num_generations", 0))
    completions, seconds, reward, update, own_by_step = {}, {}, {}, [], {}
    for node in node_dirs(restored(run_dir)):  # metrics packed into results/archive are read from there
        index, lines = int(node.name.split("-")[1]), training_lines(node / "metrics.jsonl")
        steps = range(1, max(lines, default=0) + 1)
        if not lines or any(s not in lines for s in steps):
            problems.append(f"{node.name} logged no step time for some step")
            continue
        own_by_step[index] = own_completions(lines, steps, local, generations)
        completions[index] = own_by_step[index][-1]
        seconds[index] = training_seconds(lines, steps)[-1]
        update += update_times(lines, steps) if all("sapo/time/generation" in lines[s] for s in steps) else []
        reward[index] = [float(lines[s].get("sapo/local_reward", float("nan"))) for s in steps]
    return CampaignRun(curve.setting, curve.seed, run_dir, curve, marker, matches, problems, completions, seconds,
                       reward, statistics.median(update) if update else float("nan"), own_by_step)  # fmt: skip


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
    """Every complete run of the experiment's registered settings and seeds under the run directories (the
    experiment's own ``runs_dirs`` where it names them)."""
    runs = []
    for seed in experiment.seeds:
        for profile, setting in reversed(experiment.sides()):
            path = find_run(experiment.runs_dirs or runs_dirs, profile, setting, seed)
            run = None if path is None else read_campaign_run(path, experiment, profile)
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


def difference_at(
    pairs: Pairs, measure: Measure, steps: int | Steps, baseline_steps: int | Steps | None = None
) -> dict[str, Any]:
    """The shared setting at ``steps`` minus the baseline at ``baseline_steps`` (default: the same), per seed pair
    and over them, paired by question."""
    per_seed, tables = {}, {}
    for seed, (mine, base) in pairs.items():
        a = mine.values(measure, steps)
        b = base.values(measure, steps if baseline_steps is None else baseline_steps)
        per_seed[seed], tables[seed] = paired_difference([a], [b]), question_differences(a, b)
    return decided(over_seeds(per_seed, tables), "difference")


def change_over(
    runs: Sequence[CampaignRun], measure: Measure, steps: int | Steps, per: dict[int, float] | None = None
) -> dict[str, Any]:
    """Each run's change from step 0 to ``steps`` (divided by ``per[seed]`` where given) and its mean over the runs,
    paired by question."""
    per_seed, tables = {}, {}
    for run in runs:
        end, start = run.values(measure, steps), run.values(measure, 0)
        scale = 1.0 if per is None else 1.0 / per[run.seed]
        end, start = [v * scale for v in end], [v * scale for v in start]
        per_seed[run.seed], tables[run.seed] = paired_difference([end], [start]), question_differences(end, start)
    return decided(over_seeds(per_seed, tables), "change")


def task_breakdown(pairs: dict[int, tuple[CampaignRun, CampaignRun]], measure: Measure, experiment: Experiment):
    """``measure`` on each task's questions alone: each setting's pass@1 at step 0 and at its endpoint per seed pair
    (keyed ``0`` and ``"end"``), and the shared setting minus the baseline at the endpoint."""
    if not pairs:
        return {}
    seeds = sorted(pairs)
    question_tasks = pairs[seeds[0]][0].curve.question_tasks
    ends = experiment.ends()
    breakdown = {}
    for task in dict.fromkeys(question_tasks):
        on_task = replace(measure, name=f"{measure.name}, {task}", task=task)
        entry: dict[str, Any] = {"questions": question_tasks.count(task)}
        for side, setting in ((1, experiment.baseline), (0, experiment.shared)):
            runs = [pairs[seed][side] for seed in seeds]
            entry[setting] = {key: [mean_of(run.values(on_task, steps)) for run in runs]
                              for key, steps in ((0, 0), ("end", ends[side]))}  # fmt: skip
        entry["difference"] = difference_at(pairs, on_task, *ends)
        breakdown[task] = entry
    return breakdown


def compute_of(run: CampaignRun, nodes: tuple[int, ...] | None, axis: str, step: int | None = None) -> float:
    """Own completions, training seconds or training seconds modelled alone per peer over the run (mean over
    ``nodes``; None: every node); ``step``: own completions up to that step."""
    if step is not None:
        if axis != "completions":
            raise ValueError(f"compute up to a step is counted in own completions only, not {axis}")
        values = {node: cumulative[step] for node, cumulative in run.own_by_step.items()}
    else:
        values = {"completions": run.completions, "seconds": run.seconds, "alone_seconds": run.alone_seconds}[axis]
    chosen = [values[i] for i in (nodes if nodes is not None else values)]
    return sum(chosen) / len(chosen)


COMPUTE_AXES = {
    "completions": ("own completions generated per peer", 100.0),
    "seconds": ("training seconds as measured (wall-clock, on a shared machine)", 3600.0),
    "alone_seconds": ("training seconds, machine alone (modelled)", 3600.0),
}


def compute_axes(runs: Sequence[CampaignRun]) -> list[str]:
    """The compute axes every run has: seconds modelled alone only once a reference run had the machine alone."""
    return [axis for axis in COMPUTE_AXES if axis != "alone_seconds" or all(run.alone_seconds for run in runs)]


def model_alone(runs: Sequence[CampaignRun], notes: dict[str, Any]) -> dict[str, Any]:
    """Each run's training seconds as they would have been on a machine to itself (``alone_seconds``), after
    :mod:`benchmarks.compute_report`'s model: a run that shared the machine ran slower by its median time outside
    generation over that of the runs of its arm (profile, setting and node code) that the notes mark alone, and its
    seconds divided by that factor are its seconds alone. The reference is the arm's own because the work outside
    generation differs between arms (a swarm arm fetches, scores and re-tokenizes the groups it takes; another
    commit's node code does other work); an arm without a run made alone is set against all the runs made alone.
    Returns the references and each run's factor (none without a run made alone)."""
    unique = {run.run_dir: run for run in runs}.values()  # a run two contrasts share is read once for each
    arm_of = {run.key: run.arm for run in unique}
    if len(arm_of) < len(unique):
        raise ValueError("two timed runs share a name in the machine notes (PROFILE/I-J/seed-S): give them other seeds")
    alone = {run.key for run in unique if (notes.get(run.key) or {}).get("alone")}
    references, slowdown = slowdowns({run.key: run.update_seconds for run in unique}, alone, arm=arm_of.__getitem__)
    for run in runs:
        if run.key in slowdown:
            run.alone_seconds = {node: seconds / slowdown[run.key] for node, seconds in run.seconds.items()}
    return {"alone_runs": sorted(alone & set(slowdown)), "reference_update_seconds": references, "slowdown": slowdown}


def gain_per_compute(pairs, measure: Measure, experiment: Experiment) -> dict[str, Any]:
    """Per axis: each setting's gain from step 0 to the last step per unit of compute (per 100 own completions, per
    hour of training), its mean over seeds, and the shared setting's minus the baseline's, paired by seed and
    question."""
    out: dict[str, Any] = {}
    for axis in compute_axes([run for pair in pairs.values() for run in pair]):
        entry: dict[str, Any] = {"per": COMPUTE_AXES[axis][1]}
        unit = entry["per"]
        rates: dict[str, dict[int, list[float]]] = {}
        for side, setting in ((0, experiment.shared), (1, experiment.baseline)):
            runs = [pair[side] for pair in pairs.values()]
            per = {run.seed: compute_of(run, experiment.receivers, axis) / unit for run in runs}
            entry[setting] = change_over(runs, measure, experiment.step, per)
            rates[setting] = {}
            for run in runs:
                end, start = run.values(measure, experiment.step), run.values(measure, 0)
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
    pairs, ends = seed_pairs(runs, experiment), experiment.ends()
    data: dict[str, Any] = {
        "pairs": sorted(pairs),
        "registered_pairs": list(experiment.seeds),
        # the decision rule applies to the registered pairs; fewer give a verdict that claims nothing yet
        "interim": len(pairs) < len(experiment.seeds),
        "primary": {"measure": experiment.primary.name, **difference_at(pairs, experiment.primary, *ends)},
        "learning": {
            m.name: {
                setting: change_over([pair[side] for pair in pairs.values()], m, ends[side])
                for side, setting in ((1, experiment.baseline), (0, experiment.shared))
            }
            for m in ((experiment.primary, *experiment.secondary) if experiment.has_start() else ())
        },
        "secondary": {m.name: difference_at(pairs, m, *ends) for m in experiment.secondary},
        "per_compute": {
            m.name: gain_per_compute(pairs, m, experiment) for m in experiment.per_compute if experiment.has_start()
        },
    }
    data["by_task"] = {m.name: task_breakdown(pairs, m, experiment) for m in experiment.by_task}
    data["own_completions"] = {  # per peer up to the endpoint's last step, fill-ins included: the compute compared
        setting: mean_of([compute_of(pair[side], experiment.receivers, "completions", max(ends[side]))
                          for pair in pairs.values()])
        for side, setting in ((1, experiment.baseline), (0, experiment.shared)) if pairs
    }  # fmt: skip
    counts = sharing(pairs, experiment)
    data["sharing"] = {setting: dict(c) for setting, c in counts.items()}  # settings as run, I-J
    shared = counts[experiment.shared]
    if experiment.sampler_check and "steps_with_surplus" in shared and shared["peer_steps"]:
        share = shared["steps_with_surplus"] / shared["peer_steps"]
        data["sampler_condition"] = {"share_of_steps_with_surplus": share, "met": share >= 0.5}
    return data


def mean_of(values: Sequence[float]) -> float:
    """The mean of a non-empty sequence."""
    return sum(values) / len(values)


# ----------------------------------------------------------------------------------------------------
# an experiment of several contrasts


def of_differences(first: Pairs, second: Pairs, measure: Measure, steps: int | Steps) -> dict[str, Any]:
    """On the seeds both contrasts have, the first's per-question difference at ``steps`` minus the second's (a
    difference of differences), per seed and over them."""
    per_seed, tables = {}, {}
    for seed in sorted(first.keys() & second.keys()):
        one, two = (question_differences(*(r.values(measure, steps) for r in pair))
                    for pair in (first[seed], second[seed]))  # fmt: skip
        if one is not None and two is not None and len(one) == len(two):  # else not the same questions
            per_seed[seed], tables[seed] = paired_difference([one], [two]), question_differences(one, two)
    return decided(over_seeds(per_seed, tables), "difference")


def incomplete(result: dict[str, Any], registered: int, unit: str = "seed pairs") -> dict[str, Any]:
    """``result`` with its verdict replaced by how far it is from the registered seeds, where it is short of them:
    its figures describe the pairs so far and claim nothing."""
    if result["seeds"] >= registered:
        return result
    return {**result, "verdict": f"incomplete: {result['seeds']} of {registered} {unit}, no verdict"}


def arms_of(registered: Registered, runs: dict[str, list[CampaignRun]]) -> dict[str, tuple[Contrast, list]]:
    """Each side of the contrasts by its label (a side two contrasts share counts once): the first contrast that
    names it and its runs that count, one per seed."""
    arms: dict[str, tuple[Contrast, dict[int, CampaignRun]]] = {}
    for contrast in registered.contrasts:
        experiment = contrast.experiment
        for label, setting in zip(contrast.labels, (experiment.shared, experiment.baseline), strict=True):
            counted = {r.seed: r for r in runs[experiment.name] if r.setting == setting and not r.problems}
            arms.setdefault(label, (contrast, {}))[1].update(counted)
    return {label: (contrast, [by_seed[s] for s in sorted(by_seed)]) for label, (contrast, by_seed) in arms.items()}


def arm_figures(experiment: Experiment, runs: Sequence[CampaignRun]) -> dict[str, Any]:
    """One arm over its runs: its learning (step 0 to the experiment's endpoint) and its gain from step 0 to the last
    step per unit of compute spent up to it, paired by question, and what filled its slots (group logs summed)."""
    out: dict[str, Any] = {"seeds": [run.seed for run in runs]}
    if runs and experiment.has_start():
        step, measure, registered = experiment.step, experiment.primary, len(experiment.seeds)
        out["learning"] = incomplete(change_over(runs, measure, experiment.ends()[0]), registered, "seeds")
        out["per_compute"] = {axis: incomplete(change_over(runs, measure, step, {
            run.seed: compute_of(run, experiment.receivers, axis) / COMPUTE_AXES[axis][1] for run in runs}),
            registered, "seeds") for axis in compute_axes(runs)}  # fmt: skip
    slots: Counter = Counter()
    for run in runs:
        slots.update(run_counts(run.run_dir, experiment.receivers))
    out["slots"] = dict(slots)
    return out


def analyse_registered(runs_dirs: Sequence[Path], registered: Registered) -> tuple[dict[str, list[CampaignRun]], dict]:
    """Every contrast's endpoints on its own seed pairs (:func:`analyse`), each difference of differences, and per
    arm of the contrasts that report gains per compute, its figures over every run of it that counts
    (:func:`arm_figures`). Returns the runs by contrast and the figures."""
    runs = {c.experiment.name: collect(runs_dirs, c.experiment) for c in registered.contrasts}
    notes_path = ROOT / registered.machine_notes if registered.machine_notes else None
    notes = json.loads(notes_path.read_text())["runs"] if notes_path and notes_path.is_file() else {}
    data: dict[str, Any] = {"contrasts": {}, "arms": {}}
    timed = [run for c in registered.contrasts if c.experiment.per_compute for run in runs[c.experiment.name]]
    data["machine"] = model_alone(timed, notes)
    for contrast in registered.contrasts:
        experiment = contrast.experiment
        result = analyse(runs[experiment.name], experiment)
        registered_pairs = len(experiment.seeds)
        result["primary"] = incomplete(result["primary"], registered_pairs)
        result["secondary"] = {m: incomplete(r, registered_pairs) for m, r in result["secondary"].items()}
        for axes in result["per_compute"].values():
            for entry in axes.values():
                entry["difference"] = incomplete(entry["difference"], registered_pairs)
        if contrast.against is not None:
            other = next(c.experiment for c in registered.contrasts if c.experiment.name == contrast.against)
            result["of_differences"] = incomplete(of_differences(
                seed_pairs(runs[other.name], other), seed_pairs(runs[experiment.name], experiment),
                experiment.primary, experiment.ends()[0]), registered_pairs)  # fmt: skip
        data["contrasts"][experiment.name] = result
    for label, (contrast, mine) in arms_of(registered, runs).items():
        if contrast.experiment.per_compute:
            data["arms"][label] = arm_figures(contrast.experiment, mine)
    return runs, data
