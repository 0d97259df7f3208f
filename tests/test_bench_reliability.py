"""Harness logic of benchmarks/reliability.py: soak figures from samples, the report, argument checks."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bench():
    return importlib.import_module("benchmarks.reliability")


@pytest.fixture(scope="module")
def soak():
    return importlib.import_module("benchmarks.soak")


def _samples(
    minutes: int, node_mb_per_hour: float, steps_per_minute_late: float, sawtooth_mb: float = 0.0
) -> list[dict]:
    samples, step = [], 0.0
    for k in range(minutes * 6 + 1):  # one sample every 10 s
        t = 10.0 * k
        step += (60.0 if t < minutes * 30 else steps_per_minute_late) / 6
        samples.append(
            {
                "t": t,
                "node-0": {
                    "node_mb": 500 + node_mb_per_hour * t / 3600 + sawtooth_mb * (k % 13) / 13,
                    "p2pd_mb": 60.0,
                    "step": int(step),
                    "dht_stored_items": float(k % 7),
                    "seen_refs": 3.0,
                    "received_groups": 1.0,
                    "published_records": float(k),
                },
            }  # fmt: skip
        )
    return samples


def test_soak_summary_measures_growth_and_step_rate(soak):
    summary = soak.soak_summary(_samples(30, node_mb_per_hour=120.0, steps_per_minute_late=30.0), ["node-0"])
    node = summary["node-0"]
    assert node["node_mb_growth_per_hour"] == pytest.approx(120.0, rel=0.01)
    assert node["p2pd_mb_growth_per_hour"] == pytest.approx(0.0, abs=1e-9)
    assert node["steps_per_minute_first_fifth"] == pytest.approx(60.0, rel=0.05)
    assert node["steps_per_minute_last_fifth"] == pytest.approx(30.0, rel=0.05)  # a decay shows
    assert node["dht_stored_items_max"] == 6
    assert node["published_records_total"] == 180


def test_soak_memory_trend_ignores_a_sawtooth_without_growth(soak):
    """RSS swings of hundreds of MB (allocator, garbage collection) must not read as growth, nor hide it."""
    flat = soak.soak_summary(_samples(30, 0.0, 60.0, sawtooth_mb=300.0), ["node-0"])["node-0"]
    assert abs(flat["node_mb_growth_per_hour"]) < 60 and flat["node_mb_max"] >= 750
    growing = soak.soak_summary(_samples(30, 600.0, 60.0, sawtooth_mb=300.0), ["node-0"])["node-0"]
    assert growing["node_mb_growth_per_hour"] == pytest.approx(600.0, rel=0.1)


def test_report_names_each_part_and_its_targets(bench, soak):
    common = {"command": "python benchmarks/reliability.py", "git_commit": "abc", "date": "d", "machine": "m"}
    result = {
        "parts": {
            "hostile": {**common, "rounds": [{"kinds_not_counted": []}], "crashes": 0, "poisoned_rows_trained": 0,
                        "bad_inputs_tried_by_kind": {"random_bytes": 1}, "rejections_by_reason": {"x": 1}},
            "crashes": {**common, "faults_injected": 4, "resumed_from_newest_complete": 4, "steps_lost_per_fault": 0.5,
                        "steps_logged_twice": 0, "final_exit_code": 0},
            "soak": {**common, "summary": soak.soak_summary(_samples(5, 0.0, 60.0), ["node-0"])},
        }
    }  # fmt: skip
    text = bench.markdown(result)
    assert "poisoned rows trained on: 0 (target 0)" in text and "faults injected (kill -9): 4" in text
    assert "| node-0 |" in text


def test_unknown_part_is_refused(bench):
    with pytest.raises(SystemExit):
        bench.parse_args(["--parts", "hostile,chaos"])


def test_storage_against_expiry_tells_a_bounded_store_from_one_that_keeps_everything(soak):
    def samples(keeps_everything: bool) -> list[dict]:
        out = []
        for k in range(121):  # 20 minutes, 10 s apart, 1 record per node per sample
            t = 10.0 * k
            stored = 2 * k if keeps_everything else 2 * min(k, 60)  # 2 nodes, ttl 600 s = 60 samples
            out.append({"t": t, **{n: {"published_records": float(k), "dht_stored_items": float(stored)}
                                   for n in ("node-0", "node-1")}})  # fmt: skip
        return out

    bounded = soak.storage_vs_expiry(samples(False), ["node-0", "node-1"], ttl=600.0)
    assert bounded["items_per_record_within_ttl_median"] == pytest.approx(1.0, abs=0.02)
    assert bounded["records_published_total"] == 240
    unbounded = soak.storage_vs_expiry(samples(True), ["node-0", "node-1"], ttl=600.0)
    assert unbounded["items_per_record_within_ttl_range"][1] > 1.9  # twice what is alive by the end


def test_windows_give_each_nodes_median_and_peak(soak):
    rows = soak.windows(_samples(10, 0.0, 60.0, sawtooth_mb=130.0), ["node-0"], minutes=5.0)
    assert [r["minute"] for r in rows] == [0.0, 5.0]
    assert all(500 <= r["node-0"]["median_mb"] <= r["node-0"]["max_mb"] <= 630 for r in rows)


def test_soak_reports_each_held_out_evaluation_once_and_the_groups_received(bench, soak):
    samples = _samples(5, 0.0, 60.0)
    for k, sample in enumerate(samples):  # an evaluation at steps 0, 10, 20: each seen by many samples
        step = 10 * min(k // 10, 2)
        sample["node-0"].update(held_out=0.1 + step / 100, held_out_step=step, received_groups=float(k))
    summary = soak.soak_summary(samples, ["node-0"])["node-0"]
    assert summary["held_out_evaluations"] == 3
    assert summary["held_out_first"] == [0, pytest.approx(0.1)]
    assert summary["held_out_last"] == [20, pytest.approx(0.3)]
    assert summary["received_groups_total"] == len(samples) - 1
    assert "0.100 -> 0.300 (steps 0 -> 20)" in bench.markdown(
        {
            "parts": {
                "soak": {
                    "command": "c",
                    "git_commit": "abc",
                    "date": "d",
                    "machine": "m",
                    "summary": {"node-0": summary},
                }
            }
        }
    )


def test_soak_plot_draws_held_out_panel(soak, tmp_path):
    samples = _samples(3, 0.0, 60.0)
    for k, sample in enumerate(samples):
        sample["node-0"].update(held_out=0.2, held_out_step=10 * (k // 9))
    path = tmp_path / "soak.png"
    soak.soak_plot(samples, ["node-0"], 600.0, path, "default")
    assert path.stat().st_size > 10_000
