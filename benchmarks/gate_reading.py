"""Experiment 4's gate read from the alone arm's kept files: did six lone learners' held-out pass@1 rise?

The plan (`benchmarks/preregistered/default_mix_equal.md`, "Gate first"): the three nodes of an alone run share
nothing, so seeds 20 and 21 give six independent learners. Per learner and question, the change from step 0 to the
endpoint (the mean of the outcomes at steps 30 and 60); over the learners x questions table,
:func:`benchmarks.stats.seeds_and_questions`, with the plain t-interval over learners beside it. The gate passes if
the former's 95 % lower bound is above 0. A run without its ``run-complete.json`` gives no verdict: its learners are
listed as interim, with what they have so far.

    python -m benchmarks.gate_reading --runs-dir RUNS     # RUNS/cpu-default-equal/2-0/seed-20, seed-21
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from benchmarks.results_archive import restored
from benchmarks.stats import seeds_and_questions, t_over_seeds
from sapo.jsonl_files import read_jsonl

PROFILE, ARM, SEEDS = "cpu-default-equal", "2-0", (20, 21)
START, ENDPOINT = 0, (30, 60)


def node_outcomes(node: Path) -> dict[int, dict[str, tuple[str, float]]]:
    """``{step: {question key: (task, outcome)}}`` from a node's ``held_out.jsonl`` (the last record of a step wins:
    a restart may evaluate a step again)."""
    steps: dict[int, dict[str, tuple[str, float]]] = {}
    for record in read_jsonl(node / "held_out.jsonl"):  # its rotated files first
        steps[int(record["step"])] = {q["key"]: (q["task"], float(q["correct"])) for q in record["questions"]}
    return steps


def learner_changes(steps: dict[int, dict[str, tuple[str, float]]]) -> dict[str, tuple[str, float]] | None:
    """Per question, the endpoint's mean outcome minus step 0's; None until every step needed is evaluated."""
    if any(step not in steps for step in (START, *ENDPOINT)):
        return None
    start = steps[START]
    return {
        key: (task, statistics.fmean(steps[s][key][1] for s in ENDPOINT) - outcome)
        for key, (task, outcome) in start.items()
    }


def read_gate(runs_dir: Path, seeds: tuple[int, ...] = SEEDS) -> dict[str, Any]:
    """The gate's figures: every learner's state, and the verdict once every run is complete."""
    learners, interim, complete = {}, {}, True
    for seed in seeds:
        run = runs_dir / PROFILE / ARM / f"seed-{seed}"
        complete &= (run / "run-complete.json").exists()
        for node in sorted(restored(run).glob("node-*")) if run.exists() else []:  # archived files put back
            if not (node / "held_out.jsonl").exists():
                continue
            steps = node_outcomes(node)
            name = f"seed {seed} {node.name}"
            interim[name] = {step: statistics.fmean(o for _, o in q.values()) for step, q in sorted(steps.items())}
            changes = learner_changes(steps)
            if changes is not None:
                learners[name] = changes
    result: dict[str, Any] = {"pass@1 by step": interim, "complete": complete and len(learners) == 3 * len(seeds)}
    if not result["complete"]:
        return result
    keys = sorted(set.intersection(*(set(c) for c in learners.values())))
    table = [[changes[key][1] for key in keys] for changes in learners.values()]
    estimate = seeds_and_questions(table)
    low, high = estimate.interval()
    tasks = sorted({learners[next(iter(learners))][key][0] for key in keys})
    per_task = {}
    for task in tasks:
        columns = [i for i, key in enumerate(keys) if learners[next(iter(learners))][key][0] == task]
        per_task[task] = statistics.fmean(row[i] for row in table for i in columns)
    plain = t_over_seeds([statistics.fmean(row) for row in table])
    result.update(
        questions=len(keys),
        change=estimate.value,
        interval=[low, high],
        plain_t_interval=list(plain.interval()),
        per_learner={name: statistics.fmean(row) for name, row in zip(learners, table, strict=True)},
        per_task=per_task,
        passes=bool(low > 0),
    )
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Print the gate's reading (JSON) for ``--runs-dir``."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gate_reading", description=__doc__.splitlines()[0])
    parser.add_argument("--runs-dir", type=Path, required=True, help="sapo_table's --runs-dir of the gate")
    result = read_gate(parser.parse_args(argv).runs_dir)
    print(json.dumps(result, indent=1, default=str))
    return result


if __name__ == "__main__":
    main()
