"""The pre-registered campaign's report: each experiment's endpoints from its run directories, its page and plot.

Four experiments are registered in ``benchmarks/preregistered/``:

- ``specialists`` (specialists_replicated.md): 3 specialists of ``--profile cpu-hard-specialists``, 8/0 (run as 2/0)
  against 4/4 (1/1), seeds 3-8. Primary: held-out pass@1 at step 60 on the tasks a peer does not train on ("others'
  tasks": per question, the mean of the two peers that do not train on its task), 4/4 minus 8/0. Secondary: the same
  on basic_arithmetic alone, the own task, the gain per compute, what sharing carried.
- ``stronger`` (stronger_peers.md): ``--profile cpu-hard-strong``, nodes 0 and 2 students, 1 and 3 stronger peers,
  4/0 against 2/2, seeds 0-3. Primary: the students' pass@1 at step 60 (the two students averaged question by
  question), 2/2 minus 4/0. Secondary: the gain per compute, what sharing carried (from whom), whether the sampler
  comparison is due (usable groups exceeding the swarm slots in at least half of the steps), the stronger peers'
  own pass@1. Exploratory, not pre-registered: students and stronger peers on each task's questions alone.
- ``replay_generalist_precision`` (replay_generalist_precision.md), every run in float32, evaluated at step 60 only,
  step 0 from one reference evaluation of the untrained model (``--step0``: ``benchmarks.eval_precision``'s
  per-question file). Q1, 3 equal peers of ``cpu-hard-equal``, seeds 10-13: swarm 4/4 (1/1) minus self-replay 4/4r
  (``1-1-replay``), the primary; swarm and self-replay each minus alone 8/0 (2/0); each arm's learning, its gain per
  100 own completions and per hour (as measured, and modelled alone from the runs ``machine_notes.json`` marks
  alone: :func:`benchmarks.campaign_runs.model_alone`), what filled its slots. Q2: the specialists of
  ``cpu-hard-specialists`` at 4/4 minus Q1's 8/0 nodes as generalists, same seeds, every task; per task, per
  compute, the specialists' own task. Q3: experiment 1's seeds 3-5 again in float32 on its node code, others' tasks
  4/4 minus 8/0 and its arms' learning and gain per compute from the same step-0 reference (the untrained model
  scores alike on that code), beside experiment 1's bf16 runs of those seeds (read from
  ``results/campaign/specialists``) and float32 minus bf16 per seed. Exploratory, not pre-registered: every arm's
  change from step 0 and every contrast on each task's questions alone (:mod:`benchmarks.campaign_tasks`), beside
  each arm's "no learning".
- ``default_mix_equal`` (default_mix_equal.md, experiment 4), every run in float32 on the frozen node code of c908829,
  3 equal peers of ``--profile cpu-default-equal`` evaluated at steps 0, 15, 30, 45 and 60, seeds 20, 21 and 23-26
  (26 in place of 22: the plan's amendment). The endpoint value is per question the mean of steps 30 and 60 (it
  rewards learning sooner). Primary: swarm 4/4 (1/1) minus self-replay 4/4r (1/1). Secondary: swarm minus alone 8/0
  (2/0); swarm at step 60 minus alone at step 30, where each peer has generated the same own groups but for fill-ins
  (counted beside it): "a swarm beats the same compute alone"; self-replay minus alone; each arm's learning, gains
  per compute, what filled its slots, per task.

Every figure is paired by seed and question (:mod:`benchmarks.campaign_runs`): a seeds x questions table of
differences whose mean gets the interval of :func:`benchmarks.stats.seeds_and_questions`, with the plain t-interval
over the seed pairs (:func:`benchmarks.stats.t_over_seeds`) beside it. The decision rule is the pre-registration's: a
gain if the 95 % interval's lower bound is above 0, a loss if its upper bound is below 0, otherwise no difference
resolved, with the gain and loss it excludes. A setting whose step-0 to step-60 change is not resolved is reported as
no learning. Only runs that count are used: complete (``run-complete.json``), evaluated with per-question outcomes,
on the registered node code (a commit this clone does not hold is flagged unverified), in the registered precision.
A partial campaign is reported on the seed pairs it has, with how many of the registered ones that is; experiment
3's figures short of them say "incomplete: n of 4 seed pairs" instead of a verdict. Pages: :mod:`benchmarks.
campaign_render`.

``--archive DEST`` first copies every complete run's small files (metrics, held-out outcomes, group logs, senders,
node-run.json, node.log, the harness's markers and node configs; never checkpoints, models or identity keys) to
``DEST/<experiment>/<profile>/<I-J>/seed-S``, the layout of sapo_table's ``--runs-dir``: pointed there, sapo_table
counts an archived run as complete and skips it, and this report reads it like a run directory; under the results
tree the runs' raw files then move into ``results/archive`` (:mod:`benchmarks.results_archive`).

    python -m benchmarks.campaign_report --experiment specialists RUNS_DIR [RUNS_DIR ...]
    python -m benchmarks.campaign_report --experiment stronger RUNS_DIR --archive benchmarks/results/campaign
    python -m benchmarks.campaign_report --experiment replay_generalist_precision RUNS_DIR --step0 STEP0/cpu-fp32.json
    python -m benchmarks.campaign_report --experiment default_mix_equal RUNS_DIR
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.campaign_render import markdown, plot, plot_registered, registered_markdown
from benchmarks.campaign_runs import (  # re-exported: the report's names, importable from here as before
    COMPLETE,
    NODE_CODE,
    CampaignRun,
    Contrast,
    Experiment,
    Measure,
    Registered,
    analyse,
    analyse_registered,
    collect,
    find_run,
    read_campaign_run,
    same_node_code,
    seed_pairs,
)
from benchmarks.campaign_tasks import task_figures
from benchmarks.harness import RESULTS, commit_label, json_safe
from benchmarks.results_archive import RAW_RUN_FILES, pack

__all__ = ["EXPERIMENTS", "REGISTERED", "CampaignRun", "Experiment", "Measure", "Registered", "analyse",
           "analyse_registered", "archive_all", "archive_run", "collect", "main", "read_campaign_run",
           "same_node_code", "seed_pairs", "NODE_CODE"]  # fmt: skip

NODE_FILES = ("metrics.jsonl", "held_out.jsonl", "senders.json", "node-run.json", "node.log", "groups.jsonl*")
RUN_FILES = ("run-complete.json", "attempts.jsonl", "node-config*.yaml")
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

# Experiment 3: Q1 and Q2 on the frozen node code of ef19c58, Q3 on experiment 1's; every run in float32
EXPERIMENT_3 = "benchmarks/preregistered/replay_generalist_precision.md"
HARD_TASKS = ("basic_arithmetic", "count_bits", "chain_sum")
EVERY_TASK = Measure("every task, the three peers averaged")
GENERALIST_OWN = Measure("own task (a generalist's: every task)", own_task=True)
FROZEN = dict(seeds=(10, 11, 12, 13), step=60, receivers=None, node_code="ef19c58", precision="float32",
              eval_on_start=False, preregistration=EXPERIMENT_3, primary=EVERY_TASK,
              per_compute=(EVERY_TASK,))  # fmt: skip
SWARM, REPLAY, ALONE = "swarm 4/4 (1/1)", "self-replay 4/4r (1/1)", "alone 8/0 (2/0, the generalists)"
Q3 = dict(seeds=(3, 4, 5), secondary=(), per_compute=(), preregistration=EXPERIMENT_3)
Q3_FLOAT32 = dict(Q3, per_compute=(OTHERS_TASKS,))  # from the step-0 reference, as every float32 arm (the ask)


def _equal(name: str, shared: str, baseline: str) -> Experiment:
    return Experiment(name=name, profile="cpu-hard-equal", baseline=baseline, shared=shared, secondary=(), **FROZEN)


REGISTERED = {
    "replay_generalist_precision": Registered(
        name="replay_generalist_precision", title="the replay, generalist and precision controls",
        preregistration=EXPERIMENT_3,
        machine_log="benchmarks/results/campaign/replay_generalist_precision/shared_machine.log",
        machine_notes="benchmarks/results/campaign/replay_generalist_precision/machine_notes.json", contrasts=(
            Contrast("Q1, the replay control (3 equal peers)", True,
                     _equal("swarm 4/4 minus self-replay 4/4r", "1-1", "1-1-replay"), (SWARM, REPLAY)),
            Contrast("Q1, the replay control (3 equal peers)", False,
                     _equal("swarm 4/4 minus alone 8/0", "1-1", "2-0"), (SWARM, ALONE)),
            Contrast("Q1, the replay control (3 equal peers)", False,
                     _equal("self-replay 4/4r minus alone 8/0", "1-1-replay", "2-0"), (REPLAY, ALONE),
                     decides="the default of `replay` (`fill` from the next release if a resolved gain, else `off`)"),
            Contrast("Q2, specialists in a swarm against generalists alone", True, Experiment(
                name="specialists 4/4 minus generalists 8/0", profile="cpu-hard-specialists", shared="1-1",
                baseline="2-0", baseline_profile="cpu-hard-equal", secondary=(
                    *(Measure(f"{task} questions", task=task) for task in HARD_TASKS), GENERALIST_OWN,
                    *(replace(GENERALIST_OWN, name=f"own task, {task} questions", task=task) for task in HARD_TASKS)),
                **FROZEN), ("specialists 4/4 (1/1)", ALONE)),
            Contrast("Q3, experiment 1 in float32", True, replace(
                EXPERIMENTS["specialists"], name="float32: 4/4 minus 8/0", precision="float32", eval_on_start=False,
                **Q3_FLOAT32), ("float32 4/4 (1/1)", "float32 8/0 (2/0)")),
            Contrast("Q3, experiment 1 in float32", False, replace(
                EXPERIMENTS["specialists"], name="bf16, experiment 1's runs: 4/4 minus 8/0",
                runs_dirs=(RESULTS / "campaign" / "specialists",), **Q3),
                ("bf16 4/4 (experiment 1)", "bf16 8/0 (experiment 1)"), against="float32: 4/4 minus 8/0"),
        ),
    ),
}  # fmt: skip

# Experiment 4: 3 equal peers on the default mix at the node's defaults, where a node learns; frozen node code of
# c908829, every run in float32, evaluated at steps 0, 15, 30, 45 and 60; the endpoint value is the mean of steps 30
# and 60 (it rewards learning sooner); seed 26 in place of seed 22 (the plan's amendment)
EXPERIMENT_4 = "benchmarks/preregistered/default_mix_equal.md"
FROZEN_4 = dict(profile="cpu-default-equal", seeds=(20, 21, 23, 24, 25, 26), step=60, receivers=None,
                node_code="c908829", precision="float32", preregistration=EXPERIMENT_4, primary=EVERY_TASK,
                secondary=(), endpoint=(30, 60))  # fmt: skip
SWARM_4, REPLAY_4, ALONE_4 = "swarm 4/4 (1/1)", "self-replay 4/4r (1/1)", "alone 8/0 (2/0)"
SHARING_4 = "Experiment 4: sharing where a node learns (3 equal peers, the default mix)"


def _default_mix(name: str, shared: str, baseline: str, **fields: Any) -> Experiment:
    return Experiment(name=name, shared=shared, baseline=baseline, **{"per_compute": (EVERY_TASK,), **FROZEN_4,
                                                                      **fields})  # fmt: skip


REGISTERED["default_mix_equal"] = Registered(
    name="default_mix_equal", title="sharing where a node learns", preregistration=EXPERIMENT_4,
    machine_log="benchmarks/results/campaign/default_mix_equal/shared_machine.log",
    amendments="seed 26 in place of seed 22 (2026-11-30, before seed 26's first run; seed 22's other arms wait for the "
    "CPU model its alone arm ran on, which no session has had since): the analysis is of seeds 20, 21, 23, 24, 25 and "
    "26; seed 22's alone arm is kept in the archive, outside it.", contrasts=(
        Contrast(SHARING_4, True, _default_mix("swarm 1/1 minus self-replay 1/1", "1-1", "1-1-replay"),
                 (SWARM_4, REPLAY_4), decides="whether a peer's swarm groups make it learn sooner than its own replay"),
        Contrast(SHARING_4, False, _default_mix("swarm 1/1 minus alone 2/0", "1-1", "2-0"), (SWARM_4, ALONE_4)),
        Contrast(SHARING_4, False, _default_mix(
            "swarm 1/1 at step 60 minus alone 2/0 at step 30 (equal own compute)", "1-1", "2-0", per_compute=(),
            endpoint=(60,), baseline_endpoint=(30,)), (SWARM_4, ALONE_4),
            decides="whether a swarm beats the same compute alone (a peer that has spent the same own generation)"),
        Contrast(SHARING_4, False, _default_mix("self-replay 1/1 minus alone 2/0", "1-1-replay", "2-0"),
                 (REPLAY_4, ALONE_4)),
    ),
)  # fmt: skip


def with_step0(registered: Registered, step0: tuple[tuple[str, float], ...]) -> Registered:
    """``registered`` with the step-0 reference as the start of every contrast that reports gains from step 0 and
    whose runs do not evaluate it themselves."""
    return replace(registered, contrasts=tuple(
        replace(c, experiment=replace(c.experiment, step0=step0))
        if c.experiment.per_compute and not c.experiment.eval_on_start else c
        for c in registered.contrasts))  # fmt: skip


def read_step0(path: Path) -> tuple[tuple[str, float], ...]:
    """The untrained model's per-question outcomes as ``(task, outcome)`` from ``benchmarks.eval_precision``'s file
    (``DIR/<device>-fp32.json``, or ``DIR`` holding one such file)."""
    if not path.exists():
        raise SystemExit(f"--step0 {path}: no such file or folder (the --out DIR of benchmarks.eval_precision)")
    if path.is_dir():
        found = sorted(path.glob("*-fp32.json"))
        if len(found) != 1:
            raise SystemExit(f"--step0 {path}: expected one *-fp32.json there (python -m benchmarks.eval_precision "
                             f"--precisions fp32 --out DIR writes it), found {len(found)}")  # fmt: skip
        path = found[0]
    try:
        return tuple((str(row["task"]), 1.0 if row["correct"] else 0.0) for row in json.loads(path.read_text()))
    except (OSError, ValueError, TypeError, KeyError) as error:
        raise SystemExit(f"--step0 {path}: not benchmarks.eval_precision's per-question file (a JSON list of "
                         f"{{task, correct, ...}} rows in question order): {error!r}") from None  # fmt: skip


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


def archive_all(runs_dirs: Sequence[Path], experiment: Experiment | Registered, archive: Path) -> list[Path]:
    """Archive every complete run of the experiment (of each contrast, but those read from archived originals)
    found under ``runs_dirs`` into ``archive/<experiment>``, whose ``.gitignore`` keeps out the checkpoints and keys
    of a run that sapo_table resumes there. Under the results tree the runs' raw files (metrics, group logs, node
    logs) then go into ``results/archive/<folder>_<experiment>.tar.xz``, from which the reports read them."""
    (archive / experiment.name).mkdir(parents=True, exist_ok=True)
    (archive / experiment.name / ".gitignore").write_text("".join(f"{pattern}\n" for pattern in ARCHIVE_IGNORE))
    parts = [c.experiment for c in experiment.contrasts] if isinstance(experiment, Registered) else [experiment]
    wanted = dict.fromkeys((profile, setting, seed) for part in parts if not part.runs_dirs for seed in part.seeds
                           for profile, setting in reversed(part.sides()))  # fmt: skip
    done = []
    for profile, setting, seed in wanted:
        path = find_run(runs_dirs, profile, setting, seed)
        if path is not None:
            done.append(archive_run(path, archive / experiment.name / profile / setting / f"seed-{seed}"))
    if archive.resolve().is_relative_to(RESULTS.resolve()):
        raw = [f for pattern in RAW_RUN_FILES for f in (archive / experiment.name).glob(f"**/node-*/{pattern}")]
        pack(f"{archive.name}_{experiment.name}", raw)
    return done


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.campaign_report", description=__doc__.split("\n")[0])
    parser.add_argument("runs_dirs", nargs="+", type=Path, help="run directories (sapo_table --runs-dir) or archives")
    parser.add_argument("--experiment", choices=sorted([*EXPERIMENTS, *REGISTERED]), required=True)
    parser.add_argument("--results-dir", type=Path, default=RESULTS / "campaign", help="where the page goes")
    parser.add_argument(
        "--archive", type=Path, default=None, metavar="DEST", help="first copy complete runs' small files to "
        "DEST/<experiment>/<profile>/<I-J>/seed-S (e.g. benchmarks/results/campaign) and read them there",
    )  # fmt: skip
    parser.add_argument(
        "--step0", type=Path, default=None, metavar="FILE", help="experiment 3: the untrained model's per-question "
        "outcomes, every arm's step 0 (benchmarks.eval_precision --precisions fp32 --out DIR: DIR/cpu-fp32.json); "
        "without it learning and gains from step 0 are not reported",
    )  # fmt: skip
    return parser.parse_args(argv)


def _run_rows(runs: Sequence[CampaignRun]) -> list[dict[str, Any]]:
    return [{"setting": r.setting, "seed": r.seed, "run_dir": str(r.run_dir), "code": r.marker.get("code"),
             "node_code": r.node_code, "problems": r.problems, "completions": r.completions,
             "seconds": r.seconds, "update_seconds": r.update_seconds, "alone_seconds": r.alone_seconds}
            for r in runs]  # fmt: skip


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Archive (if asked), read the runs, write campaign_<experiment>.{md,json,png} and print the page."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    experiment = EXPERIMENTS.get(args.experiment) or REGISTERED[args.experiment]
    if args.step0 is not None and isinstance(experiment, Experiment):
        raise SystemExit(f"--step0 is for experiments whose runs skip step 0 ({', '.join(REGISTERED)}); "
                         f"{experiment.name}'s runs evaluate their own step 0")  # fmt: skip
    code = commit_label()  # before the outputs change the tree
    runs_dirs = list(args.runs_dirs)
    if args.archive is not None:
        archived = archive_all(runs_dirs, experiment, args.archive)
        print(f"archived {len(archived)} complete run(s) under {args.archive / experiment.name}")
        runs_dirs.insert(0, args.archive / experiment.name)
    results = args.results_dir
    results.mkdir(parents=True, exist_ok=True)
    stem = results / f"campaign_{experiment.name}"
    if isinstance(experiment, Registered):
        step0 = None if args.step0 is None else read_step0(args.step0)
        own_start = all(c.experiment.eval_on_start for c in experiment.contrasts)
        note = ("each run's own evaluation at step 0" if step0 is None and own_start else
                "no reference given (--step0): learning and gains from step 0 not reported" if step0 is None else
                f"`{args.step0}`, pass@1 {sum(o for _, o in step0) / len(step0):.3f} on {len(step0)} questions, "
                "every arm's start where its runs skip step 0")  # fmt: skip
        registered = experiment if step0 is None else with_step0(experiment, step0)
        by_contrast, data = analyse_registered(runs_dirs, registered)
        data["by_task"] = task_figures(registered, by_contrast)  # exploratory: beside every arm's "no learning"
        plot_registered(registered, by_contrast, stem.with_suffix(".png"))
        page = registered_markdown(registered, by_contrast, data, code, argv, note)
        data["runs"] = {name: _run_rows(runs) for name, runs in by_contrast.items()}
    else:
        runs = collect(runs_dirs, experiment)
        data = analyse(runs, experiment)
        plot(experiment, runs, data["pairs"], stem.with_suffix(".png"))
        page = markdown(experiment, runs, data, code, argv)
        data["runs"] = _run_rows(runs)
    stem.with_suffix(".md").write_text(page)
    stem.with_suffix(".json").write_text(json.dumps(json_safe(data), indent=1) + "\n")
    print(page)
    return data


if __name__ == "__main__":
    main()
