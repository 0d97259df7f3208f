"""benchmarks/loss_pass.py --quick: the training pass of a tiny model in every configuration, and its page."""

from __future__ import annotations

import json

from benchmarks import loss_pass


def test_quick_run_measures_every_configuration_and_the_two_scorings_agree(tmp_path):
    assert loss_pass.main(["--quick", "--reps", "1", "--bf16", "on", "--profile", "--output-dir", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "loss_pass.json").read_text())
    assert len(data["configs"]) == 7 and all(m["forward"] > 0 and m["backward"] > 0 for m in data["medians"].values())
    # scoring only the completion positions changes the work, not the result
    for diff in data["same_results"].values():
        assert diff["log_probs_max_difference"] == 0 and diff["grads_max_difference"] == 0
    page = (tmp_path / "loss_pass.md").read_text()
    assert "| fp32, completion positions |" in page and "Heaviest operators, bf16, every position" in page
    node_way = "bf16 weights once, float32 attention, fused LoRA, lean LM head"
    assert f"| bf16, completion positions, as the node runs it ({node_way}) |" in page
    assert f"| bf16, completion positions, as the node runs it ({node_way}) but PEFT's LoRA forward |" in page
    assert f"| bf16, completion positions, as the node runs it ({node_way}) but TRL's LM head |" in page
    assert data["record"]["git_commit"]
