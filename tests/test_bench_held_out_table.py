"""benchmarks/held_out_table.py on synthetic archives: the mean over peers and its error bound, the same-seed
difference between settings, the interval over seeds, a resumed step's evaluation counted once, and incomplete runs
left out."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest

from benchmarks import held_out_table, stats


def _archive(
    root: Path, setting: str, seed: int, curves: list[list[tuple[int, float, float]]], complete=True, questions=64
):
    run = root / "sapo_table_runs" / "p" / setting / f"seed-{seed}"
    for node, curve in enumerate(curves):
        lines = [{"step": s, "eval/pass@1": p, "eval/pass@1_se": se, "eval/questions": float(questions)}
                 for s, p, se in curve]  # fmt: skip
        lines.insert(1, {"step": 1, "sapo/local_reward": 0.5})  # a training line is not an evaluation
        path = run / f"node-{node}" / "metrics.jsonl"
        path.parent.mkdir(parents=True)
        path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    if complete:
        (run / "run-complete.json").write_text(json.dumps({"code": {"commit": "abc", "dirty": False}}))


def test_held_out_table_arithmetic(tmp_path):
    _archive(tmp_path, "2-0", 0, [[(0, 0.1, 0.03), (30, 0.2, 0.04)], [(0, 0.1, 0.03), (30, 0.4, 0.06)]])
    _archive(tmp_path, "2-0", 1, [[(0, 0.1, 0.03), (30, 0.3, 0.05)]] * 2)
    # the 1-1 run was resumed at step 10 and evaluated it twice: the second line counts
    _archive(tmp_path, "1-1", 0, [[(0, 0.1, 0.03), (10, 0.9, 0.1), (10, 0.2, 0.05), (30, 0.5, 0.06)]] * 2)
    _archive(tmp_path, "1-1", 1, [[(0, 0.1, 0.03), (30, 0.2, 0.05)]] * 2)
    _archive(tmp_path, "1-1", 2, [[(0, 0.1, 0.03), (30, 0.9, 0.01)]] * 2, complete=False)
    data = held_out_table.main(["--profile", "p", "--results-dir", str(tmp_path)])
    runs = {(run["setting"], run["seed"]): run for run in data["runs"]}
    assert set(runs) == {("2-0", 0), ("2-0", 1), ("1-1", 0), ("1-1", 1)}  # the incomplete run is left out
    assert runs[("2-0", 0)]["pass_at_1"] == pytest.approx([0.1, 0.3])
    # the peers' mean error, not sqrt(sum se^2) / peers: identical peers at step 0 keep one peer's error
    assert runs[("2-0", 0)]["standard_error"] == pytest.approx([0.03, 0.05])
    assert runs[("1-1", 0)]["pass_at_1"] == pytest.approx([0.1, 0.2, 0.5])
    result = data["comparison"]["1-1"]
    first = {row["seed"]: row for row in result["per_seed"]}
    assert first[0]["difference"] == pytest.approx(0.2)
    assert first[0]["se"] == pytest.approx(math.hypot(0.06, 0.05))
    assert first[1]["difference"] == pytest.approx(-0.1) and first[1]["se"] == pytest.approx(math.hypot(0.05, 0.05))
    # over seeds, without per-question outcomes: the seed term from the seeds' spread, the question term bounded by
    # the mean per-seed error, squared; each charged at its own t quantile (1 and 63 degrees of freedom)
    seed_term = statistics.stdev([0.2, -0.1]) ** 2 / 2
    question_term = ((math.hypot(0.06, 0.05) + math.hypot(0.05, 0.05)) / 2) ** 2
    over = result["over_seeds"]
    assert not result["paired_by_question"]
    assert over["value"] == pytest.approx(0.05) and over["se"] == pytest.approx(math.sqrt(seed_term + question_term))
    half = math.sqrt(stats.t_quantile(0.975, 1) ** 2 * seed_term + stats.t_quantile(0.975, 63) ** 2 * question_term)
    assert (over["ci_low"], over["ci_high"]) == pytest.approx((0.05 - half, 0.05 + half))
    plain = result["t_over_seeds"]
    assert plain["df"] == 1 and plain["ci_high"] - 0.05 == pytest.approx(12.7062 * math.sqrt(seed_term), rel=1e-4)
    page = (tmp_path / "sapo_table_p_held_out.md").read_text()
    assert "4/4 (run as 1/1), seed 0: +0.200 ± 0.078 (95 % CI" in page
    assert f"question term ± {math.sqrt(question_term):.3f}, bounded by the per-seed errors" in page
    assert f"a gain above {over['ci_high']:+.3f} and a loss below {over['ci_low']:+.3f} excluded" in page
    # learning over seeds: 2-0 changed +0.2 and +0.2 (no spread): the questions' error is all there is
    changes = data["changes"]["2-0"]
    assert changes["over_seeds"]["value"] == pytest.approx(0.2) and changes["t_over_seeds"]["se"] == pytest.approx(0)
    assert changes["over_seeds"]["ci_low"] > 0 and "8/0 (run as 2/0), over 2 seeds:" in page
    assert (tmp_path / "sapo_table_p_held_out.png").exists()


def _outcomes(root: Path, setting: str, seed: int, per_node: list[dict[int, list[int]]]) -> None:
    """held_out.jsonl beside each node's metrics.jsonl: per step, question by question (shuffled order on disk)."""
    for node, by_step in enumerate(per_node):
        lines = []
        for step, correct in by_step.items():
            questions = [
                {"task": "t", "index": i, "correct": bool(c), "score": float(c)} for i, c in enumerate(correct)
            ]
            lines.append(json.dumps({"step": step, "eval": "eval", "questions": questions[::-1]}))
        path = root / "sapo_table_runs" / "p" / setting / f"seed-{seed}" / f"node-{node}" / "held_out.jsonl"
        path.write_text("\n".join(lines) + "\n")


