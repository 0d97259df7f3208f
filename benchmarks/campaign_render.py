"""The campaign's pages and plots, from the runs and endpoints of :mod:`benchmarks.campaign_runs`: one page per
two-setting experiment (experiments 1 and 2), and one page for an experiment of several contrasts (experiment 3)."""

from __future__ import annotations

import datetime
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.campaign_runs import (
    COMPUTE_AXES,
    CampaignRun,
    Contrast,
    Experiment,
    Registered,
    arms_of,
    compute_of,
    mean_of,
)
from benchmarks.campaign_tasks import arm_task_line, glance_cells, task_section, tasks_of
from benchmarks.harness import pyplot
from benchmarks.held_out_table import over_seeds_text, paper_label
from benchmarks.sharing_counts import sharing_lines, slots_lines
from benchmarks.stats import t_over_seeds


def steps_text(steps: Sequence[int]) -> str:
    """``"step 60"``, or ``"steps 30 and 60 (their mean)"`` for an endpoint over several evaluations."""
    if len(steps) == 1:
        return f"step {steps[0]}"
    return f"steps {', '.join(map(str, steps[:-1]))} and {steps[-1]} (their mean)"


def endpoint_text(experiment: Experiment) -> str:
    """The endpoint's steps, and the baseline's where they differ."""
    shared, baseline = experiment.ends()
    if shared == baseline:
        return steps_text(shared)
    return f"{steps_text(shared)} against the baseline at {steps_text(baseline)}"


def _estimate(row: dict[str, Any]) -> str:
    return f"{row['value']:+.3f} ± {row['se']:.3f} (95 % CI {row['ci_low']:+.3f} to {row['ci_high']:+.3f})"


def result_lines(name: str, result: dict[str, Any], unit: str = "seed pair(s)") -> list[str]:
    """Per seed pair, then over the pairs with both intervals and the verdict."""
    lines = [f"- {name}, seed {row['seed']}: {_estimate(row)}" for row in result["per_seed"]]
    over = f"{over_seeds_text(result)}: " if "over_seeds" in result else ""
    return [*lines, f"- **{name}, over {result['seeds']} {unit}: {over}{result['verdict']}**"]


