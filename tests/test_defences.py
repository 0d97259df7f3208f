"""Defences against poisoned completions: completion hygiene and per-sender standing, on their own and inside a
trainer that takes real optimizer steps."""

from __future__ import annotations

import json
import time

import pytest

from sapo import SAPOConfig, SAPOTrainer
from sapo.hygiene import CompletionHygiene
from sapo.models import build_tiny_model
from sapo.standing import SenderStanding
from sapo.tasks import TaskSpec, build_reasoning_gym_dataset
from swarm import Group, MemorySwarm, Provenance


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
        assert standing.record("liar", usable, now) is False
    assert standing.record("liar", False, now) is True  # the third drop among its last five
    assert standing.is_benched("liar", now + 59) and not standing.is_benched("liar", now + 61)
    assert standing.benched(now) == ["liar"]
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

    trainer = SAPOTrainer(
        model=build_tiny_model(smollm_tokenizer, seed=0),
        reward_funcs=[exact],
        args=SAPOConfig(
            output_dir=str(tmp_path / "out"),
            num_local=1,
            num_external=1,
            num_generations=4,
            per_device_train_batch_size=4,
            max_completion_length=8,
            max_steps=1,
            report_to="none",
            save_strategy="no",
            use_cpu=True,
            seed=0,
            disable_tqdm=True,
            external_pool_size=8,
            completion_forbidden_patterns=[r"https?://"],
            sender_drop_limit=2,
            sender_window=5,
        ),  # fmt: skip
        train_dataset=dataset,
        processing_class=smollm_tokenizer,
        swarm=swarm.join("honest"),
    )
    trainer.train()
    totals = trainer.swarm_totals
    # Two of the attacker's groups fail hygiene and bench it; its third is set aside unread (order is random).
    assert totals["dropped/hygiene"] == 2 and totals["dropped/benched_sender"] == 1, dict(totals)
    assert totals["benched_senders"] == 1 and trainer.standing.benched(time.time()) == ["attacker"]
    assert trainer.taken_from == {"friend": 1}