def test_per_question_outcomes_make_the_errors_clustered_and_the_differences_paired(tmp_path):
    # 8 questions; both settings start alike (2 right); at the end 1-1 solves the same questions as 2-0 plus one more.
    start = [1, 1, 0, 0, 0, 0, 0, 0]
    base_end, shared_end = [1, 1, 1, 0, 0, 0, 0, 0], [1, 1, 1, 1, 0, 0, 0, 0]
    for setting, end in (("2-0", base_end), ("1-1", shared_end)):
        pass_at_1 = [(0, sum(start) / 8, 0.15), (30, sum(end) / 8, 0.17)]
        _archive(tmp_path, setting, 0, [pass_at_1, pass_at_1], questions=8)
        _outcomes(tmp_path, setting, 0, [{0: start, 30: end}, {0: start, 30: end}])
    data = held_out_table.main(["--profile", "p", "--results-dir", str(tmp_path)])
    runs = {run["setting"]: run for run in data["runs"]}
    # clustered by question: the error of the 8 per-question means, not the nodes' logged errors
    assert runs["2-0"]["standard_error"][1] == pytest.approx(stats.clustered_mean([base_end] * 2).se)
    assert runs["2-0"]["steps_with_outcomes"] == [0, 30]
    (row,) = data["comparison"]["1-1"]["per_seed"]
    # paired by question: one question apart, the same on both peers
    paired = stats.paired_difference([shared_end] * 2, [base_end] * 2)
    assert row["difference"] == pytest.approx(0.125) and row["se"] == pytest.approx(paired.se)
    assert row["se"] < math.hypot(*runs["2-0"]["standard_error"][1:], *runs["1-1"]["standard_error"][1:])
    assert "every change and difference is paired by question" in (tmp_path / "sapo_table_p_held_out.md").read_text()


