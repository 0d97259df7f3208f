"""SAPOConfig validation and the external-group samplers: fast, no model."""

import random

import pytest

from sapo.config import SAPOConfig
from sapo.sampling import DropZeroAdvantageSampler, UniformSampler, make_sampler
from tests.trainer_fixtures import candidate


def _config(**overrides):
    base = dict(output_dir="/tmp/sapo-test-config", report_to="none", use_cpu=True)
    base.update(overrides)
    return SAPOConfig(**base)


@pytest.mark.parametrize(
    "overrides, field",
    [
        (dict(num_local=0, num_external=0), "num_local + num_external"),
        (dict(num_local=-1), "num_local"),
        (dict(num_external=-2), "num_external"),
        (dict(sampling_strategy="greedy"), "sampling_strategy"),
        (dict(external_source_policy="maybe"), "external_source_policy"),
        (dict(num_generations=1), "num_generations"),
        (dict(max_groups_per_peer=0), "max_groups_per_peer"),
        (dict(regeneration_budget=0), "regeneration_budget"),
        (dict(regeneration_budget=-5.0), "regeneration_budget"),
        (dict(sender_rederivation_seconds=0.0), "sender_rederivation_seconds"),
        (dict(newcomer_rederivation_seconds=-1.0), "newcomer_rederivation_seconds"),
        (dict(external_pool_size=1, num_external=4), "external_pool_size"),
        (
            dict(num_local=3, num_external=0, num_generations=2, per_device_train_batch_size=4),
            "per_device_train_batch_size",
        ),
    ],
)
def test_bad_config_names_the_field(overrides, field):
    with pytest.raises(ValueError, match=field.replace("+", r"\+")):
        _config(**overrides)


def test_a_round_is_one_optimizer_step_by_default():
    config = _config(num_local=3, num_external=1, num_generations=4, per_device_train_batch_size=8)
    assert config.generation_batch_size == 16
    assert config.gradient_accumulation_steps == 2
    assert config.steps_per_generation == 2
    assert config.groups_per_round == 4


def test_paper_defaults():
    # The paper's batch (8 groups of 8) is split as the paper's best mix: 4 local / 4 external.
    config = _config(per_device_train_batch_size=8, gradient_accumulation_steps=8)
    assert (config.num_local, config.num_external) == (4, 4)
    assert config.beta == 0.0 and config.epsilon == 0.2 and config.epsilon_high == 0.28


def test_drop_zero_advantage_sampler_drops_zero_advantage_groups():
    flat = [candidate("a", [1.0, 1.0, 1.0], gid=f"flat{i}") for i in range(5)]
    useful = [candidate("b", [0.0, 1.0, 0.0], gid=f"useful{i}") for i in range(2)]
    selection = DropZeroAdvantageSampler().select(flat + useful, k=4, rng=random.Random(0))
    assert {c.group.group_id for c in selection.chosen} == {"useful0", "useful1"}
    assert selection.dropped["zero_advantage"] == 5
    # The uniform strategy keeps them: the filter is what changes the batch.
    uniform = UniformSampler().select(flat + useful, k=4, rng=random.Random(0))
    assert len(uniform.chosen) == 4 and "zero_advantage" not in uniform.dropped


def test_per_peer_cap_limits_one_sender():
    greedy = [candidate("spammer", [0.0, 1.0], gid=f"s{i}") for i in range(10)]
    other = [candidate("other", [0.0, 1.0], gid="o")]
    selection = UniformSampler(max_groups_per_peer=1).select(greedy + other, k=4, rng=random.Random(1))
    senders = [c.sender for c in selection.chosen]
    assert sorted(senders) == ["other", "spammer"]
    assert selection.dropped["peer_cap"] >= 1


def test_stale_and_own_groups_are_never_taken():
    candidates = [
        candidate("me", [0.0, 1.0], gid="mine"),
        candidate("old", [0.0, 1.0], age=3600, gid="stale"),
        candidate("fresh", [0.0, 1.0], gid="ok"),
    ]
    selection = UniformSampler(max_group_age=60, self_id="me").select(candidates, k=3, rng=random.Random(0))
    assert [c.group.group_id for c in selection.chosen] == ["ok"]
    assert selection.dropped == {"own_group": 1, "stale": 1}


def test_unscorable_rewards_count_as_no_signal():
    nan = float("nan")
    assert candidate("a", [nan, nan]).has_zero_advantage
    assert not candidate("a", [nan, 1.0, 0.0]).has_zero_advantage


def test_make_sampler_rejects_unknown_names():
    with pytest.raises(ValueError, match="sampling_strategy='best'"):
        make_sampler("best")
    assert isinstance(make_sampler("drop_zero_advantage"), DropZeroAdvantageSampler)
    assert isinstance(make_sampler("paper"), DropZeroAdvantageSampler)  # the former name, kept as an alias
