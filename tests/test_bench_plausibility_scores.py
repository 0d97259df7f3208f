"""benchmarks/plausibility_scores.py: its quantiles and the page that says how many completions the margin drops."""

from __future__ import annotations

from benchmarks import plausibility_scores


def test_quantiles_and_the_share_each_kind_falls_below_the_threshold():
    assert plausibility_scores.quantiles([-3.0, -1.0, -2.0]) == {
        "n": 3, "min": -3.0, "p5": -3.0, "median": -2.0, "max": -1.0,
    }  # fmt: skip
    scores = {"own": [-5.0, -4.0, -6.0, -4.5], "payload": [-13.0, -7.0], "terse": [-9.5, -5.0]}
    report = {
        "command": "c", "git_commit": "abc", "date": "d", "machine": "m", "setup": "s", "margin": 3.0,
        "lowest_tokens": 3, "scores": scores,
        "quantiles": {kind: plausibility_scores.quantiles(values) for kind, values in scores.items()},
    }  # fmt: skip
    page = "\n".join(plausibility_scores.markdown(report))
    # threshold: own 5th percentile (-6) minus 3 = -9: one payload of two, one terse answer of two, no own sample
    assert "threshold -9.00), 50% of payload completions fall below it, 50% of the terse answers and 0% of" in page
    assert "| payload | 2 | -13.00 | -13.00 | -7.00 | -7.00 |" in page
