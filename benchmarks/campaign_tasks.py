"""An experiment of several contrasts on each task's questions alone (exploratory, not pre-registered).

Beside every "no learning" of an arm, the report shows where the average hides a change: each arm's change from step
0 on each task's questions, and each contrast on each task, paired by seed and question as the registered figures are
(:func:`benchmarks.campaign_runs.change_over`, :func:`benchmarks.campaign_runs.difference_at`: the interval of
:func:`benchmarks.stats.seeds_and_questions` over seeds x that task's questions, the plain t over seeds beside it).
An arm is read on its registered measure, and where that is not every peer averaged (experiment 1's others' tasks),
on every peer averaged as well; a specialist arm also on its own task. Nothing here has a verdict: three tasks and
several measures are many looks at a few seeds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from benchmarks.campaign_runs import (
    CampaignRun,
    Experiment,
    Measure,
    Registered,
    Steps,
    arms_of,
    change_over,
    difference_at,
    mean_of,
    of_differences,
    seed_pairs,
)

EVERY_PEER = Measure("every peer averaged")
OWN_TASK = Measure("own task", own_task=True)


def arm_measures(experiment: Experiment, runs: Sequence[CampaignRun]) -> tuple[Measure, ...]:
    """The measures an arm is read on per task: its registered one first, then every peer averaged where that is
    another, then for specialists (each peer trains on one task) their own task where that is another."""
    primary = experiment.primary
    measures = [primary]
    if primary.nodes or primary.own_task is not None:
        measures.append(EVERY_PEER)
    if any(run.curve.peer_tasks for run in runs) and primary.own_task is not True:
        measures.append(OWN_TASK)
    return tuple(measures)


def level(runs: Sequence[CampaignRun], measure: Measure, steps: int | Steps) -> float:
    """Mean pass@1 over the runs of ``measure`` at ``steps`` (each run's mean over its questions)."""
    return mean_of([mean_of(run.values(measure, steps)) for run in runs])


def arm_by_task(experiment: Experiment, runs: Sequence[CampaignRun]) -> dict[str, dict[str, Any]]:
    """Per measure (:func:`arm_measures`) and task: the questions, pass@1 at step 0 and at the endpoint (mean over
    the runs) and the change, paired by question, per seed and over the seeds."""
    tasks = list(dict.fromkeys(runs[0].curve.question_tasks))
    out: dict[str, dict[str, Any]] = {}
    for measure in arm_measures(experiment, runs):
        out[measure.name] = {}
        for task in tasks:
            on_task = replace(measure, task=task)
            out[measure.name][task] = {
                "questions": runs[0].curve.question_tasks.count(task),
                "step0": level(runs, on_task, 0),
                "end": level(runs, on_task, experiment.ends()[0]),
                "change": change_over(runs, on_task, experiment.ends()[0]),
            }
    return out


def task_figures(registered: Registered, runs: dict[str, list[CampaignRun]]) -> dict[str, Any]:
    """Every arm whose step 0 is known (:func:`arm_by_task`) and every contrast on each task: its registered measure,
    the shared side minus the baseline at the endpoint, and for a difference of differences that too, per task."""
    arms = {}
    for label, (contrast, mine) in arms_of(registered, runs).items():
        if mine and contrast.experiment.has_start():
            arms[label] = {"seeds": [run.seed for run in mine], "steps": contrast.experiment.ends()[0],
                           "measures": arm_by_task(contrast.experiment, mine)}  # fmt: skip
    contrasts = {}
    for contrast in registered.contrasts:
        experiment = contrast.experiment
        pairs = seed_pairs(runs[experiment.name], experiment)
        if not pairs:
            continue
        question_tasks = next(iter(pairs.values()))[0].curve.question_tasks
        other = next((c.experiment for c in registered.contrasts if c.experiment.name == contrast.against), None)
        entry: dict[str, Any] = {}
        for task in dict.fromkeys(question_tasks):
            on_task = replace(experiment.primary, task=task)
            entry[task] = {"questions": question_tasks.count(task),
                           "difference": difference_at(pairs, on_task, *experiment.ends())}  # fmt: skip
            if other is not None:
                entry[task]["of_differences"] = of_differences(
                    seed_pairs(runs[other.name], other), pairs, on_task, experiment.ends()[0]
                )
        contrasts[experiment.name] = {"measure": experiment.primary.name, "against": contrast.against,
                                      "tasks": entry}  # fmt: skip
    return {"note": "exploratory, not pre-registered", "arms": arms, "contrasts": contrasts}


# ----------------------------------------------------------------------------------------------------
# the page's lines


def cell(result: dict[str, Any] | None, plain: bool = False) -> str:
    """``"+0.065 (+0.016 to +0.115)"`` (``plain``: ``"...; plain t +0.028 to +0.103)"``), or ``"-"`` without an
    interval over seeds."""
    over = (result or {}).get("over_seeds")
    if over is None:
        return "-"
    text = f"{over['value']:+.3f} ({over['ci_low']:+.3f} to {over['ci_high']:+.3f}"
    if plain:
        t = result["t_over_seeds"]
        text += f"; plain t {t['ci_low']:+.3f} to {t['ci_high']:+.3f}"
    return text + ")"


def _excludes_zero(result: dict[str, Any]) -> str:
    over = result.get("over_seeds")
    if over is None:
        return "-"
    return "above 0" if over["ci_low"] > 0 else "below 0" if over["ci_high"] < 0 else "no"


def tasks_of(by_task: dict[str, Any]) -> list[str]:
    """The tasks of the figures, in question order."""
    for entry in by_task.get("arms", {}).values():
        return list(next(iter(entry["measures"].values())))
    for entry in by_task.get("contrasts", {}).values():
        return list(entry["tasks"])
    return []


def glance_cells(by_task: dict[str, Any], label: str) -> list[str]:
    """An arm's change per task on its registered measure, one cell per task (``"-"`` where it has none)."""
    measures = (by_task.get("arms", {}).get(label) or {}).get("measures") or {}
    first = next(iter(measures.values()), {})
    return [cell(first[task]["change"]) if task in first else "-" for task in tasks_of(by_task)]


def arm_task_line(label: str, by_task: dict[str, Any]) -> list[str]:
    """One line beside an arm's change: its change on each task's questions, on its registered measure."""
    measures = (by_task.get("arms", {}).get(label) or {}).get("measures") or {}
    if not measures:
        return []
    name, tasks = next(iter(measures.items()))
    figures = "; ".join(f"{task} {cell(entry['change'], plain=True)}" for task, entry in tasks.items())
    return [f"- {label}, change per task (exploratory, {name}): {figures}"]


def task_section(by_task: dict[str, Any]) -> list[str]:
    """The page's per-task section: every arm's change from step 0 on each task and measure, then every contrast on
    each task."""
    lines = ["## Per task (exploratory, not pre-registered)", "",
             "Each arm's change from step 0 to the endpoint and each contrast at the endpoint on one task's questions "
             "alone, paired by seed and question as above (95 % interval of `benchmarks.stats.seeds_and_questions` "
             "over seeds x that task's questions, the plain t-interval over seeds beside it). An arm is read on its "
             "registered measure and, where that is another, on every peer averaged and (specialists) on its own "
             "task. No verdicts: these are many looks at a few seeds, so an interval that excludes 0 here is a lead, "
             "not a finding.", "",
             "| arm | measure | task | questions | seeds | pass@1 at step 0 | at the endpoint | change (95 % CI; "
             "plain t) | interval excludes 0 |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for label, entry in by_task.get("arms", {}).items():
        for measure, tasks in entry["measures"].items():
            for task, figures in tasks.items():
                lines.append(f"| {label} | {measure} | {task} | {figures['questions']} | {len(entry['seeds'])} | "
                             f"{figures['step0']:.3f} | {figures['end']:.3f} | {cell(figures['change'], True)} | "
                             f"{_excludes_zero(figures['change'])} |")  # fmt: skip
    lines += ["", "| contrast | measure | task | questions | seed pairs | difference (95 % CI; plain t) | interval "
              "excludes 0 |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, entry in by_task.get("contrasts", {}).items():
        for task, figures in entry["tasks"].items():
            result = figures["difference"]
            lines.append(f"| {name} | {entry['measure']} | {task} | {figures['questions']} | {result['seeds']} | "
                         f"{cell(result, True)} | {_excludes_zero(result)} |")  # fmt: skip
            if "of_differences" in figures:
                twice = figures["of_differences"]
                lines.append(f"| ({entry['against']}) minus ({name}) | {entry['measure']} | {task} | "
                             f"{figures['questions']} | {twice['seeds']} | {cell(twice, True)} | "
                             f"{_excludes_zero(twice)} |")  # fmt: skip
    return lines
