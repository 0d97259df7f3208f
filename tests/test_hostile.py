"""An honest SAPOTrainer on a real DHT swarm with a lying peer and a raw hostile DHT node: it keeps training,
rejects and counts every bad input by reason, and never trains on a forged or poisoned group."""
# ruff: noqa: F811  (pytest fixtures imported from tests.swarm_fixtures are redefined as arguments)

from __future__ import annotations

import json
import time

import pytest

pytest.importorskip("hivemind")

from sapo import SAPOConfig, SAPOTrainer  # noqa: E402
from sapo.models import build_tiny_model  # noqa: E402
from sapo.tasks import TaskSpec, build_reasoning_gym_dataset  # noqa: E402
from swarm.records import Group, Provenance  # noqa: E402
from tests.hostile_peer import HostileNode, burst, poisoned_groups, publish_unchecked, unchecked_record, wire_attacks  # noqa: E402
from tests.swarm_fixtures import dht_peers, no_p2pd_left_behind, wait_until  # noqa: E402, F401

pytestmark = pytest.mark.usefixtures("no_p2pd_left_behind")

G = 4
TASKS = [TaskSpec("basic_arithmetic", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1})]


class ExactAnswer:
    """Reward 1 for `<answer>TRUTH</answer>`, recording every row TRL trains on (calls with completion_ids)."""

    __name__ = "exact_answer"

    def __init__(self) -> None:
        self.trained: list[tuple[str, float]] = []  # (completion, reward) of every trained row

    def __call__(self, prompts, completions, answer, completion_ids=None, **columns):
        texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
        rewards = [1.0 if f"<answer>{a}</answer>" in t else 0.0 for t, a in zip(texts, answer, strict=True)]
        if completion_ids is not None:
            self.trained.extend(zip(texts, rewards, strict=True))
        return rewards


def _honest_group(row: dict, gid: str) -> Group:
    truth = row["answer"]
    return Group(
        group_id=gid,
        prompt=list(row["prompt"]),
        completions=[f"friend <answer>{truth}</answer>", "friend no idea", f"<answer>{truth}</answer>", "friend 0"],
        provenance=Provenance(**json.loads(row["provenance"])),
        metadata={"answer": truth},
        model="friend",
        step=1,
        created_at=time.time(),
    )


def test_honest_node_trains_through_liars_junk_and_bursts(tmp_path, smollm_tokenizer, dht_peers):
    rows = list(build_reasoning_gym_dataset(TASKS, size=32, seed=5))
    honest = dht_peers(model_name="honest")
    friend = dht_peers(model_name="friend", initial_peers=honest.visible_addresses())
    liar = dht_peers(model_name="liar", initial_peers=honest.visible_addresses())
    raw = HostileNode(honest.visible_addresses())
    try:
        friend.publish([_honest_group(rows[10 + i], f"friend-{i}") for i in range(3)])
        attacks = poisoned_groups(rows)
        for group, _ in attacks.values():  # one record per kind: a bad one must not hide a good one
            publish_unchecked(liar, unchecked_record([group]))
        expected = {kind: counter for kind, (_, counter) in attacks.items()}
        expected |= wire_attacks(raw, honest, _honest_group(rows[20], "sample"))
        started = time.monotonic()
        accepted = burst(raw, honest, _honest_group(rows[21], "burst"), count=1000)
        burst_seconds = time.monotonic() - started
        # the friend's 3 groups and the liar's 3 schema-valid ones reach the honest peer's cache
        wait_until(lambda: honest.counters().get("received_groups", 0) >= 6, 60, message=str(honest.counters()))

        reward = ExactAnswer()
        trainer = SAPOTrainer(
            model=build_tiny_model(smollm_tokenizer, seed=0),
            reward_funcs=[reward],
            args=SAPOConfig(
                output_dir=str(tmp_path / "honest"),
                num_local=1,
                num_external=3,
                num_generations=G,
                per_device_train_batch_size=G,
                max_completion_length=8,
                max_steps=3,
                learning_rate=1e-2,
                logging_steps=1,
                report_to="none",
                save_strategy="no",
                use_cpu=True,
                seed=0,
                disable_tqdm=True,
                sampling_strategy="uniform",
                external_pool_size=16,
            ),  # fmt: skip
            train_dataset=build_reasoning_gym_dataset(TASKS, size=32, seed=5),
            processing_class=smollm_tokenizer,
            swarm=honest,
        )
        trainer.train()
    finally:
        raw.close()

    assert trainer.state.global_step == 3  # no crash, no stall
    assert burst_seconds < 120 and 0 < accepted <= 1000  # the burst is served, not a denial of service
    logged = [row for row in trainer.state.log_history if "train_runtime" not in row][-1]
    for kind, counter in expected.items():
        if counter == "trained_with_own_truth":
            continue
        assert logged.get(counter, 0) >= 1, f"{kind}: {counter} not counted in {sorted(logged)}"

    # Every external row trained on: the friend's, or the liar's usable question scored with our own truth
    trained_poison = [(text, r) for text, r in reward.trained if "POISON" in text]
    assert all(text.startswith("POISON-wrong_answer") for text, _ in trained_poison), trained_poison
    assert all(r == 0.0 for _, r in trained_poison)  # its claimed (wrong) answer never counted as right
    # 4 usable candidates (the friend's 3 and the liar's usable question) for 3 slots: the friend's fill most
    assert trainer.taken_from[friend.peer_id] >= 2 and trainer.taken_from[liar.peer_id] <= 1
    assert set(trainer.taken_from) <= {friend.peer_id, liar.peer_id}
