"""The campaign report's page: the markdown (runs, endpoints with their intervals, what sharing carried, the
exploratory by-task table) and the plot, from what `benchmarks.campaign_report` read and analysed."""

from __future__ import annotations

import datetime
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.campaign_report import COMPUTE_AXES, CampaignRun, Experiment, compute_of, mean_of
from benchmarks.harness import pyplot
from benchmarks.held_out_table import over_seeds_text, paper_label
from benchmarks.sharing_counts import sharing_lines


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
