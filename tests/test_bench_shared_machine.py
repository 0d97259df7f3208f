"""benchmarks/shared_machine.py: a node run's steps read from its metrics.jsonl, and the page's medians and ratios."""

from __future__ import annotations

import json

import pytest

from benchmarks import shared_machine


def test_step_seconds_are_the_gaps_between_training_log_lines(tmp_path):
    lines = [{"step": 1, "time": 10.0, "loss": 0.1}, {"step": 1, "time": 10.5, "eval_loss": 0.2},
             {"step": 2, "time": 13.0, "loss": 0.1}, {"step": 3, "time": 17.0, "loss": 0.1}]  # fmt: skip
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert shared_machine.step_seconds(tmp_path / "metrics.jsonl") == [3.0, 4.0]
    assert shared_machine.step_seconds(tmp_path / "missing.jsonl") == []


def test_the_summary_pairs_each_setting_with_the_default_where_both_ran():
    def run(setting, busy, step, wall, share):
        return {"setting": setting, "busy": busy, "median_step": step, "wall": wall, "busy_cpu_share": share}

    runs = [run("default", True, 20.0, 200.0, 0.5), run("passive", True, 5.0, 100.0, 0.9),
            run("default", True, 30.0, 300.0, 0.5), run("passive", True, 7.0, 120.0, 0.9),
            run("default", False, 4.0, 60.0, None), run("passive", False, None, 70.0, None)]  # fmt: skip
    summary = shared_machine.summarize(runs, ["default", "passive"])
    assert summary["default, beside a busy process"]["step_seconds"] == 25.0
    assert summary["passive, beside a busy process"]["step_seconds_each"] == [5.0, 7.0]
    assert summary["passive / default, beside a busy process"]["step_ratio"] == pytest.approx(6.0 / 25.0)
    assert summary["passive / default, beside a busy process"]["wall_ratio"] == pytest.approx(110.0 / 250.0)
    assert "passive, alone" not in summary and "passive / default, alone" not in summary  # no step logged: left out
    page = "\n".join(shared_machine.report_lines({"record": {"command": "c", "git_commit": "x", "date": "d",
                                                             "machine": "m"},
                                                  "settings": {"steps": 4, "runs": 2, "alone": True, "threads": 2,
                                                               "model": "tiny", "shared_with": ""},
                                                  "runs": runs, "summary": summary}))  # fmt: skip
    assert "| **passive / default, beside a busy process** | | **0.24x** |" in page
    assert "1 runs failed or logged fewer than two steps" in page


def test_a_setting_names_a_wait_policy_and_optionally_a_thread_count(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    assert shared_machine.parse_setting("passive-1") == ("PASSIVE", 1)
    assert shared_machine.parse_setting("default") == ("", None)
    env = shared_machine.node_environment("passive-1")
    assert (env["OMP_WAIT_POLICY"], env["OMP_NUM_THREADS"]) == ("PASSIVE", "1")
    assert "OMP_NUM_THREADS" not in shared_machine.node_environment("passive")  # the node picks its own
    for bad in ("spinning", "passive-0", "passive-x"):
        with pytest.raises(SystemExit, match="a setting is a wait policy"):
            shared_machine.parse_setting(bad)


def test_every_setting_is_compared_with_the_first_listed():
    runs = [{"setting": name, "busy": True, "median_step": step, "wall": 10 * step, "busy_cpu_share": 0.5}
            for name, step in (("passive", 4.0), ("passive-1", 2.0), ("default", 8.0))]  # fmt: skip
    summary = shared_machine.summarize(runs, ["passive", "passive-1", "default"])
    assert summary["passive-1 / passive, beside a busy process"]["step_ratio"] == pytest.approx(0.5)
    assert summary["default / passive, beside a busy process"]["wall_ratio"] == pytest.approx(2.0)
