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
