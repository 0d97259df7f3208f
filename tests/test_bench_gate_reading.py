"""Experiment 4's gate is read as its plan says: six lone learners' per-question change from step 0 to the mean of
steps 30 and 60, a verdict only once both runs are complete."""

from __future__ import annotations

import json
import random
from pathlib import Path

from benchmarks.gate_reading import read_gate


def write_run(runs: Path, seed: int, solved_by_step: dict[int, float], complete: bool = True) -> None:
    run = runs / "cpu-default-equal" / "2-0" / f"seed-{seed}"
    for n in range(3):
        draw = random.Random(seed * 10 + n)
        node = run / f"node-{n}"
        node.mkdir(parents=True)
        lines = []
        for step, rate in solved_by_step.items():
            questions = [
                {"task": f"task{i % 2}", "key": f"q{i}", "correct": draw.random() < rate, "score": 0.0}
                for i in range(64)
            ]
            lines.append(json.dumps({"step": step, "eval": "eval", "questions": questions}))
        (node / "held_out.jsonl").write_text("\n".join(lines) + "\n")
    if complete:
        (run / "run-complete.json").write_text("{}")


def test_learners_that_rise_pass_the_gate_and_flat_ones_do_not(tmp_path):
    rising = {0: 0.1, 15: 0.2, 30: 0.35, 45: 0.4, 60: 0.5}
    for seed in (20, 21):
        write_run(tmp_path / "rising", seed, rising)
        write_run(tmp_path / "flat", seed, {step: 0.2 for step in rising})
    gate = read_gate(tmp_path / "rising")
    assert gate["complete"] and gate["passes"] and len(gate["per_learner"]) == 6 and gate["questions"] == 64
    assert gate["interval"][0] > 0 and 0.2 < gate["change"] < 0.4 and set(gate["per_task"]) == {"task0", "task1"}
    assert gate["interval"][0] <= gate["plain_t_interval"][0]  # the two-way interval holds the plain one
    flat = read_gate(tmp_path / "flat")
    assert flat["complete"] and not flat["passes"] and flat["interval"][0] < 0 < flat["interval"][1]


def test_an_incomplete_run_gives_no_verdict_only_what_its_learners_have_so_far(tmp_path):
    write_run(tmp_path, 20, {0: 0.1, 15: 0.2, 30: 0.3, 45: 0.3, 60: 0.4})
    write_run(tmp_path, 21, {0: 0.1, 15: 0.2}, complete=False)
    gate = read_gate(tmp_path)
    assert not gate["complete"] and "passes" not in gate
    assert set(gate["pass@1 by step"]["seed 21 node-0"]) == {0, 15}
