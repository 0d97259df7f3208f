"""benchmarks.rederivation_stall's slow-answers attack on a short run: both arms train, score the slow sender's groups
with the real reward, and the page reports each arm's steps."""

from __future__ import annotations

from benchmarks import rederivation_stall


def test_the_slow_answers_attack_runs_both_arms_and_reports_them(tmp_path):
    argv = ["--slow-answers", "--steps", "2", "--pace", "0", "--costly-groups", "1", "--output-dir", str(tmp_path)]
    data = rederivation_stall.main(argv)
    assert data["attack"] == "slow answers" and set(data["arms"]) == set(rederivation_stall.ARMS["slow answers"])
    for steps in data["arms"].values():
        assert [s["step"] for s in steps] == [1, 2]
        # the slow group's answers ran the integration scorer (0.5 s or more of its deadline) at least once
        assert max(s["external_scoring_s"] for s in steps) >= 0.4
    page = (tmp_path / "rederivation_stall_slow_answers.md").read_text()
    assert page.startswith("# What a sender of answers slow to score makes a node spend")
    assert all(f"| {arm} |" in page for arm in data["arms"])
