"""The node-memory benchmark (benchmarks/node_memory.py): the summary's arithmetic, the old ``step_cost.py --part
memory`` entry, and a --quick run end to end on a tiny model. No memory figure is asserted beyond plausibility."""

from __future__ import annotations

import importlib
import json

import pytest


@pytest.fixture(scope="module")
def bench():
    return importlib.import_module("benchmarks.node_memory")


def _sample(t, node_mb, p2pd_mb, steps):
    return {"t": t, "node_mb": node_mb, "p2pd_mb": p2pd_mb, "steps": steps}


def test_steady_state_is_the_median_between_the_first_and_the_last_step(bench):
    samples = [
        _sample(0.0, 300.0, 0.0, 0),  # loading: before the first step ends, left out of the steady state
        _sample(1.0, 900.0, 40.0, 0),
        _sample(2.0, 1000.0, 50.0, 1),
        _sample(3.0, 1100.0, 60.0, 2),
        _sample(4.0, 1050.0, 55.0, 3),
        _sample(5.0, 1900.0, 58.0, 4),  # the last step's final save: a peak, not the steady state
    ]
    s = bench.memory_summary(samples, node_hwm_mb=2000.0)
    assert s["peak_node_mb"] == 1900.0 and s["peak_p2pd_mb"] == 60.0 and s["node_vmhwm_mb"] == 2000.0
    assert s["peak_total_mb"] == 1958.0  # the largest sum of one sample, not the sum of the two peaks (1960)
    assert s["steady_samples"] == 3 and s["samples"] == 6
    assert s["steady_node_mb"] == 1050.0 and s["steady_p2pd_mb"] == 55.0
    assert s["steady_total_mb"] == 1105.0


def test_a_one_step_run_is_steady_until_its_swarm_closes(bench):
    samples = [_sample(0.0, 500.0, 30.0, 0), _sample(1.0, 800.0, 40.0, 1), _sample(2.0, 820.0, 0.0, 1)]
    s = bench.memory_summary(samples, node_hwm_mb=820.0)
    assert s["steady_samples"] == 1 and s["steady_total_mb"] == 840.0  # p2pd gone: the node is leaving
    with pytest.raises(ValueError):
        bench.memory_summary([], node_hwm_mb=0.0)


def test_held_out_evaluation_lines_are_not_steps(bench, tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    rows = [
        {"step": 0, "time": 10.0, "eval/pass@1": 0.1},  # evaluation at step 0, before any training
        {"step": 1, "time": 12.0, "loss": 0.5},
        {"step": 1, "time": 13.0, "eval/pass@1": 0.2},
        {"step": 2, "time": 15.0, "loss": 0.4},
    ]
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 3, "ti')  # a torn last line
    lines = bench.training_lines(metrics)
    assert [line["step"] for line in lines] == [1, 2]
    assert bench.training_lines(tmp_path / "missing.jsonl") == []


def test_step_cost_part_memory_runs_this_benchmark(monkeypatch, capsys):
    step_cost = importlib.import_module("benchmarks.step_cost")
    node_memory = importlib.import_module("benchmarks.node_memory")
    calls = []
    monkeypatch.setattr(node_memory, "main", lambda argv: calls.append(argv) or {"delegated": True})
    argv = ["--part", "memory", "--quick", "--memory-steps", "3", "--sample-interval", "0.5", "--output-dir", "o"]
    assert step_cost.main(argv) == {"delegated": True}
    assert calls == [["--output-dir", "o", "--steps", "3", "--sample-interval", "0.5", "--quick"]]
    assert "python -m benchmarks.node_memory" in capsys.readouterr().out
    args = node_memory.parse_args(calls[0])
    assert (args.steps, args.sample_interval, args.quick, args.timeout) == (3, 0.5, True, 1800.0)


def test_quick_run_end_to_end(bench, tiny_model_a, tmp_path):
    out = tmp_path / "results"
    argv = ["--quick", "--model", str(tiny_model_a), "--output-dir", str(out)]
    result = bench.main(argv)

    memory = json.loads((out / "node_memory.json").read_text())
    for key in ("command", "git_commit", "machine", "date", "settings", "samples", "step_end_seconds"):
        assert key in memory
    s = memory["summary"]
    assert s["peak_node_mb"] > 50 and s["peak_p2pd_mb"] > 1
    assert s["peak_total_mb"] >= s["steady_total_mb"] > 0
    assert s["node_vmhwm_mb"] >= s["peak_node_mb"] * 0.99
    assert memory["node_command"].startswith("sapo-node --max-steps 1")
    assert len(memory["step_end_seconds"]) == 1
    assert "| p2pd |" in (out / "node_memory.md").read_text()
    assert (out / "node_memory.png").stat().st_size > 0
    assert result["summary"] == s

    assert bench.main(argv) == {}  # resumable: saved with the same settings, a rerun does nothing
