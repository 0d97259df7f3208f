"""benchmarks.step_limit --quick: a smoke test of the whole run on a tiny model (the machine's limits, the generation
variants, the node's step with each speed-up off and on beside plain TRL) and of its report."""

from __future__ import annotations

import json

from benchmarks import step_limit


def test_quick_run_writes_a_report_with_every_part(tmp_path, smollm_tokenizer_dir):
    assert step_limit.main(["--quick", "--threads", "1", "--skip-continuous-batching", "--output-dir",
                            str(tmp_path)]) == 0  # fmt: skip
    data = json.loads((tmp_path / "step_limit.json").read_text())
    assert (tmp_path / "step_limit.md").is_file() and (tmp_path / "step_limit.png").stat().st_size > 0
    assert data["record"]["git_commit"] and "dirty" in data["git"]
    assert data["limits"]["bandwidth_gb_s"] > 0 and all(
        r > 0 for r in data["limits"]["rates_gflop_s"]["float32"].values()
    )
    bounds = data["bounds"]["float32"]
    assert 0 < bounds["generation_prefill"] < bounds["generation"] and bounds["training pass"] > 0
    assert set(step_limit.GENERATION_VARIANTS[:4]) <= set(data["generation"]["variants"])
    assert all(v["wall"] > 0 and v["cpu"] > 0 for v in data["generation"]["variants"].values())
    summary = data["step_summary"]
    assert "plain TRL GRPOTrainer" in summary and "node, speed-ups off (today)" in summary and "node, both" in summary
    for name, steps in data["steps"].items():
        assert len(steps) == 2, name
        assert all(s["training pass"] > 0 and s["generation"] > 0 for s in steps), name
    # After its first step (own groups only: the plausibility reference), the node trains on a swarm group (J > 0).
    assert all(summary[n]["external_groups"] == 1 for n in summary if n.startswith("node"))
    assert "| plain TRL GRPOTrainer |" in (tmp_path / "step_limit.md").read_text()


def test_step_summary_compares_steps_that_trained_on_the_swarm_group():
    def step(external: int, wall: float) -> dict[str, float]:
        return {"external_groups": external, "wall": wall, "cpu": wall, **dict.fromkeys(step_limit.SPLIT, 1.0)}

    # the first step (no swarm group yet) is left out, and so is the step whose swarm group was dropped
    records = [step(0, 9.0), step(1, 10.0), step(0, 14.0), step(1, 12.0)]
    summary = step_limit.summarize_steps(records, swarm_groups=1)
    assert summary["wall"] == 11.0 and summary["steps_measured"] == 2 and summary["steps_after_first"] == 3
    assert step_limit.summarize_steps(records, swarm_groups=0)["wall"] == 14.0  # plain TRL: no swarm group
    none_taken = step_limit.summarize_steps([step(0, 9.0), step(0, 14.0)], swarm_groups=1)
    assert none_taken["wall"] == 14.0 and none_taken["steps_measured"] == 1  # none qualified: all after the first
