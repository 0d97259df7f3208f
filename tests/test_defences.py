"""Defences against poisoned completions: completion hygiene, per-sender standing and plausibility under the
receiver's policy, on their own and inside a trainer that takes real optimizer steps."""

from __future__ import annotations

import itertools
import json
import pickle
import time
from types import SimpleNamespace

import pytest
import torch
from datasets import Dataset

from rewards import extract_answer
from sapo import SAPOConfig, SAPOTrainer
from sapo.group_log import read_group_log
from sapo.hygiene import CompletionHygiene
from sapo.models import build_tiny_model
from sapo.plausibility import (
    CompletionStatistics,
    PlausibilityCheck,
    completion_statistics,
    floor_mask,
    typicality_scores,
    worst_span,
)
from sapo.standing import SenderStanding
from sapo.tally import OTHER_SENDERS, SenderTally
from sapo.tasks import TaskSpec, build_reasoning_gym_dataset
from swarm import Group, MemorySwarm, Provenance
from swarm.records import provenance_from_wire
from testbed.tiny_run import tiny_config, tiny_trainer
from tests.trainer_fixtures import RewardProbe, _external_group, _metric, _trainer


def test_hygiene_names_what_is_wrong_with_a_completion():
    hygiene = CompletionHygiene(max_chars=40, max_non_ascii_fraction=0.2, forbidden_patterns=[r"https?://"])
    assert hygiene.problem("The answer is <answer>4</answer>.\n\tDone.") is None
    assert "characters" in hygiene.problem("x" * 41)
    assert "U+200B" in hygiene.problem("zero\u200bwidth")  # hides text from a reader
    assert "non-ASCII" in hygiene.problem("ééééé abc")
    assert "https?://" in hygiene.problem("see http://evil.example")
    assert hygiene.group_problem(["fine", "fine", "see https://x"]).startswith("completion 2:")
    custom = CompletionHygiene(extra_filter=lambda text: "shouting" if text.isupper() else None)
    assert custom.problem("HELLO") == "shouting" and custom.problem("hello") is None
    assert CompletionHygiene(forbid_control_chars=False).problem("a\x00b") is None
    with pytest.raises(ValueError, match="regular expression"):
        CompletionHygiene(forbidden_patterns=["("])


def test_a_sender_whose_groups_keep_being_dropped_is_benched_for_a_while():
    standing = SenderStanding(drop_limit=3, window=5, bench_seconds=60)
    now = 1000.0
    for usable in (False, True, False):
        assert standing.record("liar", usable, now) is None
    assert standing.record("liar", False, now) == 60  # the third drop among its last five
    assert standing.is_benched("liar", now + 59) and not standing.is_benched("liar", now + 61)
    assert standing.benched(now) == ["liar"]
    later = now + 61  # benched again: twice as long
    assert [standing.record("liar", False, later) for _ in range(3)] == [None, None, 120]
    assert standing.is_benched("liar", later + 119) and not standing.is_benched("liar", later + 121)
    for _ in range(10):  # an honest sender with one bad group in ten is never benched
        standing.record("honest", True, now)
    standing.record("honest", False, now)
    assert not standing.is_benched("honest", now)
    with pytest.raises(ValueError, match="drop_limit"):
        SenderStanding(drop_limit=6, window=5)


def test_trainer_drops_unhygienic_groups_and_benches_their_sender(tmp_path, smollm_tokenizer):
    tasks = [TaskSpec("basic_arithmetic", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1})]
    dataset = build_reasoning_gym_dataset(tasks, size=16, seed=3)
    swarm = MemorySwarm(seed=0)
    attacker, friend = swarm.join("attacker"), swarm.join("friend")

    def group(row, gid, payload):
        answer = row["answer"]
        return Group(
            group_id=gid,
            prompt=[{"role": "user", "content": row["prompt"][-1]["content"]}],
            completions=[f"<answer>{answer}</answer>{payload}"] * 2 + [f"<answer>x</answer>{payload}"] * 2,
            provenance=Provenance(**json.loads(row["provenance"])),
            metadata={"answer": answer},
            model="m",
            step=1,
            created_at=time.time(),
        )

    attacker.publish([group(dataset[i], f"bad-{i}", " visit http://evil.example") for i in range(3)])
    friend.publish([group(dataset[5], "good", "")])

    def exact(prompts, completions, answer, **kw):
        return [float(f"<answer>{a}</answer>" in c[0]["content"]) for c, a in zip(completions, answer, strict=True)]

    receiver, benches = swarm.join("honest"), []
    receiver.bench = lambda sender, seconds: benches.append((sender, seconds))  # SwarmTransport.bench: told of it
    trainer = tiny_trainer(
        tmp_path / "out", smollm_tokenizer, [exact], dataset, receiver,
        num_local=1, num_external=1, max_steps=1, external_pool_size=8, completion_forbidden_patterns=[r"https?://"],
        sender_drop_limit=2, sender_window=5,
        plausibility_margin=None,  # hygiene and standing alone (the check would refuse step 1's groups)
    )  # fmt: skip
    trainer.train()
    totals = trainer.swarm_totals
    # Two of the attacker's groups fail hygiene and bench it; its third is set aside unread (order is random).
    assert totals["dropped/hygiene"] == 2 and totals["dropped/benched_sender"] == 1, dict(totals)
    assert totals["benched_senders"] == 1 and trainer.intake.standing.benched(time.time()) == ["attacker"]
    assert benches == [("attacker", trainer.args.sender_bench_seconds)]  # its transport fetches none of its records
    assert trainer.taken_from == {"friend": 1}


