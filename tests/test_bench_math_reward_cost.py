"""benchmarks.math_reward_cost, briefly: both codes score every group alike and the report lists both."""

from __future__ import annotations

import json

from benchmarks import math_reward_cost


def test_both_codes_score_the_groups_and_the_report_lists_them(tmp_path):
    data = math_reward_cost.main(
        ["--base", "HEAD", "--group-size", "2", "--rounds", "1", "--output-dir", str(tmp_path)]
    )
    assert set(data["rewards"]) == {"base HEAD", "this tree"}
    for rewards in data["rewards"].values():
        assert rewards["crafted: 9**9**9"] == [0.0, 0.0] and rewards["honest: 2/4 for 0.5"] == [1.0, 1.0]
    page = (tmp_path / "math_reward_cost.md").read_text()
    assert "| base HEAD | this tree |" in page.replace("| group | ", "| ")
    assert json.loads((tmp_path / "math_reward_cost.json").read_text())["group_size"] == 2
