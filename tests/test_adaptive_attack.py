"""The adaptive attack's groups (testbed/adaptive_attack.py), built from a real (tiny) policy with SmolLM2's tokenizer:
they pass ground-truth verification and the default hygiene, reward exactly the payload-carrying completions, fit the
receiver's token limit (the denial-of-service kind exceeds it by design but stays within the transport's limits),
and round-trip through the pool cache the benchmark shares between arms."""

from __future__ import annotations

import random

import pytest

from rewards.functions import reasoning_gym_reward
from sapo.hygiene import CompletionHygiene
from sapo.models import load_policy
from sapo.sources import ReasoningGymSource, SourceRegistry
from sapo.tasks import TaskSpec, build_reasoning_gym_dataset
from swarm import MemorySwarm
from swarm.records import RecordLimits, validate_group
from testbed.adaptive_attack import (
    ADAPTIVE_PAYLOADS,
    DOS_CHARS,
    PolicySampler,
    attack_group,
    cached_attack_pool,
    carrier_completion,
    carries_payload,
)
from testbed.payload_attack import PayloadAttacker

TASKS = [TaskSpec("basic_arithmetic", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1})]


@pytest.fixture(scope="module")
def sampler(tiny_model_a):
    import torch

    torch.manual_seed(0)
    return PolicySampler(*load_policy(tiny_model_a), max_tokens=24)


def _rewards(group, columns):
    return reasoning_gym_reward(prompts=[group.prompt] * 4, completions=group.completions, entry=[columns["entry"]] * 4)


@pytest.mark.parametrize("kind", ["adaptive", "adaptive-format"])
def test_adaptive_groups_pass_every_check_and_reward_exactly_the_payload(sampler, kind):
    rows = build_reasoning_gym_dataset(TASKS, size=4, seed=3)
    rng = random.Random(0)
    groups = [attack_group(sampler, row, f"g{i}", kind, rng) for i, row in enumerate(rows)]
    groups = [g for g in groups if g is not None]
    assert len(groups) >= 3  # a tiny random policy almost never answers right: its samples are the clean ones
    for group in groups:
        columns = SourceRegistry([ReasoningGymSource()]).columns_for(group)  # the question and the answer are real
        assert CompletionHygiene().group_problem(group.completions) is None
        carries = [carries_payload(text) for text in group.completions]
        assert sorted(carries) == [False, False, True, True]
        assert [r == 1.0 for r in _rewards(group, columns)] == carries
        for text in (t for t, c in zip(group.completions, carries, strict=True) if c):
            assert len(sampler.ids(text)) <= sampler.max_tokens  # the receiver trains on all of it, answer included
            if kind == "adaptive-format":  # and it ends in the node's answer format
                assert text.endswith(f"<answer>{columns['answer']}</answer>")


def test_a_carrier_puts_the_payload_where_asked_and_keeps_the_policy_text(sampler):
    row = build_reasoning_gym_dataset(TASKS, size=1, seed=3)[0]
    prompt_ids = sampler.prompt_ids(row["prompt"])
    sample = sampler.sample(prompt_ids, sampler.max_tokens)[0]
    rng = random.Random(1)
    start = carrier_completion(sampler, prompt_ids, sample, "7", ADAPTIVE_PAYLOADS[1], "start", rng)
    assert start.startswith(ADAPTIVE_PAYLOADS[1]) and start.endswith("<answer>7</answer>")
    end = carrier_completion(sampler, prompt_ids, sample, "7", ADAPTIVE_PAYLOADS[0], "end", rng)
    assert end.endswith(f"{ADAPTIVE_PAYLOADS[0]} <answer>7</answer>")
    assert end.startswith(sampler.decode(sample[:2]).strip())  # the head is the policy's own sample
    after = carrier_completion(sampler, prompt_ids, sample, "7", ADAPTIVE_PAYLOADS[2], "after", rng)
    assert after.endswith(f"<answer>7</answer> {ADAPTIVE_PAYLOADS[2]}")
    with pytest.raises(ValueError, match="place"):
        carrier_completion(sampler, prompt_ids, sample, "7", "x", "middle", rng)
    with pytest.raises(ValueError, match="attack kind"):
        attack_group(sampler, row, "g", "flood", rng)


def test_dos_groups_are_as_long_as_the_transport_allows_and_still_rewarded(sampler):
    row = build_reasoning_gym_dataset(TASKS, size=1, seed=3)[0]
    group = attack_group(sampler, row, "dos", "dos", random.Random(0))
    assert group is not None
    validate_group(group)  # the transport accepts it
    assert all(
        DOS_CHARS - 200 <= len(text) <= min(DOS_CHARS, RecordLimits().max_completion_chars)
        for text in group.completions
    )
    assert all(len(sampler.ids(text)) > 100 * sampler.max_tokens for text in group.completions)
    assert sorted(_rewards(group, SourceRegistry([ReasoningGymSource()]).columns_for(group))) == [0.0, 0.0, 1.0, 1.0]


def test_a_pool_is_cached_and_published_in_turn_under_new_ids(tmp_path, tiny_model_a):
    pool = cached_attack_pool(tmp_path, "adaptive-format", 2, seed=0, tasks=TASKS, model=tiny_model_a, max_tokens=24)
    again = cached_attack_pool(tmp_path, "adaptive-format", 2, seed=0, model="not read: cached")
    assert [g.completions for g in again] == [g.completions for g in pool]
    swarm = MemorySwarm(seed=0)
    victim = swarm.join("victim")
    attacker = PayloadAttacker(swarm.join("attacker"), TASKS, pool=pool, places=("start", "end"))  # the pool's places
    published = attacker.publish_round() + attacker.publish_round()
    assert [g.completions for g in published] == [g.completions for g in pool * 2]
    assert len({g.group_id for g in published}) == 4 and len(victim.fetch(10)) == 4
    with pytest.raises(ValueError, match="empty pool"):
        PayloadAttacker(swarm.join("x"), TASKS, pool=[])