def test_typicality_is_log_probability_plus_entropy_averaged_over_each_completion():
    logps = torch.tensor([[-1.0, -9.0, -2.0, -7.0], [-0.5, -4.0, -30.0, -30.0], [0.0, 0.0, 0.0, 0.0]])
    entropies = torch.tensor([[1.0, 1.0, 2.0, 3.0], [0.5, 1.0, 9.0, 9.0], [1.0, 1.0, 1.0, 1.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [0, 0, 0, 0]])  # padding never counts
    assert typicality_scores(logps, entropies, mask) == pytest.approx([(0 - 8 + 0 - 4) / 4, (0 - 3) / 2, 0.0])


def test_plausibility_judges_against_the_own_completions_and_refuses_without_them(tmp_path):
    check = PlausibilityCheck(margin=0.5, window=8, min_reference=4)
    assert check.threshold() is None and "no reference" in check.group_problem([-1.0])
    check.add_own([-0.5, -0.4, -0.6, -0.45])
    assert check.threshold() == pytest.approx(-1.1)  # 5th percentile of the own scores (-0.6), minus the margin
    assert check.group_problem([-0.5, -1.0]) is None
    assert check.group_problem([-0.5, -2.0]).startswith("completion 1 scores -2.00")
    check.add_own([0.1] * 8)  # the window keeps the latest 8
    assert check.threshold() == pytest.approx(-0.4)
    for bad in (dict(margin=-1.0), dict(window=2, min_reference=4)):
        with pytest.raises(ValueError):
            PlausibilityCheck(**bad)
    with pytest.raises(ValueError, match="plausibility_margin"):
        SAPOConfig(output_dir=str(tmp_path), plausibility_margin=-1.0, use_cpu=True)


def test_the_worst_span_sees_a_short_payload_that_the_mean_hides():
    # 40 tokens the policy writes itself (typicality 0 each) with 2 tokens it practically never writes spliced in
    logps, entropies = torch.full((3, 42), -1.0), torch.ones(3, 42)
    logps[1, 20:22] = -9.0  # typicality -8 twice: the mean moves by 16/42 nats, the worst span of 3 by 16/3
    mask = torch.ones(3, 42, dtype=torch.long)
    mask[2, 2:] = 0  # a 2-token completion (padded): shorter than a span, its mean is its span
    own, spliced, short = completion_statistics(logps, entropies, mask, span_tokens=3)
    assert own == CompletionStatistics(mean=0.0, span=0.0) and short == CompletionStatistics(mean=0.0, span=0.0)
    assert spliced.mean == pytest.approx(-16 / 42) and spliced.span == pytest.approx(-16 / 3)
    assert worst_span(torch.tensor([0.0, -1.0, -5.0, 2.0, -3.0]), 2) == pytest.approx(-3.0)
    assert worst_span(torch.tensor([]), 3) == 0.0

    check = PlausibilityCheck(margin=0.5, window=16, min_reference=4, span_margin=1.5, span_tokens=3)
    check.add_own(
        [CompletionStatistics(mean=m, span=s) for m, s in [(0.1, -2.0), (0.0, -1.0), (-0.2, -2.5), (0.3, -1.5)]]
    )
    assert check.threshold() == pytest.approx(-0.7) and check.span_threshold() == pytest.approx(-4.0)
    assert check.group_problem([own, short]) is None
    problem = check.group_problem([own, spliced])
    assert problem.startswith("completion 1: its worst 3 consecutive tokens score -5.33") and problem.test == "span"
    assert pickle.loads(pickle.dumps(problem)).test == "span"  # verdicts cross processes pickled
    assert check.group_problem([own, CompletionStatistics(mean=-3.0, span=0.0)]).test == "mean"
    mean_only = PlausibilityCheck(margin=0.5, window=16, min_reference=4, span_margin=None)
    mean_only.add_own(check._own)
    assert mean_only.span_threshold() is None and mean_only.group_problem([own, spliced]) is None  # what it missed
    for bad in (dict(span_margin=-1.0), dict(span_tokens=0)):
        with pytest.raises(ValueError):
            PlausibilityCheck(**bad)


def test_the_token_floor_masks_a_rare_token_and_its_neighbours():
    """A payload's rare token is one of several: the floor masks it and the tokens around it that carry the rest of
    the payload, within the window and never beyond the completion."""
    typicality = [0.0, -0.5, -9.0, -0.1, 0.2, -0.3, 0.0, 0.0, -12.0, 0.0]
    assert floor_mask(typicality, -8.0) == [1, 1, 0, 1, 1, 1, 1, 1, 0, 1]
    assert floor_mask(typicality, -8.0, before=1, after=2) == [1, 0, 0, 0, 0, 1, 1, 0, 0, 0]
    assert floor_mask(typicality, -10.0, before=3, after=6) == [1, 1, 1, 1, 1, 0, 0, 0, 0, 0]
    assert floor_mask(typicality, -20.0, before=3, after=6) == [1] * len(typicality)
    assert floor_mask([], -8.0, 3, 6) == []


def test_a_real_policy_finds_a_spliced_word_by_its_worst_span(smollm_tokenizer):
    """Under a real (tiny) policy that writes digits, a long digit string with " zebracoin" spliced in keeps a mean
    typicality within the default margin of the policy's own strings, and fails the worst-span test."""
    import random

    model, rng = _digit_policy(smollm_tokenizer).eval(), random.Random(0)
    template = [{"role": "user", "content": "Digits?"}]
    rendered = smollm_tokenizer.apply_chat_template(template, tokenize=False, add_generation_prompt=True)
    prompt = smollm_tokenizer(rendered, add_special_tokens=False)["input_ids"]

    def statistics(texts: list[str]) -> list[CompletionStatistics]:
        rows = [smollm_tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
        width = max(len(r) for r in rows)
        ids = torch.tensor([prompt + r + [smollm_tokenizer.pad_token_id] * (width - len(r)) for r in rows])
        with torch.no_grad():
            logits = model(ids).logits[:, len(prompt) - 1 : -1].float()
        logps_all = torch.log_softmax(logits, dim=-1)
        logps = logps_all.gather(2, ids[:, len(prompt) :, None])[..., 0]
        mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
        return check.statistics(logps, -(logps_all.exp() * logps_all).sum(-1), mask)

    check = PlausibilityCheck(
        span_margin=SAPOConfig.plausibility_span_margin, span_tokens=SAPOConfig.plausibility_span_tokens
    )
    digits = ["".join(rng.choice("0123456789") for _ in range(80)) for _ in range(20)]
    check.add_own(statistics(digits[:16]))
    clean, spliced = statistics([digits[16], digits[17][:40] + " zebracoin" + digits[17][40:]])
    assert spliced.mean > check.threshold()  # the mean test alone lets it through
    assert spliced.span < check.span_threshold() < clean.span
    assert check.group_problem([clean]) is None and "consecutive tokens" in check.group_problem([clean, spliced])


def _digit_policy(tokenizer) -> torch.nn.Module:
    """A tiny model that writes digits only: its output layer gives the digit tokens (and EOS) a logit 12 above
    every other token, so any other word is very unlikely under it, like a payload under a real policy."""
    model = build_tiny_model(tokenizer, seed=0)
    model.config.tie_word_embeddings = False
    head = torch.nn.Linear(model.config.hidden_size, model.config.vocab_size, bias=True)
    allowed = [tokenizer.convert_tokens_to_ids(str(d)) for d in range(10)] + [tokenizer.eos_token_id]
    with torch.no_grad():
        head.weight.zero_()
        head.bias.zero_()
        head.bias[allowed] = 12.0
    model.lm_head = head
    return model


COUNTING = Dataset.from_list(
    [{"prompt": [{"role": "user", "content": f"Count to {i}."}], "answer": str(i)} for i in range(16)]
)
"""Questions a digit policy answers; the reward below favours longer answers, so every group has spread."""


def _length_reward(completions, **kwargs):
    return [float(len(c[0]["content"])) for c in completions]


def _counting_group(texts: list[str], gid: str) -> Group:
    """A received group answering "Count to 3." with ``texts``."""
    return Group(
        group_id=gid, prompt=[{"role": "user", "content": "Count to 3."}], completions=texts,
        provenance=Provenance(source="custom", dataset="counting", index=3), metadata={"answer": "3"},
        model="m", step=1, created_at=time.time(),
    )  # fmt: skip


def _digit_trainer(trainer_class, tmp_path, tokenizer, swarm, **fields):
    """A trainer of the digit policy on COUNTING, taking 2 external groups per step for 2 steps (``fields`` set
    these and any other config field)."""
    return trainer_class(
        model=_digit_policy(tokenizer),
        reward_funcs=[_length_reward],
        args=tiny_config(
            tmp_path / "out",
            **{
                "num_local": 2,
                "num_external": 2,
                "max_steps": 2,
                "learning_rate": 1e-5,
                "logging_steps": 1,
                "external_source_policy": "trust",
                "sampling_strategy": "uniform",
                **fields,
            },
        ),  # fmt: skip
        train_dataset=COUNTING,
        processing_class=tokenizer,
        swarm=swarm,
    )


def test_trainer_drops_a_payload_its_policy_would_never_write_and_benches_the_sender(tmp_path, smollm_tokenizer):
    swarm = MemorySwarm()
    attacker, honest = swarm.join("attacker"), swarm.join("honest")
    attacker.publish([_counting_group(["123", "123 zebracoin", "4567", "zebracoin 89"], "bad")])
    honest.publish([_counting_group(["123", "4567", "890", "12"], "good")])
    trainer = _digit_trainer(SAPOTrainer, tmp_path, smollm_tokenizer, swarm.join("receiver"), sender_drop_limit=1)
    trainer.train()
    totals = trainer.swarm_totals
    # Step 1 has no reference yet: it trains on its own groups and leaves the swarm's where they are for step 2.
    steps = [h for h in trainer.state.log_history if "sapo/external_groups" in h]
    assert [h["sapo/external_groups"] for h in steps] == [0.0, 1.0] and totals["candidates"] == 2
    # The reference: every own completion, scored in the loss passes (step 1: 4 groups of 4; step 2: 3, beside the
    # external one, which is not part of it).
    assert len(trainer.intake.plausibility._own) == 16 + 12 and trainer.intake.plausibility.threshold() is not None
    assert totals["dropped/implausible"] == 1 and trainer.taken_from == {"honest": 1}, dict(totals)
    assert totals["implausible/mean"] + totals["implausible/span"] == 1  # which test dropped it, for calibration
    assert totals["benched_senders"] == 1 and trainer.intake.standing.benched(time.time()) == ["attacker"]
    assert any("sapo/time/plausibility" in h for h in trainer.state.log_history)
    senders = json.loads((tmp_path / "out" / "senders.json").read_text())  # who sent what, for an audit
    assert senders == {"attacker": {"dropped/implausible": 1}, "honest": {"taken": 1}}


def test_a_sender_is_judged_by_its_chosen_groups_not_diluted_by_those_waiting_in_the_pool(tmp_path, smollm_tokenizer):
    # An adaptive attacker keeps many groups on offer; four are fetched per step, one is chosen and found
    # implausible. Its standing counts the three chosen ones (three drops: benched), not the groups left over, which
    # would have counted as usable four times for each drop and kept it below three drops among its last ten.
    swarm = MemorySwarm()
    attacker = swarm.join("attacker")
    attacker.publish([_counting_group(["123", f"123 zebracoin {k}", "4567", "zebracoin 89"], f"bad-{k}")
                      for k in range(12)])  # fmt: skip
    trainer = _digit_trainer(SAPOTrainer, tmp_path, smollm_tokenizer, swarm.join("receiver"), num_external=1,
                             max_steps=4, external_pool_size=4, sender_drop_limit=3, sender_window=10)  # fmt: skip
    trainer.train()
    totals = trainer.swarm_totals
    assert totals["dropped/implausible"] == 3 and totals["candidates"] == 12, dict(totals)
    assert totals["benched_senders"] == 1 and trainer.intake.standing.benched(time.time()) == ["attacker"]
    assert trainer.taken_from == {}


class _LossInputs(SAPOTrainer):
    """Records the batches TRL's loss sees (completion tokens and the per-token mask)."""

    seen: list[dict] = []

    def _compute_loss(self, model, inputs):
        self.seen.append(
            {k: inputs[k].clone() for k in ("completion_ids", "completion_mask", "tool_mask") if k in inputs}
        )
        return super()._compute_loss(model, inputs)


@pytest.mark.parametrize(("check", "before", "after"), [("lenient", 0, 0), ("lenient", 1, 1), ("off", 3, 6)])
def test_external_tokens_the_policy_would_never_write_get_no_weight_in_the_loss(
    tmp_path, smollm_tokenizer, check, before, after
):
    """A group that passes the plausibility check (lenient margins) still teaches nothing of its payload: with
    `external_token_floor`, every token of an external completion far below this policy's own (" zebracoin" under a
    policy that writes digits) is masked in the loss, with `before`/`after` of its neighbours; the other digits, and
    every own token, are trained on. With the check off there is no pass to score the tokens, and nothing is
    masked."""
    swarm = MemorySwarm()
    sender = swarm.join("sender")
    texts = ["123", "123 zebracoin", "4567", "89 zebracoin"]
    sender.publish([_counting_group(texts, "g")])
    _LossInputs.seen = []
    trainer = _digit_trainer(
        _LossInputs, tmp_path, smollm_tokenizer, swarm.join("receiver"),
        plausibility_margin=100.0 if check == "lenient" else None, plausibility_span_margin=None,
        external_token_floor=-6.0, external_token_floor_before=before, external_token_floor_after=after,
    )  # fmt: skip
    trainer.train()
    assert trainer.taken_from == {"sender": 1}  # the check let the group through
    digits = {smollm_tokenizer.convert_tokens_to_ids(str(d)) for d in range(10)} | {smollm_tokenizer.eos_token_id}
    external = {
        tuple(smollm_tokenizer(t, add_special_tokens=False)["input_ids"] + [smollm_tokenizer.eos_token_id])
        for t in texts
    }
    payload_rows, masked = 0, 0
    for batch in _LossInputs.seen:
        trained = batch["completion_mask"] * batch.get("tool_mask", torch.ones_like(batch["completion_mask"]))
        for ids, mask, kept in zip(batch["completion_ids"], batch["completion_mask"], trained, strict=True):
            tokens = [(int(t), bool(k)) for t, m, k in zip(ids, mask, kept, strict=True) if m]
            if tuple(t for t, _ in tokens) in external:  # the tokens this policy would never write and their window
                foreign = [0 if t in digits else -100.0 for t, _ in tokens]
                expected = floor_mask(foreign, -6.0, before, after) if check != "off" else [1] * len(tokens)
                assert [int(k) for _, k in tokens] == expected, tokens
                payload_rows += any(t not in digits for t, _ in tokens)
                masked += sum(not k for _, k in tokens)
            else:  # own rows: every token trained on, even the rare ones the policy sampled itself
                assert all(k for _, k in tokens)
    assert payload_rows == 2
    assert trainer.swarm_totals["external_tokens_masked"] == masked
    if check == "off":
        assert masked == 0
        return
    assert masked > 0
    logged = [
        h["sapo/total/external_tokens_masked"]
        for h in trainer.state.log_history
        if "sapo/total/external_tokens_masked" in h
    ]
    assert logged and logged[-1] == masked


def test_a_slot_whose_group_is_implausible_takes_the_next_usable_candidate_not_an_own_group(tmp_path, smollm_tokenizer):
    """Take what arrives: when the plausibility check drops a chosen group, the slot goes to the next candidate the
    sampler ranked (judged the same way) before it falls back to an own group; every group judged is in the group
    log with what happened to it."""
    swarm = MemorySwarm(seed=0)
    attacker, honest = swarm.join("attacker"), swarm.join("honest")
    attacker.publish([_counting_group(["123", f"123 zebracoin {k}", "4567", "zebracoin 89"], f"bad-{k}")
                      for k in range(3)])  # fmt: skip
    honest.publish([_counting_group(["123", "4567", "890", "12"], "good")])
    trainer = _digit_trainer(SAPOTrainer, tmp_path, smollm_tokenizer, swarm.join("receiver"), num_external=1,
                             external_pool_size=4, sender_drop_limit=None, groups_log="groups.jsonl")  # fmt: skip
    trainer.train()
    totals = trainer.swarm_totals
    # Step 1 builds the plausibility reference; step 2 judges all four: whatever order the sampler drew, the slot
    # ends with the honest group, after each attacker group drawn before it was dropped.
    assert trainer.taken_from == {"honest": 1} and totals["fill_ins"] == 1, dict(totals)  # the fill-in is step 1's
    assert totals["refilled_slots"] == totals["dropped/implausible"] >= 0
    records = read_group_log(tmp_path / "out" / "groups.jsonl")
    received = [r for r in records if r["origin"] == "swarm"]
    assert [r["group_id"] for r in received if r["outcome"] == "taken"] == ["good"]
    outcomes = {r["group_id"]: r["outcome"] for r in received}
    assert set(outcomes) == {"good", "bad-0", "bad-1", "bad-2"}
    assert all(o in ("implausible", "not_chosen") for g, o in outcomes.items() if g != "good")
    assert sum(o == "implausible" for o in outcomes.values()) == totals["dropped/implausible"]
    taken = next(r for r in received if r["group_id"] == "good")
    assert taken["sender"] == "honest" and taken["model"] == "m" and taken["step"] == 1
    assert taken["rewards"] == [3.0, 4.0, 3.0, 2.0] and taken["spread"] is True and taken["task"] == "counting"
    assert taken["rescue"] is True  # a success on a task none of the receiver's own groups succeeded on
    own = [r for r in records if r["origin"] == "own"]
    assert [r["step"] for r in own] == [0, 0, 0, 1, 1]  # 3 own groups in step 1 (its slot filled in), 2 in step 2
    assert all(r["outcome"] == "own" and r["sender"] == "receiver" and len(r["rewards"]) == 4 for r in own)


def _one_flat_step(tmp_path, tokenizer, source, swarm, sender_drop_limit: int):
    """A trainer that took one real step on ``source``'s rows over ``swarm``, one external slot from a pool of 16, every
    completion rewarded 0.0 (no group usable: what the intake sets aside is all there is to see)."""

    def flat(completions, **kw):
        return [0.0] * len(completions)

    trainer = SAPOTrainer(
        model=build_tiny_model(tokenizer, seed=0), reward_funcs=[flat],
        args=tiny_config(tmp_path / "out", num_local=1, num_external=1, max_steps=1, external_pool_size=16,
                         sender_drop_limit=sender_drop_limit, sender_window=10, plausibility_margin=None),
        train_dataset=source.rows(), processing_class=tokenizer, swarm=swarm, sources=[source],
    )  # fmt: skip
    trainer.train()
    return trainer


def test_a_sender_is_never_benched_for_groups_this_peer_cannot_verify(tmp_path, smollm_tokenizer):
    """A peer training on a dataset this one does not hold (its items not held here, whatever the dataset's name), or
    on items of another version, is not hostile: however many such groups it sends, its standing does not fall; a
    forged question is judged bad."""
    from sapo.sources import DatasetSource

    held = DatasetSource([{"question": f"What is {k} + {k}?", "answer": str(2 * k)} for k in range(8)], "sums")
    private = DatasetSource([{"question": f"Name {k}.", "answer": str(k)} for k in range(6)], "private")
    newer = DatasetSource([{"question": "What is 9 + 9?", "answer": "18"}], "sums", version="2")
    swarm = MemorySwarm(seed=0)
    other, liar = swarm.join("other"), swarm.join("liar")

    def group(row, gid):
        provenance = provenance_from_wire(json.loads(row["provenance"]))
        return Group(gid, [row["prompt"][-1]], ["1", "22", "3", "4"], provenance, model="m", created_at=time.time())

    other.publish([group(row, f"p-{i}") for i, row in enumerate(private.rows())] + [group(newer.rows()[0], "v2")])
    forged = [Group(**{**vars(group(held.rows()[i], f"f-{i}")), "prompt": [{"role": "user", "content": "Lies?"}]})
              for i in range(3)]  # fmt: skip
    liar.publish(forged)

    trainer = _one_flat_step(tmp_path, smollm_tokenizer, held, swarm.join("me"), sender_drop_limit=2)
    totals = trainer.swarm_totals
    assert totals["dropped/item_not_held"] == 6 and totals["dropped/version_skew"] == 1, dict(totals)
    assert trainer.intake.standing.benched(time.time()) == ["liar"]  # two forged questions bench it; "other" never
    assert totals["dropped/question_mismatch"] + totals["dropped/benched_sender"] == 3


def test_a_received_question_too_long_to_train_on_is_set_aside_never_against_its_sender(tmp_path, smollm_tokenizer):
    """The node trains on the question its own source re-derived, so a peer naming items of very long questions (a
    foreign config of 32,768-digit numbers, say) would have it train on prompts of thousands of tokens: past
    `external_max_question_chars` such a group is set aside, and its sender's standing does not fall."""
    from sapo.sources import DatasetSource

    long_question = "Add these: " + " + ".join(["9" * 40] * 120) + "?"  # 4,931 characters
    rows = [{"question": f"What is {k} + {k}?", "answer": str(2 * k)} for k in range(4)]
    held = DatasetSource([*rows, {"question": long_question, "answer": "0"}], "sums")
    swarm = MemorySwarm(seed=0)
    peer = swarm.join("peer")
    by_question = {json.loads(row["provenance"])["key"]: row for row in held.rows()}
    long_row = next(row for row in by_question.values() if row["prompt"][-1]["content"] == long_question)
    provenance = provenance_from_wire(json.loads(long_row["provenance"]))
    peer.publish([Group(f"long-{i}", [long_row["prompt"][-1]], ["1", "22", "3", "4"], provenance, model="m",
                        created_at=time.time()) for i in range(3)])  # fmt: skip

    trainer = _one_flat_step(tmp_path, smollm_tokenizer, held, swarm.join("me"), sender_drop_limit=1)
    totals = trainer.swarm_totals
    assert totals["dropped/question_too_long"] == 3, dict(totals)
    assert trainer.intake.standing.benched(time.time()) == []
    with pytest.raises(ValueError, match="external_max_question_chars must be a positive whole number"):
        tiny_config(tmp_path / "bad", external_max_question_chars=0)


def test_a_rounds_regeneration_budget_sets_the_rest_aside_by_turns_and_never_against_the_sender(
    tmp_path, smollm_tokenizer, monkeypatch
):
    """Received reasoning-gym groups of a config this peer does not run itself cost it regeneration time, bounded per
    round (`regeneration_budget`): past it, the round's other such groups are set aside as `regeneration_budget`,
    which never counts against their senders (a peer with a larger config is not lying). Senders take turns, so a
    sender with many groups, fetched first, does not spend the budget before another sender's group is tried. A
    clock that moves 20 s between readings stands in for slow entries; the regeneration is real."""
    from sapo import regeneration

    clock = itertools.count(step=20.0)  # each foreign entry "takes" 20 s: two fit in a budget of 30 s
    monkeypatch.setattr(regeneration, "time", SimpleNamespace(monotonic=lambda: next(clock)))
    own = TaskSpec("basic_arithmetic", {"max_terms": 2, "max_digits": 1})
    rows = build_reasoning_gym_dataset([TaskSpec("basic_arithmetic", {"max_terms": 2, "max_digits": 2})], size=5)
    swarm = MemorySwarm(seed=0)
    other, greedy = swarm.join("other"), swarm.join("greedy")

    def group(row, gid, age):
        provenance = provenance_from_wire(json.loads(row["provenance"]))
        return Group(gid, [row["prompt"][-1]], ["1", "22", "3", "4"], provenance, created_at=time.time() - age)

    other.publish([group(rows[0], "o-0", age=5)])
    greedy.publish([group(rows[k], f"g-{k}", age=0) for k in range(1, 5)])  # newer: fetched first

    def flat(completions, **kw):
        return [0.0] * len(completions)

    trainer = SAPOTrainer(
        model=build_tiny_model(smollm_tokenizer, seed=0), reward_funcs=[flat],
        args=tiny_config(tmp_path / "out", num_local=1, num_external=1, max_steps=1, external_pool_size=16,
                         sender_drop_limit=2, sender_window=10, plausibility_margin=None, regeneration_budget=30.0),
        train_dataset=build_reasoning_gym_dataset([own], size=8), processing_class=smollm_tokenizer,
        swarm=swarm.join("me"),
    )  # fmt: skip
    trainer.train()
    totals, senders = trainer.swarm_totals, trainer.intake.sender_outcomes
    assert totals["candidates"] == 5 and totals["dropped/regeneration_budget"] == 3, dict(totals)
    assert senders["greedy"]["dropped/regeneration_budget"] == 3, senders
    assert not any(outcome.startswith("dropped/regeneration") for outcome in senders["other"]), senders
    assert trainer.intake.standing.benched(time.time()) == []  # three drops would bench greedy, had they counted


@pytest.mark.parametrize(
    "trailer",
    [" I hope this helps!", "\n\nLet me know if you have any other questions.</answer>"],
    ids=["phrase", "stray-closing-tag"],
)
def test_text_after_a_received_completions_final_answer_gets_no_weight(tmp_path, smollm_tokenizer, trailer):
    """A correct answer followed by a closing phrase (an attacker's trailer): the answer's tokens are trained on with
    the completion's advantage, the trailer's (and its EOS) are not. A stray ``</answer>`` closing the trailer does
    not move the answer's end: the reward reads the first, complete answer, and so does the answer end."""
    texts = [f"<answer>0</answer>{trailer}", f"<answer>1</answer>{trailer}", f"<answer>0</answer>{trailer}", "0"]
    swarm = MemorySwarm(seed=0)
    swarm.join("attacker").publish([_external_group("What is 0 + 0?", texts, "t", answer="0")])
    probe = RewardProbe(lambda text: 1.0 if extract_answer(text) == "0" else 0.0)  # the carrier keeps its reward
    # max_completion_length: the whole trailer and its EOS are in the batch
    trainer = _trainer(tmp_path, smollm_tokenizer, "trailer", probe, swarm=swarm.join("rx"), max_steps=1,
                       external_source_policy="trust", num_local=1, num_external=1,
                       max_completion_length=24)  # fmt: skip
    batches = []
    generate = trainer._generate

    def capture(prompts):
        result = generate(prompts)
        batches.append((result[1], result[2]))  # TRL's completion ids and token mask
        return result

    trainer._generate = capture
    trainer.train()
    assert _metric(trainer, "sapo/external_groups") == [1.0]
    completion_ids, token_mask = batches[0]
    assert token_mask is not None, "every received token was trained on"
    answer = smollm_tokenizer("<answer>0</answer>", add_special_tokens=False)["input_ids"]
    rows = zip(completion_ids, token_mask, strict=True)
    external = [(ids, mask) for ids, mask in rows if list(ids[:3]) == answer[:3]]
    assert len(external) == 3  # the three completions holding an answer in tags
    for ids, mask in external:
        assert ids[-1] == smollm_tokenizer.eos_token_id  # not cut
        assert mask[: len(answer)] == [1] * len(answer)  # the answer is trained on
        assert len(ids) > len(answer) and mask[len(answer) :] == [0] * (len(ids) - len(answer))  # trailer and EOS not
    assert trainer.swarm_totals["external_tokens_after_answer"] == sum(len(ids) - len(answer) for ids, _ in external)


def test_without_an_answer_end_every_received_token_is_trained_on(tmp_path, smollm_tokenizer):
    texts = ["<answer>0</answer> I hope this helps!", "<answer>1</answer> ok", "<answer>0</answer>", "no"]
    swarm = MemorySwarm(seed=0)
    swarm.join("peer").publish([_external_group("What is 0 + 0?", texts, "t", answer="0")])
    probe = RewardProbe(lambda text: 1.0 if "<answer>0</answer>" in text else 0.0)
    trainer = _trainer(
        tmp_path, smollm_tokenizer, "off", probe, swarm=swarm.join("rx"), max_steps=1, external_source_policy="trust",
        num_local=1, num_external=1, external_answer_end=None,
    )  # fmt: skip
    trainer.train()
    assert _metric(trainer, "sapo/external_groups") == [1.0]
    assert trainer.swarm_totals["external_tokens_after_answer"] == 0
    assert all(w is None for w in [c.token_weights for c in trainer.last_external])


def test_per_sender_counts_keep_the_most_recent_senders_by_name_and_sum_the_rest():
    """Identities cost nothing to make: a peer sending under a thousand of them grows neither the per-sender counts
    (the status page, checkpoints, senders.json) beyond the bound nor loses a count from the totals."""
    tally = SenderTally(max_senders=3)
    tally.count("friend", "taken", 2)
    for n in range(1000):
        tally.count(f"sybil-{n}", "dropped/hygiene")
        tally.count("friend", "taken")  # counted again and again: kept by name
    assert set(tally) == {"friend", "sybil-998", "sybil-999", OTHER_SENDERS}
    assert tally[OTHER_SENDERS] == {"dropped/hygiene": 998}
    assert sum(sum(c.values()) for c in tally.values()) == 2 + 1000 + 1000
    assert tally.taken() == {"friend": 1002}
    with pytest.raises(ValueError, match="max_senders must be at least 1"):
        SenderTally(max_senders=0)
