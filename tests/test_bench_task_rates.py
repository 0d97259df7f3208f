"""benchmarks/task_rates.py: the node's scoring of a group, the informative-groups prediction by hand, and a smoke
run on a tiny model whose written rates agree with its raw rewards."""

from __future__ import annotations

import json

import pytest

from benchmarks import stats, task_rates
from sapo.tasks import TaskSpec, build_reasoning_gym_dataset


def test_score_group_is_the_nodes_reward():
    row = build_reasoning_gym_dataset([TaskSpec("basic_arithmetic", {"min_terms": 2, "max_terms": 2})], size=1)[0]
    entry = json.loads(row["entry"])
    right, wrong = f"<answer>{entry['answer']}</answer>", "<answer>not a number</answer>"
    total, correct = task_rates.score_group(row, [right, wrong, "no tags"], with_format=True)
    assert correct[0] == 1.0 and correct[1] < 1.0 and correct[2] < 1.0
    assert total[0] == pytest.approx(1.1) and total[1] == pytest.approx(correct[1] + 0.1)  # format: answer tags
    assert task_rates.score_group(row, [right, wrong], with_format=False)[0] == correct[:2]


def test_predict_informative_by_hand():
    # 8/0: 8 own groups with spread at rate 0.25
    assert task_rates.predict_informative(0.25, 8, 0, 4)["informative"] == pytest.approx(2.0)
    # 1/1 in 4 peers: 3 candidates; P(at least one has spread) = 1 - 0.5^3 = 0.875 is taken, the rest filled in
    one = task_rates.predict_informative(0.5, 1, 1, 4)
    assert one["external_taken"] == pytest.approx(0.875) and one["own_groups_generated"] == pytest.approx(1.125)
    assert one["informative"] == pytest.approx(1.125 * 0.5 + 0.875)
    # with no spread anywhere nothing is informative, however many peers
    assert task_rates.predict_informative(0.0, 4, 4, 8)["informative"] == 0.0


def test_smoke_run_on_a_tiny_model(tiny_model_a, tmp_path):
    out = tmp_path / "rates"
    args = ["--model", str(tiny_model_a), "--tasks", "default", "--groups", "3", "--num-generations", "2"]
    data = task_rates.main([*args, "--max-new-tokens", "4", "--out", str(out)])
    assert len(data["tasks"]) == 4 and data["num_generations"] == 2
    for key, rates in data["tasks"].items():
        raw = data["raw"][key]
        assert len(raw["total"]) == 3 and all(len(group) == 2 for group in raw["total"])
        spread = sum(len(set(group)) > 1 for group in raw["total"])
        assert rates["spread"]["count"] == spread and rates["spread"]["n"] == 3
        assert (rates["spread"]["ci_low"], rates["spread"]["ci_high"]) == pytest.approx(
            stats.wilson_interval(spread, 3)
        )
    prediction = data["predictions"]["default mix"]["settings"]["4/4, 4 peers [spread]"]
    assert prediction["of"] == 8 and 0 <= prediction["informative"] <= 8
    page = (tmp_path / "rates.md").read_text()
    assert "| basic_arithmetic |" in page and "### default mix" in page
    assert json.loads((tmp_path / "rates.json").read_text())["groups"] == 3


def test_report_only_merges_measurements(tmp_path):
    raw = {"total": [[1.1, 0.1], [0.0, 0.0]], "correct": [[1.0, 0.0], [0.0, 0.0]]}
    key = 'gcd {"max_value":20}'
    part = {
        "command": "python -m benchmarks.task_rates x",
        "code": "abc",
        "date": "d",
        "machine": "m",
        "groups": 2,
        "seed": 0,
        "seconds": 1.0,
        "model": "default",
        "num_generations": 2,
        "max_new_tokens": 48,
        "temperature": 1.0,
        "format_reward": True,
        "tasks": {key: {"note": "n"}},
        "raw": {key: raw},
    }
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    first.write_text(json.dumps(part))
    second.write_text(json.dumps(part | {"seed": 1, "raw": {key: {"total": [[0.0, 1.0]], "correct": [[0.0, 1.0]]}}}))
    data = task_rates.main(["--report-only", str(first), str(second), "--out", str(tmp_path / "merged")])
    rates = data["tasks"][key]
    assert rates["groups"] == 3 and rates["spread"]["count"] == 2 and rates["mixed_success"]["count"] == 2
    assert [m["seed"] for m in data["measurements"]] == [0, 1]
    assert data["proposed_hard_mix"] == []  # spread in 2 of 3 groups: the mix would not be hard for one peer
    second.write_text(json.dumps(part | {"max_new_tokens": 64}))
    with pytest.raises(SystemExit, match="other settings"):
        task_rates.main(["--report-only", str(first), str(second), "--out", str(tmp_path / "merged")])


def test_propose_hard_mix_keeps_the_mix_inside_the_band():
    def rates(spread, mixed):
        return {"spread": {"rate": spread}, "mixed_success": {"rate": mixed}}

    measured = {
        "easy": rates(0.8, 0.6),
        "never-solved": rates(0.1, 0.0),  # spread from partial credit only: nothing verified to learn from
        "hard": rates(0.1, 0.1),
        "medium": rates(0.3, 0.2),
        "medium-more-solved": rates(0.3, 0.3),
        "too-much": rates(0.5, 0.3),
    }
    # hard (0.1), then the tie at 0.3 by mixed success: mix spread 0.2, then 0.233; adding too-much would give 0.3
    assert task_rates.propose_hard_mix(measured) == ["hard", "medium-more-solved", "medium"]
    assert task_rates.propose_hard_mix(measured, target=0.15) == ["hard"]


def test_observed_runs_reads_the_share_of_groups_with_spread_from_a_profiles_archive(tmp_path):
    # Two peers of a 1/1 run: in steps 1-5 half of the trained groups have spread on one, all on the other; the step
    # 0 evaluation row and later steps are not counted.
    for node, zero_std in (("node-0", 0.5), ("node-1", 0.0)):
        metrics = tmp_path / "sapo_table_runs" / "cpu-hard" / "1-1" / "seed-0" / node / "metrics.jsonl"
        metrics.parent.mkdir(parents=True)
        rows = [{"step": 0, "eval/pass@1": 0.1}] + [{"step": s, "frac_reward_zero_std": zero_std} for s in range(1, 6)]
        rows.append({"step": 6, "frac_reward_zero_std": 1.0})
        metrics.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    text = task_rates.observed_runs(tmp_path, "cpu-hard")
    assert text.startswith("1-1: 0.75 of the trained groups had reward spread in steps 1-5, 1.50 informative groups")
    assert "(10 peer-steps of 2 groups" in text
    assert task_rates.observed_runs(tmp_path, "cpu-learn") is None  # no archive of that profile
