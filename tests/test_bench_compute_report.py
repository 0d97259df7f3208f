"""benchmarks/compute_report.py on a synthetic archive: own completions count fill-ins, seconds are rescaled to the
lone run, values are interpolated at a matched budget and paired by seed, times to a level, cumulative reward."""

from __future__ import annotations

import json
import math
import random
import statistics
from pathlib import Path

import pytest

from benchmarks import compute_report, held_out_table


def _run(
    root: Path,
    setting: str,
    seed: int,
    evals: dict[int, float],
    step_time: float,
    generation: float,
    fill=0.0,
    questions=64,
):
    run = root / "sapo_table_runs" / "p" / setting / f"seed-{seed}"
    local = int(setting.split("-")[0])
    for node in range(2):
        lines = []
        for step in range(5):
            if step in evals:
                lines.append(
                    {"step": step, "eval/pass@1": evals[step], "eval/pass@1_se": 0.04, "eval/questions": questions}
                )
            if step > 0:
                lines.append(
                    {
                        "step": step,
                        "step_time": step_time,
                        "sapo/time/generation": generation,
                        "sapo/fill_ins": fill,
                        "sapo/local_reward": 0.1 * step + 0.05 * node,
                    }
                )
        path = run / f"node-{node}" / "metrics.jsonl"
        path.parent.mkdir(parents=True)
        path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    identity = {"num_local": local, "num_generations": 4}
    marker = {"identity": identity, "code": {"commit": "abc", "dirty": False}}
    (run / "run-complete.json").write_text(json.dumps(marker))


def test_compute_report_on_a_synthetic_archive(tmp_path):
    # 8/0 (2-0): 8 own completions a step; seed 0 had the machine alone (update 6 s), seed 1 ran twice as slow
    _run(tmp_path, "2-0", 0, {0: 0.1, 2: 0.2, 4: 0.3}, step_time=10.0, generation=4.0)
    _run(tmp_path, "2-0", 1, {0: 0.1, 2: 0.2, 4: 0.3}, step_time=20.0, generation=8.0)
    # 4/4 (1-1): 4 own completions a step plus one fill-in group every other step (0.5 a step on average)
    _run(tmp_path, "1-1", 0, {0: 0.1, 2: 0.2, 4: 0.25}, step_time=9.0, generation=3.0, fill=0.5)
    _run(tmp_path, "1-1", 1, {0: 0.1, 2: 0.3, 4: 0.35}, step_time=9.0, generation=3.0, fill=0.5)
    notes = {"runs": {"2-0/seed-0": {"alone": True, "note": "alone"}, "2-0/seed-1": {"alone": False, "note": "x"}}}
    (tmp_path / "sapo_table_runs" / "p" / "machine_notes.json").write_text(json.dumps(notes))
    data = compute_report.main(["--profile", "p", "--results-dir", str(tmp_path)])
    runs = {run["run"]: run for run in data["runs"]}
    assert runs["2-0/seed-0"]["own_completions"] == [0, 8, 16, 24, 32]
    assert runs["1-1/seed-0"]["own_completions"] == [0, 6, 12, 18, 24]  # (1 + 0.5) x 4 a step
    assert runs["2-0/seed-1"]["slowdown"] == pytest.approx(2.0)  # update 12 s against the lone run's 6 s
    assert runs["2-0/seed-1"]["alone_seconds"][-1] == pytest.approx(40.0)  # 4 steps of 20 s, halved
    assert runs["1-1/seed-0"]["alone_seconds"][-1] == pytest.approx(36.0)  # update 6 s: as fast as the lone run
    assert runs["2-0/seed-1"]["machine"]["alone"] is False and runs["1-1/seed-1"]["machine"]["note"] == "not recorded"
    # at 24 own completions (the most every run reached): 1-1 is at its end (0.25, 0.35), 2-0 at step 3 (0.25)
    matched = data["matched"]["own_completions"]
    assert matched["budget"] == 24
    per_seed = {row["seed"]: row for row in matched["1-1"]["per_seed"]}
    assert per_seed[0]["value"] == pytest.approx(0.0) and per_seed[1]["value"] == pytest.approx(0.1)
    assert per_seed[0]["se"] == pytest.approx(math.hypot(0.04, 0.04))  # no per-question outcomes: unpaired
    over = matched["1-1"]["over_seeds"]
    assert over["value"] == pytest.approx(0.05) and not matched["1-1"]["paired_by_question"]
    # the seed term from the two seeds' spread, the question term bounded by the per-seed errors
    assert over["se"] == pytest.approx(math.sqrt(statistics.variance([0.0, 0.1]) / 2 + 2 * 0.04**2))
    assert matched["1-1"]["t_over_seeds"]["se"] == pytest.approx(statistics.stdev([0.0, 0.1]) / math.sqrt(2))
    # per step the budget is 4 steps: 1-1 minus 2-0 is -0.05 and +0.05
    assert data["matched"]["steps"]["1-1"]["over_seeds"]["value"] == pytest.approx(0.0)
    # gain per 100 own completions: 0.2 over 32 (2-0) and 0.15, 0.25 over 24 (1-1)
    gains = data["gain_per_completions"]
    assert gains["per_run"]["2-0/seed-0"]["value"] == pytest.approx(0.2 * 100 / 32)
    assert gains["1-1"]["minus_baseline"]["over_seeds"]["value"] == pytest.approx(0.2 * 100 / 24 - 0.2 * 100 / 32)
    # time to 2-0's final level 0.3: 2-0 at step 4; 1-1 seed 1 between steps 2 and 4 (0.3 reached at step 2)
    level = data["time_to_accuracy"]["0.300"]
    assert level["2-0"]["steps"]["per_seed"] == {0: 4.0, 1: 4.0}
    assert level["1-1"]["steps"]["per_seed"] == {0: None, 1: 2.0} and level["1-1"]["steps"]["reached"] == 1
    assert level["1-1"]["own_completions"]["per_seed"][1] == pytest.approx(12.0)
    # cumulative reward: per node sum over steps 1-4 of 0.1 x step (+0.05 for node 1) = 1.0 and 1.2
    assert data["cumulative_reward"]["per_run"]["2-0/seed-0"] == pytest.approx(2.2)
    page = (tmp_path / "sapo_table_p_compute.md").read_text()
    assert "Only 2-0/seed-0 had the machine alone; 3 of 4 runs shared it" in page
    assert (tmp_path / "sapo_table_p_compute.png").exists()


