"""benchmarks.trl_peer_tests: the SAPO pass's config keeps a test's GRPOConfig arguments, and the comparison names the
tests that pass with GRPOTrainer only."""

from __future__ import annotations

import pytest
from trl import GRPOConfig

from benchmarks.trl_peer_tests import _record_config_arguments, compare, solo_config
from sapo import SAPOConfig


def test_the_sapo_pass_gets_the_grpo_arguments_with_no_external_groups(tmp_path, monkeypatch):
    monkeypatch.setattr(GRPOConfig, "__init__", GRPOConfig.__init__)  # restored after the test
    _record_config_arguments()
    grpo = GRPOConfig(
        str(tmp_path), per_device_train_batch_size=3, num_generations=3, gradient_accumulation_steps=2,
        learning_rate=0.1, use_cpu=True, report_to="none",
    )  # fmt: skip
    sapo = solo_config(grpo, "model")
    assert isinstance(sapo, SAPOConfig) and sapo.num_external == 0 and sapo.num_local == 2
    assert (sapo.output_dir, sapo.learning_rate, sapo.generation_batch_size) == (str(tmp_path), 0.1, 6)
    assert sapo.epsilon_high == grpo.epsilon_high  # GRPOConfig's default, not the SAPO paper's 0.28
    assert sapo.gradient_checkpointing == grpo.gradient_checkpointing


def test_the_comparison_lists_tests_passing_with_grpotrainer_only():
    passes = {
        "grpo": {"a": "passed", "b": "passed", "c": "failed"},
        "bridge": {"a": "passed", "b": "failed", "c": "passed"},
    }
    result = compare(passes)
    assert result["failing_only_here"] == {"bridge": ["b"]}
    assert result["passing_only_here"] == {"bridge": ["c"]}
    assert result["counts"]["bridge"] == {"passed": 2, "failed": 1, "error": 0, "skipped": 0}


def test_an_unknown_pass_is_refused_with_the_choices():
    from benchmarks.trl_peer_tests import swap_trainer

    with pytest.raises(SystemExit, match="choose one of grpo, bridge, sapo"):
        swap_trainer("sapo-swarm")
