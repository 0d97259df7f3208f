"""Holding the usable received groups a round left unchosen (`SAPOConfig.swarm_hold`): real TRL steps on a MemorySwarm
whose sender published everything before the first step, so every later slot is filled from the hold or by an own
group."""

from __future__ import annotations

import dataclasses
import time
from collections import Counter

import pytest
from transformers import TrainerCallback

from benchmarks import sharing_counts
from sapo import SAPOConfig, SAPOTrainer
from sapo.group_log import read_group_log
from sapo.hold import SwarmHold
from sapo.node.options import parse_node_options
from swarm import MemorySwarm
from tests.trainer_fixtures import RewardProbe, _external_group, _trainer, candidate

AGES = [60.0 - 5 * i for i in range(6)]  # group s5 is the newest
"""Seconds before the run each published group was made."""


def _run(tmp_path, tokenizer, name: str, callbacks=(), **fields):
    """A receiver taking 2 groups a step for 3 steps, from one sender's 6 usable groups, all fetched in the first."""
    swarm = MemorySwarm(seed=0)
    groups = []
    for i, age in enumerate(AGES):
        group = _external_group("What is 0 + 0?", [f"s{i} x", "bb", "c x", "dd"], f"s{i}", answer="0")
        groups.append(dataclasses.replace(group, created_at=time.time() - age))
    swarm.join("sender").publish(groups)
    probe = RewardProbe(lambda text: 1.0 if "x" in text else 0.0)  # every group has reward spread
    trainer = _trainer(
        tmp_path, tokenizer, name, probe, swarm=swarm.join("rx"), max_steps=3, external_source_policy="trust",
        groups_log="groups.jsonl", sampling_strategy="uniform", **fields,
    )  # fmt: skip
    for callback in callbacks:
        callback.trainer = trainer
        trainer.add_callback(callback)
    trainer.train()
    return trainer, read_group_log(tmp_path / name / "groups.jsonl")


def test_unchosen_groups_are_held_newest_first_and_fill_later_slots(tmp_path, smollm_tokenizer):
    dropped, dropped_log = _run(tmp_path, smollm_tokenizer, "drop")
    # Without a hold the 4 groups left unchosen in the first step are gone: steps 2 and 3 fill in their slots.
    assert (dropped.swarm_totals["external_groups"], dropped.swarm_totals["fill_ins"]) == (2, 4)
    assert Counter(r["outcome"] for r in dropped_log if r["origin"] == "swarm") == {"taken": 2, "not_chosen": 4}

    held, log = _run(tmp_path, smollm_tokenizer, "hold", swarm_hold=3)
    totals = held.swarm_totals
    # Step 1 takes 2 and holds the newest 3 of the 4 left; step 2 takes 2 of them and holds the third, which step 3
    # takes beside one fill-in.
    assert (totals["external_groups"], totals["fill_ins"]) == (5, 1), dict(totals)
    assert (totals["held_offered"], totals["held_taken"]) == (4, 3)
    received = [r for r in log if r["origin"] == "swarm"]
    by_step = {step: Counter(r["outcome"] for r in received if r["step"] == step) for step in (0, 1, 2)}
    assert by_step == {0: {"taken": 2, "held": 3, "not_chosen": 1}, 1: {"taken": 2, "held": 1}, 2: {"taken": 1}}
    taken = Counter(r["group_id"] for r in received if r["outcome"] == "taken")
    assert len(taken) == 5 and set(taken.values()) == {1}  # each trained on once
    (dropped_id,) = [r["group_id"] for r in received if r["outcome"] == "not_chosen"]
    first_held = {r["group_id"] for r in received if r["step"] == 0 and r["outcome"] == "held"}
    age = {f"s{i}": a for i, a in enumerate(AGES)}
    assert all(age[dropped_id] > age[g] for g in first_held)  # the oldest of those left was the one dropped
    assert not held.intake.hold  # nothing left over
    # The campaign's counts read a held line as no verdict: the group is judged where it is taken or set aside.
    counts = sharing_counts.node_counts(log, {}, slots=2, local=2)
    assert (counts["taken"], counts["judged"], counts["held_lines"], counts["fill_ins"]) == (5, 6, 4, 1)
    assert "dropped/held" not in counts and counts["dropped/not_chosen"] == 1


class _AgeTheHold(TrainerCallback):
    """After the first step, makes every held group older than `max_group_age` (``trainer`` is set once it exists)."""

    trainer = None

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 1:
            for candidate in self.trainer.intake.hold.groups:
                candidate.group = dataclasses.replace(candidate.group, created_at=candidate.group.created_at - 1e4)


def test_a_held_group_past_max_group_age_is_set_aside_as_stale(tmp_path, smollm_tokenizer):
    trainer, log = _run(tmp_path, smollm_tokenizer, "stale", callbacks=[_AgeTheHold()], swarm_hold=4)
    received = [r for r in log if r["origin"] == "swarm"]
    held = {r["group_id"] for r in received if r["step"] == 0 and r["outcome"] == "held"}
    assert len(held) == 4
    # Offered again in step 2, each is set aside by the sampler's one staleness rule and never trained on.
    assert {r["group_id"] for r in received if r["step"] == 1 and r["outcome"] == "stale"} == held
    assert not held & {r["group_id"] for r in received if r["outcome"] == "taken"}
    assert trainer.swarm_totals["dropped/stale"] == 4 and trainer.swarm_totals["held_taken"] == 0
    assert trainer.swarm_totals["fill_ins"] == 4


