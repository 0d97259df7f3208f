"""Self-replay (`SAPOConfig.replay`): the buffer's bounds, and real TRL steps that train on own earlier groups."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from sapo import SAPOConfig
from sapo.replay import ReplayBuffer
from sapo.sampling import REPLAY, Candidate
from swarm import MemorySwarm
from tests.trainer_fixtures import G, RewardProbe, _external_group, _metric, _trainer


def _candidate(gid: str, rewards: list[float]) -> Candidate:
    group = _external_group("What is 1 + 1?", [f"{gid}-{k}" for k in range(len(rewards))], gid)
    return Candidate("self", group, rewards, origin=REPLAY)


def test_the_buffer_keeps_groups_with_spread_within_their_age_and_uses():
    buffer = ReplayBuffer(max_age=2, max_uses=1)
    assert buffer.add([_candidate("a", [0.0, 1.0]), _candidate("flat", [1.0, 1.0])], step=0) == 1
    assert buffer.offer(0) == []  # never the step's own groups
    assert [c.group.group_id for c in buffer.offer(1)] == ["a"]
    buffer.add([_candidate("b", [0.0, 0.5])], step=1)
    buffer.taken(buffer.offer(2)[:1])  # "a" trained on once: used up
    assert [c.group.group_id for c in buffer.offer(2)] == ["b"]
    assert buffer.offer(4) == []  # "b" is 3 steps old: past max_age, forgotten
    assert len(buffer) == 0


def test_a_group_is_replayed_up_to_max_uses():
    buffer = ReplayBuffer(max_age=10, max_uses=2)
    buffer.add([_candidate("a", [0.0, 1.0])], step=0)
    for step in (1, 2):
        (offered,) = buffer.offer(step)
        buffer.taken([offered])
    assert buffer.offer(3) == []


@pytest.mark.parametrize("field,value", [("replay", "always"), ("replay_max_age", 0), ("replay_max_uses", 0)])
def test_bad_replay_settings_are_refused_by_name(tmp_path, field, value):
    with pytest.raises(ValueError, match=field):
        SAPOConfig(str(tmp_path), num_local=1, num_external=1, num_generations=2, **{field: value})


def _group_log(trainer) -> list[dict]:
    path = trainer.args.output_dir + "/groups.jsonl"
    return [json.loads(line) for line in open(path)]


def test_a_trainer_alone_replays_its_own_groups_with_their_age_in_the_log(tmp_path, smollm_tokenizer):
    probe = RewardProbe(lambda text: float(len(text) % 3))  # differs between completions: groups with spread
    trainer = _trainer(
        tmp_path, smollm_tokenizer, "alone", probe, replay="fill", replay_max_age=2, groups_log="groups.jsonl",
        max_steps=5,
    )  # fmt: skip
    trainer.train()
    log = _group_log(trainer)
    own = {r["group_id"]: r for r in log if r["origin"] == "own"}
    replayed = [r for r in log if r["origin"] == "replay" and r["outcome"] == "taken"]
    assert replayed, "no own group was replayed in 5 steps"
    # The first step has nothing to replay: both external slots are filled in; later ones replay.
    assert _metric(trainer, "sapo/fill_ins")[0] == 2.0
    assert sum(_metric(trainer, "sapo/replay_groups")) == len(replayed) == trainer.swarm_totals["replay_groups"]
    assert _metric(trainer, "sapo/external_groups") == [0.0] * 5
    for record in replayed:
        source = own[record["group_id"]]
        assert 1 <= record["step_lag"] <= 2 and record["step"] == source["step"] + record["step_lag"]
        assert record["age_seconds"] > 0
        assert record["rewards"] == pytest.approx(source["rewards"]) and source["spread"]
    # Never twice (replay_max_uses=1), never an own group without reward spread.
    assert max(Counter(r["group_id"] for r in replayed).values()) == 1
    # What was replayed is trained on again: its completions reach TRL's batch a second time.
    trained = Counter(probe.trained)  # (question, completion) of every row TRL trained on
    assert sum(trained.values()) == 5 * 4 * G
    assert sum(count - 1 for count in trained.values()) >= len(replayed) * G


def test_only_replay_leaves_the_swarm_unread_and_fill_takes_the_swarm_first(tmp_path, smollm_tokenizer):
    def run(mode: str):
        swarm = MemorySwarm(seed=0)
        swarm.join("sender").publish(
            [_external_group("What is 0 + 0?", [f"s{i} x", "bb", "c x", "dd"], f"s{i}", answer="0") for i in range(24)]
        )
        probe = RewardProbe(lambda text: 1.0 if "x" in text else float(len(text) % 2))
        trainer = _trainer(
            tmp_path, smollm_tokenizer, mode, probe, swarm=swarm.join("rx"), replay=mode, max_steps=3,
            external_source_policy="trust", groups_log="groups.jsonl",
        )  # fmt: skip
        trainer.train()
        return trainer

    only = run("only")
    assert only.swarm_totals["candidates"] == 0 and only.swarm_totals["external_groups"] == 0
    assert only.swarm_totals["replay_groups"] > 0
    assert {r["origin"] for r in _group_log(only)} == {"own", "replay"}
    fill = run("fill")
    # 8 fresh usable swarm groups fetched for 2 slots each step: the swarm fills every slot, though the replay has
    # groups to offer from the second step on.
    assert fill.intake.replay.state()["groups"] > 0
    assert fill.swarm_totals["external_groups"] == 6 and fill.swarm_totals["replay_groups"] == 0


def test_replayed_groups_pass_the_plausibility_check_and_token_floor(tmp_path, smollm_tokenizer):
    probe = RewardProbe(lambda text: float(len(text) % 3))
    trainer = _trainer(
        tmp_path, smollm_tokenizer, "plausible", probe, replay="fill", groups_log="groups.jsonl", max_steps=4,
        plausibility_margin=1.0,
    )  # fmt: skip
    trainer.train()
    assert trainer.intake.plausibility is not None  # on without a swarm, for the replay
    judged = [r for r in _group_log(trainer) if r["origin"] == "replay"]
    assert judged and {r["outcome"] for r in judged} <= {"taken", "implausible", "not_chosen"}
    assert trainer.swarm_totals["external_tokens"] > 0  # the token floor scored every replayed completion taken
