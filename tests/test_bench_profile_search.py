"""benchmarks/profile_search.py: real runs of a tiny model (real TRL steps, real held-out evaluation), resumable,
the report's paired figures, and the step-time-alone measurement."""

from __future__ import annotations

import json
import math

import pytest

from benchmarks import profile_search, stats
from sapo.evaluation import HeldOutResult, QuestionResult
from tests.node_fixtures import STARTER  # noqa: F401 (its runs fork from the worker's warm server)


def test_a_run_evaluates_start_middle_end_then_the_report_pairs_them(tmp_path, tiny_model_a, capsys):
    argv = ["--settings", "lora-mix-small", "--seeds", "3", "--steps", "2", "--questions", "4",
            "--results-dir", str(tmp_path), "--model", str(tiny_model_a), "--allow-dirty"]  # fmt: skip
    assert profile_search.main(argv) == 0
    run = json.loads((tmp_path / "profile_search" / "lora-mix-small-seed3.json").read_text())
    assert sorted(map(int, run["evaluations"])) == [0, 1, 2] and len(run["history"]) == 2
    assert run["code"]["commit"] and run["setting"]["lora_r"] == 16
    md = (tmp_path / "profile_search.md").read_text()
    assert "| lora-mix-small | 3 |" in md and (tmp_path / "profile_search.png").read_bytes()[:4] == b"\x89PNG"

    written = (tmp_path / "profile_search" / "lora-mix-small-seed3.json").stat().st_mtime_ns
    assert profile_search.main(argv) == 0  # resumable: a finished run is not run again
    assert (tmp_path / "profile_search" / "lora-mix-small-seed3.json").stat().st_mtime_ns == written
    assert "0 run(s) to do" in capsys.readouterr().out


def test_summary_learns_only_beyond_two_paired_standard_errors():
    def result(solved):
        return HeldOutResult([QuestionResult("t", i, float(s), "", 1) for i, s in enumerate(solved)]).to_json()

    start = [0] * 20
    run = {"setting": {"name": "x"}, "seed": 0, "held_out_text_overlap": 0.0, "code": {},
           "history": [{"step": s, "reward": 0.1 * s, "step_time": 2.0} for s in range(1, 7)],
           "evaluations": {"0": result(start), "6": result([1] * 6 + [0] * 14)}}  # fmt: skip
    summary = profile_search.summarize(run)
    assert summary["difference"] == pytest.approx(0.3)
    assert summary["difference_se"] == pytest.approx(math.sqrt(0.3 * 0.7 * 20 / 19 / 20))
    assert summary["z"] > 2 and summary["reward_first"] == pytest.approx(0.15)
    run["evaluations"]["6"] = result([1] + [0] * 19)
    assert profile_search.summarize(run)["z"] < 2  # one more question solved out of 20 is noise


def test_timing_runs_without_evaluation(tmp_path, tiny_model_a):
    argv = ["--timing", "2", "--settings", "lora-mix-small", "--results-dir", str(tmp_path),
            "--model", str(tiny_model_a)]  # fmt: skip
    assert profile_search.main(argv) == 0
    run = json.loads((tmp_path / "profile_search" / "timing" / "lora-mix-small.json").read_text())
    assert run["evaluations"] == {} and len(run["history"]) == 2  # one entry per step


def test_the_bf16_check_pairs_each_seed_by_question_and_bounds_the_mean_over_seeds():
    def result(solved):
        return HeldOutResult([QuestionResult("t", i, float(s), "", 1) for i, s in enumerate(solved)]).to_json()

    def run(name, seed, start, end):
        return {"setting": {"name": name}, "seed": seed,
                "evaluations": {"0": result(start), "30": result(end)}}  # fmt: skip

    start = [0] * 10 + [1] * 2 + [0] * 8
    runs = [
        run("lora-mix-small-fp32", 0, start, [1] * 4 + [0] * 16),
        run("lora-mix-small-bf16", 0, start, [1] * 5 + [0] * 15),  # one more question solved
        run("lora-mix-small-fp32", 1, start, [1] * 6 + [0] * 14),
        run("lora-mix-small-bf16", 1, [0] * 20, [1] * 6 + [0] * 14),  # same end, gained from a lower start
        run("lora-mix-small-bf16", 2, start, [1] * 6 + [0] * 14),  # no fp32 partner: left out
    ]
    (pair,) = profile_search.precision_pairs(runs)
    assert pair["setting"] == "lora-mix-small" and pair["seeds"] == [0, 1]
    assert [e.value for e in pair["end"]] == pytest.approx([0.05, 0.0])
    assert [g.value for g in pair["gain"]] == pytest.approx([0.05, 0.1])
    over = pair["end_over_seeds"]
    assert over.value == pytest.approx(0.025)
    low, high = over.interval()
    assert low < 0 < high  # two seeds and 20 questions resolve nothing: the interval says so
    lines = "\n".join(profile_search.precision_lines([pair]))
    assert "| lora-mix-small | 0 | +0.050" in lines and "over 2" in lines


def test_learning_over_seeds_is_the_seeds_by_questions_table_of_end_minus_start():
    def result(solved):
        return HeldOutResult([QuestionResult("t", i, float(s), "", 1) for i, s in enumerate(solved)]).to_json()

    start = [1] * 2 + [0] * 18
    ends = {0: [1] * 5 + [0] * 15, 1: [1] * 4 + [0] * 16, 2: [1] * 2 + [0] * 18}  # +3, +2, +0 questions of 20
    runs = [{"setting": {"name": "x"}, "seed": seed, "evaluations": {"0": result(start), "30": result(end)}}
            for seed, end in ends.items()]  # fmt: skip
    (entry,) = profile_search.learning_over_seeds(runs)
    table = [[e - s for e, s in zip(end, start, strict=True)] for end in ends.values()]
    assert entry["seeds"] == [0, 1, 2] and entry["change"].value == pytest.approx(5 / 60)
    assert entry["change"].interval() == pytest.approx(stats.seeds_and_questions(table).interval())
    assert entry["t_over_seeds"].se == pytest.approx(stats.t_over_seeds([0.15, 0.1, 0.0]).se)
    lines = "\n".join(profile_search.learning_lines([entry]))
    assert "| x | 0,1,2 | +0.083 (95 % CI" in lines and "no learning resolved" in lines
