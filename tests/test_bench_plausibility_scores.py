"""benchmarks/plausibility_scores.py: its quantiles and the page that says how many completions the margin drops."""

from __future__ import annotations

from benchmarks import plausibility_scores


def test_quantiles_and_the_share_each_kind_falls_below_the_threshold():
    assert plausibility_scores.quantiles([-3.0, -1.0, -2.0]) == {
        "n": 3, "min": -3.0, "p5": -3.0, "median": -2.0, "max": -1.0,
    }  # fmt: skip
    scores = {"own": [-0.5, -0.4, -0.6, -0.45], "payload": [-1.3, -0.7], "terse": [-1.6, -0.5]}
    report = {
        "command": "c", "git_commit": "abc", "date": "d", "machine": "m", "setup": "s", "margin": 0.5,
        "scores": scores,
        "quantiles": {kind: plausibility_scores.quantiles(values) for kind, values in scores.items()},
    }  # fmt: skip
    page = "\n".join(plausibility_scores.markdown(report))
    # margin 0.5: threshold -0.6 - 0.5 = -1.1: one payload of two, one terse answer of two, no own sample
    assert "| 0.5 (default) | -1.10 | 0.0% | 50.0% | 50.0% | 0.0% |" in page
    # margin 0: the own worst sample is at the threshold, not below it
    assert "| 0 | -0.60 | 0.0% | 100.0% | 50.0% | 0.0% |" in page
    assert "| payload | 2 | -1.30 | -1.30 | -0.70 | -0.70 |" in page
