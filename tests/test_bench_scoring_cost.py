"""benchmarks.scoring_cost on small answers: both codes score every answer, and the page reports each one."""

from __future__ import annotations

import json

from benchmarks import scoring_cost


def test_both_codes_score_every_answer_and_the_page_lists_them(tmp_path, monkeypatch):
    answers = {
        "countdown, its gold answer": ("countdown", None),
        "countdown, 9**(2,000 - round)": ("countdown", lambda r: f"9**{2_000 - r}"),
        "countdown, 9**9**9": ("countdown", lambda r: "9**9**9"),  # the base here is HEAD: bounded on both sides
    }
    monkeypatch.setattr(scoring_cost, "ANSWERS", answers)
    argv = ["--base", "HEAD", "--rounds", "2", "--group-size", "2", "--group-target", "0.05"]
    data = scoring_cost.main([*argv, "--output-dir", str(tmp_path)])
    costs = data["answers"]
    assert set(costs) == {"base HEAD", "this tree"}
    assert costs["this tree"]["countdown, its gold answer"]["score"] == 1.0
    assert costs["this tree"]["countdown, 9**9**9"]["score"] == 0.0
    assert all(v["cpu_s"] >= 0 for code in costs.values() for v in code.values())
    page = (tmp_path / "scoring_cost.md").read_text()
    assert all(f"| {name} |" in page for name in answers)
    assert json.loads((tmp_path / "scoring_cost.json").read_text())["rounds"] == 2
    group = data["group"]  # the slow group: each code scored both answers (small ones, at this target)
    assert group["size"] == 2 and all(len(group[code]["rewards"]) == 2 for code in costs)
    assert f"(x+a+b+c+d)**{group['power']}" in page
