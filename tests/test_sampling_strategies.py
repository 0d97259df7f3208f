"""The success-gated and weak-prompt-first sampling strategies: which external groups each takes, and why."""

from __future__ import annotations

import random
import time

import pytest

from sapo.sampling import (
    Candidate,
    SuccessGatedSampler,
    UniformSampler,
    WeakPromptFirstSampler,
    describe_samplers,
    make_sampler,
    sampler_name,
)
from swarm.records import Group, Provenance


def _candidate(rewards: list[float], gid: str, task: str = "t", sender: str = "peer"):
    group = Group(
        group_id=gid,
        prompt=[{"role": "user", "content": "q"}],
        completions=[f"c{i}" for i in range(len(rewards))],
        provenance=Provenance(source="reasoning_gym", dataset=task),
        created_at=time.time(),
    )
    return Candidate(sender=sender, group=group, rewards=rewards)


def test_success_gated_takes_only_groups_with_a_success_beside_failures():
    nan = float("nan")
    candidates = [
        _candidate([1.1, 0.0, 0.1, 0.0], "right-and-wrong"),  # a right answer (1.0 + format 0.1) beside wrong ones
        _candidate([0.1, 0.0, 0.1, 0.0], "format-only"),  # spread from the format reward alone: no success
        _candidate([1.2, 1.2, 1.2, 1.2], "all-right"),  # a success, but no spread: no gradient
        _candidate([nan, 1.0, 0.0, nan], "partly-unscored"),  # unscorable completions are ignored
    ]
    selection = SuccessGatedSampler().select(candidates, k=4, rng=random.Random(0))
    assert sorted(c.group.group_id for c in selection.chosen) == ["partly-unscored", "right-and-wrong"]
    assert selection.dropped == {"no_success": 1, "zero_advantage": 1}
    # the threshold decides what "correct" means: at 0.1 the format-only group counts as a success
    lenient = make_sampler("success_gated", success_threshold=0.1).select(candidates, k=4, rng=random.Random(0))
    assert "format-only" in {c.group.group_id for c in lenient.chosen}


def test_weak_prompt_first_prefers_tasks_this_peer_fails_on():
    sampler = make_sampler("weak_prompt_first", success_window=2)
    assert isinstance(sampler, WeakPromptFirstSampler)
    sampler.observe_own_groups([("easy", [1.0, 0.0, 1.0, 0.1]), ("hard", [0.1, 0.0, 0.0, 0.0])])
    assert sampler.is_weak("hard") and not sampler.is_weak("easy")
    assert sampler.is_weak("never-generated")  # no own groups of a task: weak
    candidates = [_candidate([1.0, 0.0], f"easy{i}", task="easy") for i in range(3)]
    candidates += [_candidate([1.0, 0.0], f"hard{i}", task="hard") for i in range(2)]
    candidates.append(_candidate([0.0, 0.0], "hard-flat", task="hard"))  # weak task, but no spread
    for seed in range(5):
        chosen = sampler.select(candidates, k=2, rng=random.Random(seed)).chosen
        assert sorted(c.group.group_id for c in chosen) == ["hard0", "hard1"]
    more = sampler.select(candidates, k=4, rng=random.Random(0))
    assert [task for task in (c.group.provenance.dataset for c in more.chosen)] == ["hard", "hard", "easy", "easy"]
    assert more.dropped == {"zero_advantage": 1}
    # the window remembers the last 2 own groups per task: two failures on "easy" make it weak again
    sampler.observe_own_groups([("easy", [0.0, 0.1]), ("easy", [0.0, 0.0])])
    assert sampler.is_weak("easy")


def test_new_strategies_are_registered_documented_and_validated():
    assert sampler_name("success_gated") == "success_gated" and sampler_name("weak_prompt_first") == "weak_prompt_first"
    text = describe_samplers()
    assert '`"success_gated"` takes only groups' in text and '`"weak_prompt_first"` drops groups' in text
    with pytest.raises(ValueError, match="does not take the option"):
        make_sampler("uniform", success_threshold=1.0)
    with pytest.raises(ValueError, match="success_window must be at least 1"):
        make_sampler("weak_prompt_first", success_window=0)
    UniformSampler().observe_own_groups([("t", [1.0, 0.0])])  # the trainer may call it on any strategy


def test_a_strategy_takes_the_config_fields_it_declares_and_a_registered_one_is_chosen_by_name(monkeypatch):
    """A sampler's options come from the SAPOConfig fields it declares (`config_fields`), for the built-in strategies
    and for one a user registers; the configuration then names it like a built-in one."""
    from sapo import SAPOConfig
    from sapo.sampling import SAMPLERS, DropZeroAdvantageSampler, register_sampler

    class Picky(DropZeroAdvantageSampler):
        config_fields = ("success_threshold", "success_window")

        def __init__(self, *args, success_threshold=1.0, success_window=8, **kwargs):
            super().__init__(*args, **kwargs)
            self.options = (success_threshold, success_window)

    monkeypatch.setattr("sapo.sampling.SAMPLERS", dict(SAMPLERS))  # the registration ends with the test
    register_sampler("picky", Picky)
    config = SAPOConfig(
        output_dir="/tmp/x", sampling_strategy="picky", success_threshold=0.25, success_window=3, use_cpu=True
    )
    assert make_sampler(config.sampling_strategy, config=config).options == (0.25, 3)
    assert make_sampler("picky", config=config, success_window=5).options == (0.25, 5)  # an explicit option wins
    assert make_sampler("success_gated", config=config).success_threshold == 0.25
    assert make_sampler("weak_prompt_first", config=config).own_success.window == 3
    assert not hasattr(make_sampler("uniform", config=config), "success_threshold")  # declares none, gets none
    with pytest.raises(ValueError, match="already registered"):
        register_sampler("uniform", Picky)
    with pytest.raises(TypeError, match="ExternalSampler subclass"):
        register_sampler("not_a_sampler", object)


def test_a_strategy_without_a_docstring_is_described_by_its_class_name(monkeypatch):
    """`describe_samplers` builds `sampling_strategy`'s help (at `sapo.config`'s import too): a registered class with
    no docstring of its own is listed by name, not an error."""
    from sapo import sampling

    monkeypatch.setattr(sampling, "SAMPLERS", dict(sampling.SAMPLERS))

    class Bare(sampling.UniformSampler):
        pass

    sampling.register_sampler("bare", Bare)
    text = sampling.describe_samplers()
    assert text.endswith('`"bare"` is `Bare` (no docstring)')
    assert '`"uniform"` samples uniformly among the eligible candidates' in text  # its own docstring, not Bare's
    assert "bare" in sampling.RegisteredSamplers() and list(sampling.RegisteredSamplers())[-2:] == ["bare", "paper"]
    assert '`"bare"`' in sampling.sampling_strategy_help()
