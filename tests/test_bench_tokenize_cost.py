"""benchmarks/tokenize_cost.py: both codes timed on every completion shape and limit, the report naming the base."""

from __future__ import annotations

import json

from benchmarks import tokenize_cost


def test_the_report_compares_both_codes_on_every_shape_and_limit(tmp_path):
    data = tokenize_cost.main(["--base", "HEAD", "--rounds", "1", "--limits", "48", "--output-dir", str(tmp_path)])
    costs = data["cpu_ms_per_completion"]
    assert list(costs) == ["base HEAD", "this tree"]
    assert all(list(by_limit) == ["48"] for by_limit in costs.values())
    assert all(set(by_shape) == set(tokenize_cost.shapes()) for c in costs.values() for by_shape in c.values())
    assert all(ms > 0 for c in costs.values() for by_shape in c.values() for ms in by_shape.values())
    saved = json.loads((tmp_path / "tokenize_cost.json").read_text())
    assert saved["base"] == "HEAD" and saved["git_commit"]
    report = (tmp_path / "tokenize_cost.md").read_text()
    assert "| 48 | CJK | 32768 |" in report and "base HEAD / this tree" in report
    # the base is read from git, not imported: both probes keep the same tokens of a long text
    from sapo.models import load_smollm2_tokenizer

    tokenizer = load_smollm2_tokenizer()
    base, this = (tokenize_cost.sys.modules[n] for n in ("base_probe", "this_probe"))
    text = tokenize_cost.shapes()["prose"]
    kept = [tokenize_cost.probe_for(module, tokenizer, 48).tokenize(text) for module in (base, this)]
    assert kept[0] == kept[1] and kept[0].truncated and len(kept[0].ids) == 48