def run_table(runs: Sequence[CampaignRun], node_code: str, paired: set[Path],
              label: Callable[[CampaignRun], str] = lambda run: paper_label(run.setting)) -> list[str]:  # fmt: skip
    """One row per run: its commit, whether it has the registered node code, the CPU model its attempts recorded (a
    seed is another draw on another CPU model), its time, and whether it counts (``paired``: the run folders in a seed
    pair that counts)."""
    lines = ["| setting | seed | commit | node code of " + node_code + " | CPU | minutes (last attempt) | "
             "finished (UTC) | counts |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for run in runs:
        code = run.marker.get("code") or {}
        commit = str(code.get("commit", "?"))[:10] + (" (dirty tree)" if code.get("dirty") else "")
        same = {True: "yes", False: "no", None: "unverified"}[run.node_code]
        finished = run.marker.get("finished")
        when = datetime.datetime.fromtimestamp(finished, datetime.UTC).strftime("%F %H:%M") if finished else "-"
        minutes = (run.marker.get("last_attempt_seconds") or float("nan")) / 60
        counts = "; ".join(run.problems) or ("yes" if run.run_dir in paired else "its pair is not complete")
        cpu = ", ".join(run.marker.get("cpus") or ["not recorded"])
        lines.append(f"| {label(run)} | {run.seed} | {commit} | {same} | {cpu} | {minutes:.0f} | {when} | {counts} |")
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
        *run_table(runs, experiment.node_code, {r.run_dir for r in runs if r.seed in pairs and not r.problems}),
        "",
        "Which other work shared the machine during each run: `/work/logs/shared.log` at the times above.",
        "",
        f"## Primary endpoint: {data['primary']['measure']}, held-out pass@1 at {endpoint_text(experiment)}, "
        f"{shared} minus {base}",
        "",
        *result_lines(data["primary"]["measure"], data["primary"]),
        "",
        "Paired by seed and question: `benchmarks.stats.seeds_and_questions` on the seeds x questions table of "
        "differences (seed and question terms, each at its own t quantile); the plain t-interval over the seed pairs "
        "beside it. Decision rule: a gain if the interval's lower bound is above 0, a loss if its upper bound is below "
        "0, otherwise no difference resolved.",
        "",
        f"## Learning: step 0 to {endpoint_text(experiment)} (a change not resolved is no learning)",
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
    base, shared, end = paper_label(experiment.baseline), paper_label(experiment.shared), endpoint_text(experiment)
    lines = ["", "## By task (exploratory, not pre-registered: it claims nothing)", "",
             f"Held-out pass@1 on each task's questions alone: the mean at step 0, then at {end} per seed pair "
             f"(seeds {', '.join(map(str, pairs))}); the difference paired by seed and question as above.",
             "", f"| measure | task | questions | {base}: step 0 -> end | {shared}: step 0 -> end | "
             f"{shared} minus {base} at the end |", "|---|---|---|---|---|---|"]  # fmt: skip
    for name, tasks in by_task.items():
        for task, entry in tasks.items():
            cells = []
            for setting in (experiment.baseline, experiment.shared):
                starts, ends = entry[setting][0], entry[setting]["end"]
                cells.append(f"{mean_of(starts):.3f} -> {', '.join(f'{v:.3f}' for v in ends)}")
            difference = entry["difference"]
            over = difference.get("over_seeds")
            estimate = (f"{over['value']:+.3f} ({over['ci_low']:+.3f} to {over['ci_high']:+.3f})" if over
                        else difference["verdict"])  # fmt: skip
            lines.append(f"| {name} | {task} | {entry['questions']} | {cells[0]} | {cells[1]} | {estimate} |")
    return lines


def arm_panels(axes: Sequence[Any], arms: Sequence[tuple[str, Sequence[CampaignRun], Experiment]],
               colours: dict[str, str] | None = None) -> None:  # fmt: skip
    """On three axes, per arm ``(label, its runs, its experiment)`` (``colours``: by label, else in turn): held-out
    pass@1 of the experiment's primary measure against step and against own completions per peer, and the own
    groups' training reward per step (5-step moving average over the receiving nodes). Thick: the mean over the
    arm's seeds, its bars and band the 95 % t-interval over seeds where there are two or more; thin: each run."""
    from sapo.node.report import moving_average

    by_step, by_compute, by_reward = axes
    for index, (label, runs, experiment) in enumerate(arms):
        if not runs:
            continue
        colour, measure = (colours or {}).get(label, f"C{index}"), experiment.primary
        steps = sorted(set.intersection(*(set(run.curve.steps) for run in runs)))  # every step all runs evaluated
        ys = [[mean_of(run.values(measure, s)) for s in steps] for run in runs]
        xs = [[compute_of(run, experiment.receivers, "completions", s) for s in steps] for run in runs]
        nodes = [experiment.receivers or sorted(run.reward) for run in runs]
        rewards = [moving_average([mean_of(step) for step in zip(*(run.reward[i] for i in chosen), strict=False)], 5)
                   for run, chosen in zip(runs, nodes, strict=True)]  # fmt: skip
        for x, y, reward in zip(xs, ys, rewards, strict=True):
            by_step.plot(steps, y, color=colour, alpha=0.3, lw=0.8)
            by_compute.plot(x, y, color=colour, alpha=0.3, lw=0.8)
            by_reward.plot(range(1, len(reward) + 1), reward, color=colour, alpha=0.3, lw=0.8)
        level = [t_over_seeds(column) for column in zip(*ys, strict=True)]
        bars = [e.half_width() if len(runs) > 1 else 0.0 for e in level]
        mean_x = [mean_of(column) for column in zip(*xs, strict=True)]
        for axis, x in ((by_step, steps), (by_compute, mean_x)):
            axis.errorbar(x, [e.value for e in level], yerr=bars, color=colour, lw=2.2, marker="o", capsize=4,
                          label=f"{label} ({len(runs)} seed{'s' if len(runs) > 1 else ''})")  # fmt: skip
        band = [t_over_seeds(column) for column in zip(*rewards, strict=False)]
        x = range(1, len(band) + 1)
        by_reward.plot(x, [e.value for e in band], color=colour, lw=2.2)
        if len(runs) > 1:
            by_reward.fill_between(x, *zip(*(e.interval() for e in band), strict=True), color=colour, alpha=0.15)
    by_step.set(xlabel="step", ylabel=f"held-out pass@1, {arms[0][2].primary.name}" if arms else "held-out pass@1")
    by_compute.set(xlabel="own completions generated per peer", ylabel="held-out pass@1")
    by_reward.set(xlabel="step", ylabel="reward of own groups (5-step mean)")
    for axis in axes:
        axis.grid(alpha=0.3)
    if by_step.get_legend_handles_labels()[0]:
        by_step.legend(fontsize=8)
    else:
        by_step.text(0.5, 0.5, "no run counts yet", ha="center", va="center", transform=by_step.transAxes)


def plot(experiment: Experiment, runs: Sequence[CampaignRun], pairs: Sequence[int], path: Path) -> None:
    """The curves of the two settings over the seed pairs (:func:`arm_panels`)."""
    plt = pyplot()
    figure, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    arm_panels(axes, [(paper_label(setting), [r for r in runs if r.setting == setting and r.seed in pairs], experiment)
                      for setting in (experiment.baseline, experiment.shared)])  # fmt: skip
    figure.suptitle(f"Experiment {experiment.name}: {len(pairs)} of {len(experiment.seeds)} seed pairs")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


# ----------------------------------------------------------------------------------------------------
# an experiment of several contrasts


def questions(registered: Registered) -> dict[str, tuple[Contrast, ...]]:
    """The registered questions in order, each with its contrasts."""
    out: dict[str, tuple[Contrast, ...]] = {}
    for contrast in registered.contrasts:
        out[contrast.question] = (*out.get(contrast.question, ()), contrast)
    return out


def coverage(result: dict[str, Any], registered: Sequence[int]) -> str:
    """``"complete: 4 of 4 seed pairs"`` or ``"**incomplete: 1 of 4 seed pairs** (seed 10 so far; ...)"``."""
    pairs, seeds = result["pairs"], len(registered)
    if len(pairs) >= seeds:
        return f"complete: {len(pairs)} of {seeds} seed pairs"
    so_far, all_of = ", ".join(map(str, pairs)) or "none", ", ".join(map(str, registered))
    return (f"**incomplete: {len(pairs)} of {seeds} seed pairs** (so far: {so_far}; registered: {all_of}; the figures "
            "describe these and claim nothing)")  # fmt: skip


def _interval(result: dict[str, Any] | None) -> str:
    """``"+0.009 (-0.347 to +0.365)"``: the mean over the seed pairs with its 95 % interval ("-" without one)."""
    over = (result or {}).get("over_seeds")
    return "-" if over is None else f"{over['value']:+.3f} ({over['ci_low']:+.3f} to {over['ci_high']:+.3f})"


def glance_lines(registered: Registered, data: dict[str, Any]) -> list[str]:
    """One row per contrast: its primary measure at the endpoint, its gain per 100 own completions and per hour
    alone (modelled) from step 0, each the mean over the seed pairs with its 95 % interval, and the verdict."""
    lines = ["| question | contrast | seed pairs | at the endpoint | gain per 100 own completions | gain per hour "
             "alone (modelled) | verdict |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for contrast in registered.contrasts:
        experiment = contrast.experiment
        result = data["contrasts"][experiment.name]
        axes = result["per_compute"].get(experiment.primary.name, {})
        per_100, per_hour = (_interval((axes.get(axis) or {}).get("difference")) for axis in ("completions",
                             "alone_seconds"))  # fmt: skip
        lines.append(f"| {contrast.question} | {experiment.name} | {len(result['pairs'])} of "
                     f"{len(experiment.seeds)} | {_interval(result['primary'])} | {per_100} | {per_hour} | "
                     f"{result['primary']['verdict']} |")  # fmt: skip
    by_task = data.get("by_task") or {}
    tasks = tasks_of(by_task)  # each arm's change per task beside its verdict (exploratory: the section below)
    lines += ["", "| arm | seeds | change from step 0 | per 100 own completions | per hour alone (modelled) | "
              f"learning |{''.join(f' change, {task} (exploratory) |' for task in tasks)}",
              "|---|---|---|---|---|---|" + "---|" * len(tasks)]  # fmt: skip
    for label, entry in data["arms"].items():
        if "learning" in entry:
            compute = entry["per_compute"]
            per_task = "".join(f" {c} |" for c in glance_cells(by_task, label)) if tasks else ""
            lines.append(f"| {label} | {len(entry['seeds'])} | {_interval(entry['learning'])} | "
                         f"{_interval(compute.get('completions'))} | {_interval(compute.get('alone_seconds'))} | "
                         f"{entry['learning']['verdict']} |{per_task}")  # fmt: skip
    return lines


def contrast_lines(contrast: Contrast, result: dict[str, Any]) -> list[str]:
    """A contrast's registered figures: the difference at the endpoint, its secondary measures, its gains per
    compute, and its difference of differences."""
    experiment = contrast.experiment
    name = experiment.name
    lines = [*result_lines(name, result["primary"])]
    if not result["pairs"]:
        return lines
    (shared, baseline), own = experiment.ends(), result.get("own_completions") or {}
    if shared != baseline and own:
        lines.append(f"- Own completions generated per peer up to the endpoint (fill-ins included, mean over the seed "
                     f"pairs): {contrast.labels[0]} {own[experiment.shared]:.0f} at {steps_text(shared)}, "
                     f"{contrast.labels[1]} {own[experiment.baseline]:.0f} at {steps_text(baseline)}")  # fmt: skip
    for measure, entry in result["secondary"].items():
        lines += result_lines(f"{measure}: {name}", entry)
    for axes in result["per_compute"].values():
        for axis, entry in axes.items():
            label, unit = COMPUTE_AXES[axis]
            lines += result_lines(f"gain from step 0 per {unit:.0f} {label}: {name}", entry["difference"])
    if "of_differences" in result:
        lines += result_lines(f"({contrast.against}) minus ({name}), the difference of differences (no claim)",
                              result["of_differences"])  # fmt: skip
    return lines


def registered_markdown(registered: Registered, runs: dict[str, list[CampaignRun]], data: dict[str, Any], code: str,
                        argv: Sequence[str], step0: str) -> str:  # fmt: skip
    """The page of an experiment of several contrasts, question by question; ``step0`` names the step-0 reference."""
    lines = [f"# Campaign, experiment `{registered.name}`: {registered.title}", "",
             f"Pre-registration: `{registered.preregistration}`  ",
             *([f"Amended: {registered.amendments}  "] if registered.amendments else []),
             f"Command: `python -m benchmarks.campaign_report {' '.join(argv)}`  ",
             f"Report code: `{code}`; each run's own commit below. Step 0: {step0}.",
             f"What shared the machine during each run: `{registered.machine_log}` at the runs' times.", "",
             "| question | contrast | seed pairs |", "|---|---|---|"]  # fmt: skip
    for contrast in registered.contrasts:
        result = data["contrasts"][contrast.experiment.name]
        role = "primary" if contrast.primary else "secondary"
        lines.append(f"| {contrast.question} | {role}: {contrast.experiment.name} | "
                     f"{coverage(result, contrast.experiment.seeds)} |")  # fmt: skip
    lines += [
        "",
        "At a glance (each contrast's measure, the shared side minus the baseline, mean over the seed "
        "pairs with its 95 % interval over seeds and questions; the sections below give each seed, the plain "
        "t-interval and the arms one by one):",
        "",
        *glance_lines(registered, data),
    ]
    lines += ["", "Every figure: held-out pass@1 at the endpoint, paired by seed and question "
              "(`benchmarks.stats.seeds_and_questions` on the seeds x questions table of differences, the plain "
              "t-interval over the seed pairs beside it). Decision rule, at the registered seed pairs only: a gain if "
              "the 95 % interval's lower bound is above 0, a loss if its upper bound is below 0, otherwise no "
              "difference resolved."]  # fmt: skip
    if data.get("by_task"):
        lines += ["", *task_section(data["by_task"])]
    for question, contrasts in questions(registered).items():
        lines += ["", f"## {question}"]
        for contrast in contrasts:
            experiment, result = contrast.experiment, data["contrasts"][contrast.experiment.name]
            role = "Primary" if contrast.primary else "Secondary (no claim of its own)"
            lines += ["", f"**{role}: {experiment.name}** ({experiment.primary.name}, {endpoint_text(experiment)}): "
                      f"{coverage(result, experiment.seeds)}", "", *contrast_lines(contrast, result)]  # fmt: skip
            if contrast.decides:
                lines.append(f"- It decides {contrast.decides}: {result['primary']['verdict']}.")
        arms = arms_of(replace(registered, contrasts=contrasts), runs)
        mine = [(label, data["arms"][label]) for label in arms if label in data["arms"]]
        if mine:
            lines += ["", "Each arm from step 0 to the endpoint (a change not resolved is no learning), then its "
                      "gain per 100 own completions and per hour of training, as measured (wall-clock on a shared "
                      "machine: read with care) and modelled alone (below):", ""]  # fmt: skip
            for label, entry in mine:
                if "learning" not in entry:
                    lines.append(f"- {label}: {'no step 0 known (--step0)' if entry['seeds'] else 'no run counts yet'}")
                    continue
                lines += result_lines(f"{label}, change", entry["learning"], "seed(s)")
                lines += arm_task_line(label, data.get("by_task") or {})
                for axis, result in entry["per_compute"].items():
                    label_axis, unit = COMPUTE_AXES[axis]
                    lines += result_lines(f"{label}, gain per {unit:.0f} {label_axis}", result, "seed(s)")
            lines += ["", "What filled the slots (group logs, summed over the arm's runs):", ""]
            lines += slots_lines([(label, Counter(entry["slots"])) for label, entry in mine if entry["seeds"]])
        question_runs = {r.run_dir: (c, r) for c in contrasts for r in runs[c.experiment.name]}
        paired = {r.run_dir for c in contrasts for r in runs[c.experiment.name]
                  if r.seed in data["contrasts"][c.experiment.name]["pairs"] and not r.problems}  # fmt: skip
        names = {r.run_dir: label for c, r in question_runs.values()
                 for label, setting in zip(c.labels, (c.experiment.shared, c.experiment.baseline), strict=True)
                 if r.setting == setting}  # fmt: skip
        lines += ["", f"Runs of {question}:", ""]
        lines += run_table([r for _, r in question_runs.values()], contrasts[0].experiment.node_code, paired,
                           lambda run, names=names: names[run.run_dir])  # fmt: skip
        found = {(names[path], run.seed) for path, (_, run) in question_runs.items()}
        registered_runs = dict.fromkeys(
            (label, seed) for c in contrasts for label in c.labels for seed in c.experiment.seeds
        )
        lines += [f"| {label} | {seed} | - | - | - | - | not complete (no run-complete.json found) |"
                  for label, seed in registered_runs if (label, seed) not in found]  # fmt: skip
    lines += ["", *machine_lines(registered, data["machine"]), "", f"![curves](campaign_{registered.name}.png)", ""]
    return "\n".join(lines)


def machine_lines(registered: Registered, machine: dict[str, Any]) -> list[str]:
    """How the per-hour-alone figures were modelled: the runs that had the machine alone and each run's slowdown."""
    lines = ["## Hours on a machine alone (modelled)", ""]
    if not machine["alone_runs"]:
        return [*lines, f"No run is marked alone in `{registered.machine_notes or 'the machine notes'}`: per hour "
                "alone is not reported, only the measured seconds."]  # fmt: skip
    references = "; ".join(f"{arm} {seconds:.2f} s" for arm, seconds in machine["reference_update_seconds"].items())
    lines.append(
        f"Reference: the runs that had the machine alone ({', '.join(machine['alone_runs'])}; "
        f"`{registered.machine_notes}`), their median time a step outside generation per arm ({references}). A "
        "run's seconds alone are its training seconds divided by its slowdown: its own median time outside "
        "generation over its arm's reference (over every arm's where its arm has no run made alone; "
        "benchmarks.compute_report's model: it assumes what shared the machine slowed generation and the update "
        "alike). Slowdowns:"
    )
    lines += ["", "| run | slowdown |", "|---|---|"]
    lines += [f"| {key} | {factor:.2f} |" for key, factor in sorted(machine["slowdown"].items())]
    return lines


def plot_registered(registered: Registered, runs: dict[str, list[CampaignRun]], path: Path) -> None:
    """One row of :func:`arm_panels` per question, its arms the sides of its contrasts."""
    plt = pyplot()
    by_question = questions(registered)
    colours = {label: f"C{i}" for i, label in enumerate(arms_of(registered, runs))}  # an arm keeps its colour
    figure, axes = plt.subplots(len(by_question), 3, figsize=(16, 4.5 * len(by_question)), squeeze=False)
    for row, (question, contrasts) in zip(axes, by_question.items(), strict=True):
        arms = arms_of(replace(registered, contrasts=contrasts), runs)
        arm_panels(row, [(label, mine, contrast.experiment) for label, (contrast, mine) in arms.items()], colours)
        row[0].set_title(question, loc="left", fontweight="bold")
    figure.suptitle(f"Experiment {registered.name}: held-out pass@1 (bars: 95 % t over seeds) and training reward")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
