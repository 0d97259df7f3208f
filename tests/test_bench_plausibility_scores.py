"""benchmarks/plausibility_scores.py: its statistics of per-token values, and the page that says what each margin
and the defaults drop."""

from __future__ import annotations

import pytest

from benchmarks import plausibility_scores


def _completion(excess: list[float]) -> dict:
    """A completion whose tokens have these typicalities (log-probability -1 below the entropy's 1 plus ``excess``)."""
    return {"question": 0, "text": "t", "logps": [e - 1.0 for e in excess], "entropies": [1.0] * len(excess)}


def test_statistics_and_what_the_defaults_drop():
    assert plausibility_scores.quantiles([-3.0, -1.0, -2.0]) == {
        "n": 3, "min": -3.0, "p5": -3.0, "median": -2.0, "max": -1.0,
    }  # fmt: skip
    spliced = [0.0] * 18 + [-4.5, -4.5]  # a 2-token payload in 20 tokens of the policy's own text
    assert plausibility_scores.statistic("mean", [e - 1 for e in spliced], [1.0] * 20) == pytest.approx(-0.45)
    assert plausibility_scores.statistic("span3", [e - 1 for e in spliced], [1.0] * 20) == pytest.approx(-3.0)
    assert plausibility_scores.statistic("worst_token", [e - 1 for e in spliced], [1.0] * 20) == pytest.approx(-4.5)
    own = [_completion([x] * 4) for x in (0.0, 0.2, -0.2, 0.1)]  # mean and span3: 5th percentile -0.2
    completions = {kind: own for kind in plausibility_scores.KINDS}
    completions["adaptive"] = [_completion(spliced)]
    completions["payload"] = [_completion([-2.0] * 5)]
    report = {
        "command": "c",
        "git_commit": "abc",
        "date": "d",
        "machine": "m",
        "setup": "s",
        "completions": completions,
    }
    page = "\n".join(plausibility_scores.markdown(report))
    assert "| adaptive | 1 | -0.45 | -0.45 | -0.45 | -0.45 |" in page  # the mean table
    # defaults: mean threshold -0.2 - 1.0 = -1.2 lets the spliced completion through, span3 -0.2 - 2.5 = -2.7 does not
    assert "| adaptive | 1 | 0.0% | 0.0% | 100.0% | 100.0% |" in page
    assert "| payload | 1 | 100.0% | 100.0% | 100.0% | 100.0% |" in page
    assert "| own | 4 | 0.0% | 0.0% | 0.0% | 0.0% |" in page