def test_crossing_and_value_at():
    assert compute_report.crossing([0, 10, 20], [0.1, 0.2, 0.4], 0.3) == pytest.approx(15.0)
    assert compute_report.crossing([0, 10, 20], [0.1, 0.2, 0.4], 0.5) is None
    assert compute_report.crossing([0, 10], [0.3, 0.2], 0.25) == 0


def test_a_baseline_that_did_not_gain_leaves_no_level_to_time(tmp_path):
    # 8/0 ends below its start: a level between them would be "reached" by every run at step 0
    _run(tmp_path, "2-0", 0, {0: 0.2, 2: 0.15, 4: 0.1}, step_time=10.0, generation=4.0)
    _run(tmp_path, "1-1", 0, {0: 0.2, 2: 0.25, 4: 0.2}, step_time=10.0, generation=4.0)
    data = compute_report.main(["--profile", "p", "--results-dir", str(tmp_path)])
    assert data["time_to_accuracy"] == {}
    page = (tmp_path / "sapo_table_p_compute.md").read_text()
    assert "8/0 (run as 2/0) ends at or below its start on average (no gain)" in page


def test_with_per_question_outcomes_the_difference_is_paired_as_in_held_out_table(tmp_path):
    """The same figure, 4/4 minus 8/0 at the last step, from both reports: one paired computation (by seed and by
    question), not a paired one in held_out_table and an unpaired one here."""
    rng = random.Random(0)
    for setting in ("2-0", "1-1"):
        for seed in (0, 1, 2):
            solved = {step: [float(rng.random() < 0.1 + 0.05 * step) for _ in range(16)] for step in (0, 2, 4)}
            _run(tmp_path, setting, seed, {s: sum(v) / 16 for s, v in solved.items()}, 10.0, 4.0, questions=16)
            for node in range(2):
                lines = [{"step": step, "questions": [{"task": "t", "index": i, "correct": bool(c)}
                         for i, c in enumerate(values)]} for step, values in solved.items()]  # fmt: skip
                path = tmp_path / "sapo_table_runs" / "p" / setting / f"seed-{seed}" / f"node-{node}" / "held_out.jsonl"
                path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    data = compute_report.main(["--profile", "p", "--results-dir", str(tmp_path)])
    table = held_out_table.main(["--profile", "p", "--results-dir", str(tmp_path)])
    per_step = data["matched"]["steps"]["1-1"]
    assert per_step["paired_by_question"]
    mine, theirs = per_step["over_seeds"], table["comparison"]["1-1"]["over_seeds"]
    assert [mine[k] for k in ("value", "se", "ci_low", "ci_high")] == pytest.approx(
        [theirs[k] for k in ("value", "se", "ci_low", "ci_high")]
    )
    assert mine["terms"][1]["df"] == 15  # the question term: 16 questions
    assert per_step["t_over_seeds"] == pytest.approx(table["comparison"]["1-1"]["t_over_seeds"])


def test_slowdowns_set_each_run_against_the_lone_runs_of_its_arm():
    """The one model of a machine alone both reports use: a run's slowdown is its time outside generation over the
    mean of its arm's runs made alone; an arm without one falls back on every lone run; a run without times (nan)
    gets none; without a lone run there is no model."""
    seconds = {
        "a/seed-1": 6.0,
        "a/seed-2": 9.0,
        "b/seed-1": 8.0,
        "b/seed-2": 12.0,
        "c/seed-1": 14.0,
        "c/seed-2": math.nan,
    }

    def arm(key):
        return key.split("/")[0]

    references, slowdown = compute_report.slowdowns(seconds, {"a/seed-1", "b/seed-1"}, arm=arm)
    assert references == {"a": 6.0, "b": 8.0, "every arm": 7.0}
    assert list(references) == ["a", "b", "every arm"]  # in order, so that a re-run writes the same page
    assert slowdown == {"a/seed-1": 1.0, "a/seed-2": 1.5, "b/seed-1": 1.0, "b/seed-2": 1.5, "c/seed-1": 2.0}
    _, one_arm = compute_report.slowdowns(seconds, {"a/seed-1", "b/seed-1"})  # compute_report's: one reference
    assert one_arm["b/seed-2"] == pytest.approx(12.0 / 7.0)
    assert compute_report.slowdowns(seconds, {"c/seed-2"}) == ({}, {})
