"""The step-cost benchmark (benchmarks/step_cost.py) and its feeder (benchmarks/feeder.py): statistics, turn taking,
feeder groups, and a --quick run end to end on a tiny model. No timing is asserted."""

from __future__ import annotations

import importlib
import json
import math
import random
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bench():
    return importlib.import_module("benchmarks.step_cost")


def _step(step_time, generation, scoring=0.0, fetch=0.0, ext=0.0, publish=0.0, wall=None):
    return {
        "step_time": step_time,
        "wall": wall if wall is not None else step_time + 0.5,
        "generation": generation,
        "scoring": scoring,
        "swarm_fetch": fetch,
        "external_scoring": ext,
        "publish": publish,
    }


def test_median_and_ratio_helpers(bench):
    assert bench.median([3.0, 1.0, 2.0]) == 2.0
    assert bench.median([4.0, 1.0, 3.0, 2.0]) == 2.5
    assert bench.median([]) is None
    assert bench.median([None, 5.0]) == 5.0
    assert bench.ratio(3.0, 2.0) == 1.5
    assert bench.ratio(None, 2.0) is None
    assert bench.ratio(1.0, 0.0) is None


def test_summary_skips_warmup_and_split_adds_up(bench):
    steps = [_step(100.0, 90.0)]  # warm-up: ignored
    steps += [_step(10.0 + k, 6.0 + k, scoring=0.2, fetch=0.01, ext=0.3, publish=0.02) for k in range(5)]
    s = bench.summarize(steps)
    assert s["steps_measured"] == 5
    assert s["step_time"] == 12.0
    assert s["wall"] == 12.5
    assert s["split"]["swarm"] == pytest.approx(0.33)  # publish + fetch + external scoring, medians
    assert s["split"]["training"] == pytest.approx(12.0 - 8.0 - 0.2 - 0.33)
    assert s["swarm_share"] == pytest.approx(0.33 / 12.0)
    with pytest.raises(ValueError):
        bench.summarize(steps[:1])  # nothing left after the warm-up
    overlapping = _step(10.0, 9.0, scoring=0.5, fetch=0.1, ext=0.6, publish=0.0)  # phases sum to 10.2 s > 10 s
    with pytest.raises(ValueError, match="exceed the step time"):
        bench.step_split(overlapping)


def test_ratios_between_configurations(bench):
    summaries = {
        "sapo 4/4": {"step_time": 9.0, "wall": 10.0},
        "sapo 8/0": {"step_time": 12.0, "wall": 13.0},
        "trl": {"step_time": 12.0, "wall": 12.5},
    }
    r = bench.ratios(summaries)
    assert r["sapo 4/4 / trl"]["step_time"] == pytest.approx(0.75)
    assert r["sapo 8/0 / trl"]["wall"] == pytest.approx(1.04)
    assert r["sapo 4/4 / sapo 8/0"]["step_time"] == pytest.approx(0.75)


def test_trainers_take_turns_and_a_failure_stops_the_others(bench):
    names = ("a", "b", "c")
    baton = bench.Baton(names)
    steps_of = {"a": 3, "b": 2, "c": 3}  # b finishes early: the others go on without it
    done: list[str] = []

    callbacks = {name: bench.make_turn_callback(name, baton, 1, done.append) for name in names}

    def trainer(name):
        callback = callbacks[name]
        try:
            for step in range(1, steps_of[name] + 1):
                state = SimpleNamespace(global_step=step)
                callback.on_step_begin(None, state, None)
                callback.on_step_end(None, state, None)
        finally:
            baton.finish(name)

    threads = [threading.Thread(target=trainer, args=(n,), daemon=True) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert baton.history == ["a", "b", "c", "a", "b", "c", "a", "c"]
    assert done == baton.history

    baton = bench.Baton(names)
    baton.abort()
    with pytest.raises(bench.Aborted):
        baton.wait("a", timeout=1)


def test_feeder_groups_pass_the_receivers_verification():
    from sapo.sources import ReasoningGymSource, SourceRegistry
    from sapo.tasks import DEFAULT_TASKS, build_reasoning_gym_dataset
    from swarm.records import GroupRecord, RecordLimits, encode_record

    rows = build_reasoning_gym_dataset(DEFAULT_TASKS, size=8, seed=5).to_list()
    feeder = importlib.import_module("benchmarks.feeder")
    groups = feeder.make_feeder_groups(rows, 0, 8, 4, 400, random.Random(0))
    verifier = SourceRegistry([ReasoningGymSource()])
    for group, row in zip(groups, rows, strict=True):
        assert verifier.columns_for(group)["answer"] == row["answer"]
        assert len(group.completions) == 4
        assert all(80 <= len(c) <= 400 for c in group.completions)
    encode_record(GroupRecord(groups=groups, created_at=groups[0].created_at), RecordLimits())
    endings = [c.rsplit("\n", 1)[-1] for g in groups for c in g.completions]
    assert any(e.startswith("<answer>") for e in endings) and any("<answer>" not in e for e in endings)


def test_quick_run_end_to_end(bench, tiny_model_a, tmp_path):
    out = tmp_path / "results"
    argv = ["--quick", "--model", str(tiny_model_a), "--output-dir", str(out)]
    results = bench.main(argv)

    report = json.loads((out / "step_cost.json").read_text())
    for key in ("command", "git_commit", "machine", "date", "setup", "order", "ratios", "background_cpu_seconds"):
        assert key in report
    assert set(report["summary"]) == set(bench.CONFIGS)
    assert sorted(report["order"]) == sorted(bench.CONFIGS * report["settings"]["steps"])
    assert report["order"][:3] == list(bench.CONFIGS)  # interleaved, not one after the other
    for name, summary in report["summary"].items():
        assert len(report["steps"][name]) == report["settings"]["steps"]
        assert summary["steps_measured"] == report["settings"]["steps"] - 1
        assert sum(summary["split"].values()) == pytest.approx(summary["step_time"])
        assert summary["split"]["generation"] > 0
        assert summary["wall"] >= summary["step_time"] * 0.99
    four_four = report["summary"]["sapo 4/4"]
    assert four_four["external_groups"] + four_four["fill_ins"] == 4
    assert four_four["external_groups"] > 0, "the feeder's groups never reached the 4/4 peer"
    assert four_four["phases"]["external_scoring"] > 0
    assert report["summary"]["sapo 8/0"]["phases"]["publish"] > 0
    assert report["summary"]["trl"]["split"]["swarm"] == 0
    assert math.isfinite(report["ratios"]["sapo 4/4 / trl"]["step_time"])
    md = (out / "step_cost.md").read_text()
    assert all(f"| {name} |" in md for name in bench.CONFIGS)
    assert (out / "step_cost.png").stat().st_size > 0

    assert results["settings"] == report["settings"]
    assert not (out / "node_memory.json").exists()  # the memory benchmark is its own command now

    # resumable: with the results saved under the same settings, a rerun does nothing
    assert bench.main(argv) == {}
