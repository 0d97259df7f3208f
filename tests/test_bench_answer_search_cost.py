"""benchmarks/answer_search_cost.py: both codes timed on every completion shape, the report naming the base."""

from __future__ import annotations

import json

from benchmarks import answer_search_cost


def test_the_report_compares_both_codes_on_every_shape(tmp_path):
    data = answer_search_cost.main(["--base", "HEAD", "--rounds", "1", "--output-dir", str(tmp_path)])
    costs = data["cpu_ms_per_completion"]
    assert list(costs) == ["base HEAD", "this tree"]
    assert all(set(by_shape) == set(answer_search_cost.SHAPES) for by_shape in costs.values())
    assert all(ms > 0 for by_shape in costs.values() for ms in by_shape.values())
    saved = json.loads((tmp_path / "answer_search_cost.json").read_text())
    assert saved["base"] == "HEAD" and saved["git_commit"]
    report = (tmp_path / "answer_search_cost.md").read_text()
    assert "| unclosed answer tags | 32768 |" in report and "base HEAD: x honest" in report
    # the base is read from git, not imported: both modules answer alike on an honest completion
    base, this = (answer_search_cost.sys.modules[n] for n in ("base_extract", "this_extract"))
    assert base.extract_answer(answer_search_cost.SHAPES["honest"]) == this.extract_answer("<answer>5</answer>") == "5"
