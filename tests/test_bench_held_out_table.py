"""benchmarks/held_out_table.py on synthetic archives: the mean over peers, its standard error, the same-seed
difference between settings, a resumed step's evaluation counted once, and incomplete runs left out."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from benchmarks import held_out_table


def _archive(root: Path, setting: str, seed: int, curves: list[list[tuple[int, float, float]]], complete=True):
    run = root / "sapo_table_runs" / "p" / setting / f"seed-{seed}"
    for node, curve in enumerate(curves):
        lines = [{"step": s, "eval/pass@1": p, "eval/pass@1_se": se, "eval/questions": 64.0} for s, p, se in curve]
        lines.insert(1, {"step": 1, "sapo/local_reward": 0.5})  # a training line is not an evaluation
        path = run / f"node-{node}" / "metrics.jsonl"
        path.parent.mkdir(parents=True)
        path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    if complete:
        (run / "run-complete.json").write_text(json.dumps({"code": {"commit": "abc", "dirty": False}}))


def test_held_out_table_arithmetic(tmp_path):
    _archive(tmp_path, "2-0", 0, [[(0, 0.1, 0.03), (30, 0.2, 0.04)], [(0, 0.1, 0.03), (30, 0.4, 0.06)]])
    # the 1-1 run was resumed at step 10 and evaluated it twice: the second line counts
    _archive(tmp_path, "1-1", 0, [[(0, 0.1, 0.03), (10, 0.9, 0.1), (10, 0.2, 0.05), (30, 0.5, 0.06)]] * 2)
    _archive(tmp_path, "1-1", 1, [[(0, 0.1, 0.03), (30, 0.9, 0.01)]] * 2, complete=False)
    data = held_out_table.main(["--profile", "p", "--results-dir", str(tmp_path)])
    runs = {(run["setting"], run["seed"]): run for run in data["runs"]}
    assert set(runs) == {("2-0", 0), ("1-1", 0)}  # the incomplete run is left out
    assert runs[("2-0", 0)]["pass_at_1"] == pytest.approx([0.1, 0.3])
    assert runs[("2-0", 0)]["standard_error"][-1] == pytest.approx(math.sqrt(0.04**2 + 0.06**2) / 2)
    assert runs[("1-1", 0)]["pass_at_1"] == pytest.approx([0.1, 0.2, 0.5])
    row = data["comparison"]["1-1"]["per_seed"][0]
    assert row["difference"] == pytest.approx(0.2)
    assert row["se"] == pytest.approx(math.hypot(math.sqrt(2) * 0.06 / 2, math.sqrt(0.04**2 + 0.06**2) / 2))
    page = (tmp_path / "sapo_table_p_held_out.md").read_text()
    assert "4/4 (run as 1/1), seed 0: +0.200" in page and (tmp_path / "sapo_table_p_held_out.png").exists()