@pytest.mark.parametrize("value", [-1, 1.5, True])
def test_a_bad_swarm_hold_is_refused_by_name(tmp_path, value):
    with pytest.raises(ValueError, match="swarm_hold must be a non-negative integer"):
        SAPOConfig(str(tmp_path), num_local=1, num_external=1, num_generations=2, swarm_hold=value)


def test_sapo_node_takes_swarm_hold():
    assert parse_node_options(["--swarm_hold", "4"]).args.swarm_hold == 4
    assert parse_node_options([]).args.swarm_hold == 0


def test_the_hold_keeps_the_newest_and_a_date_ahead_of_the_clock_buys_no_precedence():
    now = time.time()
    old, new, ahead = candidate("a", [0, 1], 30, "old"), candidate("a", [0, 1], 5, "new"), candidate("b", [0, 1])
    ahead.group = dataclasses.replace(ahead.group, created_at=now + 3600)  # claims to be made an hour from now
    hold = SwarmHold(2)
    assert hold.keep([old, new], now) == [] and len(hold) == 0  # a round that was not offered the hold keeps none
    assert hold.offer() == []
    # ``ahead`` counts as made now, ``new`` 5 s before: ahead first, then new; the oldest does not fit
    assert hold.keep([old, new, ahead], now + 1) == [ahead, new]
    hold.new_round()
    assert not hold.was_offered(ahead)
    assert hold.offer() == [ahead, new] and len(hold) == 0
    assert hold.was_offered(ahead) and not hold.was_offered(old)


def test_senders_take_turns_at_the_hold_so_one_dating_its_groups_latest_never_fills_it():
    """The hold kept the newest groups: a sender dating its groups a few seconds ahead (the transport allows 3 s) filled
    every place of it, and took the held groups' slots beside its share of each fetch. Senders now take turns, each
    one's newest first: with four places and two senders, two each; a sender alone may still fill it."""
    now = time.time()
    eager = [candidate("eager", [0, 1], age=-3.0, gid=f"e{k}") for k in range(6)]  # dated 3 s ahead
    honest = [candidate("honest", [0, 1], age=10.0 + k, gid=f"h{k}") for k in range(6)]
    hold = SwarmHold(4)
    hold.offer()
    kept = hold.keep([*eager, *honest], now)
    assert Counter(c.sender for c in kept) == {"eager": 2, "honest": 2}
    assert [c.group.group_id for c in kept if c.sender == "honest"] == ["h0", "h1"]  # its newest
    hold.new_round()
    hold.offer()
    assert Counter(c.sender for c in hold.keep(eager, now)) == {"eager": 4}


def _one_round_of_two_swarm_groups(tmp_path, tokenizer, name: str, swarm: MemorySwarm) -> SAPOTrainer:
    """A receiver in ``swarm`` after one step taking two of its groups (uniformly), rewarding "x" in a completion."""
    probe = RewardProbe(lambda text: 1.0 if "x" in text else 0.0)
    trainer = _trainer(
        tmp_path, tokenizer, name, probe, swarm=swarm.join("rx"), max_steps=1, num_external=2,
        external_source_policy="trust", sampling_strategy="uniform",
    )  # fmt: skip
    trainer.train()
    return trainer


def test_a_group_re_sent_under_other_ids_and_senders_takes_one_slot_of_a_batch(tmp_path, smollm_tokenizer):
    """The same completions to the same question, re-sent under new ids or copied by another identity, took several
    slots of one batch (the loss counted them k times). A round keeps the first and sets the repeats aside as
    `duplicate`, against no sender; a different group of the same question is kept."""
    swarm = MemorySwarm(seed=0)
    same = ["c x", "bb", "s x", "dd"]
    swarm.join("sender").publish([_external_group("What is 0 + 0?", same, f"a{k}", answer="0") for k in range(3)])
    swarm.join("copier").publish([
        _external_group("What is 0 + 0?", same, "copy", answer="0"),
        _external_group("What is 0 + 0?", ["other x", "bb", "cc", "dd"], "own", answer="0"),
    ])  # fmt: skip
    trainer = _one_round_of_two_swarm_groups(tmp_path, smollm_tokenizer, "dup", swarm)
    assert trainer.swarm_totals["dropped/duplicate"] == 3
    assert trainer.swarm_totals["external_groups"] == 2
    taken = [[c.text for c in candidate.tokenized] for candidate in trainer.last_external]
    assert len({tuple(texts) for texts in taken}) == 2  # never the same group twice


def test_a_copied_group_earns_neither_its_copier_nor_its_writer_standing(tmp_path, smollm_tokenizer):
    """The first of two copies to arrive is kept, and it need not be the original: a copier of honest groups whose
    copies came first earned their standing (found usable: re-derived first, a share of the reader's refills). Who
    wrote a group two senders sent cannot be told, so neither earns standing by it; a sender's own group still does."""
    swarm = MemorySwarm(seed=0)
    same = ["c x", "bb", "s x", "dd"]
    swarm.join("writer").publish([_external_group("What is 0 + 0?", same, "w0", answer="0")])
    swarm.join("copier").publish([_external_group("What is 0 + 0?", same, "copy", answer="0")])
    swarm.join("other").publish([_external_group("What is 0 + 0?", ["o x", "bb", "cc", "dd"], "o0", answer="0")])
    trainer = _one_round_of_two_swarm_groups(tmp_path, smollm_tokenizer, "copied", swarm)
    assert trainer.swarm_totals["dropped/duplicate"] == 1 and trainer.swarm_totals["external_groups"] == 2
    assert {c.sender for c in trainer.last_external} & {"writer", "copier"}  # one of the two copies was trained on
    standing, now = trainer.intake.standing, time.time()
    assert standing.found_usable("other", now)
    assert not standing.found_usable("writer", now) and not standing.found_usable("copier", now)
