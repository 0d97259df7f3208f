"""The completion-poisoning attack's groups: they pass ground-truth verification and the default hygiene, have
reward spread under the honest reward, and reward exactly the payload-carrying completions."""

from __future__ import annotations

import random
import time

import pytest

from rewards.functions import reasoning_gym_reward
from sapo.hygiene import CompletionHygiene
from sapo.sources import ReasoningGymSource, SourceRegistry
from sapo.tasks import TaskSpec, build_reasoning_gym_dataset
from swarm import MemorySwarm
from testbed.payload_attack import (
    PAYLOAD_MARK,
    PAYLOADS,
    PayloadAttacker,
    payload_completion,
    payload_group,
    payload_rate,
)

TASKS = [TaskSpec("basic_arithmetic", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1})]


def test_payload_groups_pass_every_check_and_reward_the_payload():
    rows = build_reasoning_gym_dataset(TASKS, size=8, seed=1)
    rng = random.Random(0)
    verifier = SourceRegistry([ReasoningGymSource()])
    for i, row in enumerate(rows):
        group = payload_group(row, f"g{i}", rng)
        columns = verifier.columns_for(group)  # the answer is right: ground truth does not stop it
        assert CompletionHygiene().group_problem(group.completions) is None
        rewards = reasoning_gym_reward(
            prompts=[group.prompt] * 4, completions=group.completions, entry=[columns["entry"]] * 4
        )
        carries = [PAYLOAD_MARK in text for text in group.completions]
        assert sorted(carries) == [False, False, True, True]
        assert all((reward == 1.0) == carry for reward, carry in zip(rewards, carries, strict=True)), rewards
    assert payload_rate(["a zebracoin b", "clean", "ZEBRACOIN", "x"]) == 0.5 and payload_rate([]) == 0.0


def test_payload_wording_and_place_are_the_attackers_choice():
    rng = random.Random(0)
    before = [payload_completion("7", rng, PAYLOADS[:1], ["before"]) for _ in range(10)]
    assert all(text.startswith(PAYLOADS[0]) and text.endswith("<answer>7</answer>") for text in before)
    after = [payload_completion("7", rng, PAYLOADS[:1], ["after"]) for _ in range(10)]
    assert all(text.endswith("</answer> " + PAYLOADS[0]) for text in after)
    with pytest.raises(ValueError, match="places"):
        PayloadAttacker(MemorySwarm().join("attacker"), TASKS, places=["middle"])


def test_the_attacker_publishes_rounds_until_stopped():
    swarm = MemorySwarm(seed=0)
    victim = swarm.join("victim")
    attacker = PayloadAttacker(swarm.join("attacker"), TASKS, interval=0.05, groups_per_round=2).start()
    try:
        received = []
        for _ in range(200):
            received += victim.fetch(10)
            if len(received) >= 6:
                break
            time.sleep(0.02)
    finally:
        attacker.stop()
    assert len(received) >= 6 and len({item.group.group_id for item in received}) == len(received)
    assert all(item.sender == "attacker" for item in received)