def test_over_seeds_the_outcomes_make_a_seeds_by_questions_table(tmp_path):
    # seed 0: 1-1 solves one question more than 2-0; seed 1: two more; 8 questions, 2 identical peers per run
    start = [1, 1, 0, 0, 0, 0, 0, 0]
    ends = {("2-0", 0): [1, 1, 1, 0, 0, 0, 0, 0], ("1-1", 0): [1, 1, 1, 1, 0, 0, 0, 0],
            ("2-0", 1): [1, 1, 0, 0, 0, 0, 0, 0], ("1-1", 1): [1, 1, 0, 0, 1, 1, 0, 0]}  # fmt: skip
    for (setting, seed), end in ends.items():
        pass_at_1 = [(0, sum(start) / 8, 0.15), (30, sum(end) / 8, 0.17)]
        _archive(tmp_path, setting, seed, [pass_at_1, pass_at_1], questions=8)
        _outcomes(tmp_path, setting, seed, [{0: start, 30: end}, {0: start, 30: end}])
    data = held_out_table.main(["--profile", "p", "--results-dir", str(tmp_path)])
    result = data["comparison"]["1-1"]
    table = [[a - b for a, b in zip(ends[("1-1", s)], ends[("2-0", s)], strict=True)] for s in (0, 1)]
    expected = stats.seeds_and_questions(table)
    assert result["paired_by_question"]
    assert result["over_seeds"]["value"] == pytest.approx(0.1875) and result["over_seeds"]["se"] == pytest.approx(
        expected.se
    )
    assert (result["over_seeds"]["ci_low"], result["over_seeds"]["ci_high"]) == pytest.approx(expected.interval())
    assert result["t_over_seeds"] == pytest.approx(stats.t_over_seeds([0.125, 0.25]).to_json())
    change = data["changes"]["1-1"]  # end minus the shared start: two more questions of 8 in both seeds
    assert change["over_seeds"]["value"] == pytest.approx(0.25) and change["paired_by_question"]


def test_specialists_are_split_into_the_task_each_peer_trains_on_and_the_others_tasks(tmp_path):
    # 3 specialists (peer i trains on task i) answer 6 questions, tasks a, b, c, a, b, c. Alone (2-0) each solves
    # only its own task's questions at the end; sharing (1-1) each also solves one question of another task.
    tasks = ["a", "b", "c"]
    question_tasks = ["a", "b", "c", "a", "b", "c"]
    own_only = [[1 if question_tasks[q] == tasks[peer] else 0 for q in range(6)] for peer in range(3)]
    shared = [row[:] for row in own_only]
    for peer in range(3):
        shared[peer][(peer + 1) % 3] = 1  # the first question of the next peer's task
    start = [0] * 6
    identity = {"specialists": True, "tasks": [{"name": t, "config": {}} for t in tasks]}
    for setting, end in (("2-0", own_only), ("1-1", shared)):
        curve = [(0, 0.0, 0.0), (30, sum(map(sum, end)) / 18, 0.1)]
        _archive(tmp_path, setting, 0, [curve] * 3, questions=6)
        run = tmp_path / "sapo_table_runs" / "p" / setting / "seed-0"
        marker = json.loads((run / "run-complete.json").read_text())
        (run / "run-complete.json").write_text(json.dumps({**marker, "identity": identity}))
        for peer in range(3):
            lines = [{"step": step, "eval": "eval", "questions": [
                {"task": question_tasks[q], "index": q, "correct": bool(row[q]), "score": float(row[q])}
                for q in range(6)]} for step, row in ((0, start), (30, end[peer]))]  # fmt: skip
            (run / f"node-{peer}" / "held_out.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    data = held_out_table.main(["--profile", "p", "--results-dir", str(tmp_path)])
    split = data["by_training_task"]
    own = {(r["setting"], r["seed"]): r for r in split["own task"]["changes"]}
    others = {(r["setting"], r["seed"]): r for r in split["others' tasks"]["changes"]}
    assert own[("2-0", 0)]["end"] == pytest.approx(1.0) and own[("1-1", 0)]["end"] == pytest.approx(1.0)
    assert others[("2-0", 0)]["end"] == pytest.approx(0.0)
    # per question of the others' tasks, 1 of its 2 non-training peers solves it on 3 of the 6 questions
    assert others[("1-1", 0)]["end"] == pytest.approx(3 * 0.5 / 6)
    (row,) = split["others' tasks"]["versus_baseline"]["1-1"]["per_seed"]
    assert row["difference"] == pytest.approx(0.25)
    (same,) = split["own task"]["versus_baseline"]["1-1"]["per_seed"]
    assert same["difference"] == pytest.approx(0.0)
    page = (tmp_path / "sapo_table_p_held_out.md").read_text()
    assert "## Specialists" in page and "others' tasks, 4/4 (run as 1/1) minus 8/0 (run as 2/0), seed 0" in page
