"""An honest SAPOTrainer on a real DHT swarm with a lying peer and a raw hostile DHT node: it keeps training,
rejects and counts every bad input by reason, and never trains on a forged or poisoned group."""
# ruff: noqa: F811  (pytest fixtures imported from tests.swarm_fixtures are redefined as arguments)

from __future__ import annotations

import pytest

from testbed.hostile_peer import hostile_round, poisoned_rows_trained
from tests.swarm_fixtures import dht_peers, no_p2pd_left_behind, record_p2pd  # noqa: F401

pytestmark = pytest.mark.usefixtures("no_p2pd_left_behind")


def test_honest_node_trains_through_liars_junk_and_bursts(tmp_path, smollm_tokenizer, dht_peers):
    outcome = hostile_round(tmp_path, smollm_tokenizer, dht_peers, burst_size=1000, steps=3, on_p2pd=record_p2pd)
    trainer = outcome["trainer"]

    assert trainer.state.global_step == 3  # no crash, no stall
    assert 0 < outcome["burst_accepted"] <= 1000  # served (how long it took is benchmarks.reliability's figure)
    logged = [row for row in trainer.state.log_history if "train_runtime" not in row][-1]
    for kind, counter in outcome["expected"].items():
        if counter == "trained_with_own_truth":
            continue
        assert logged.get(counter, 0) >= 1, f"{kind}: {counter} not counted in {sorted(logged)}"

    # Every external row trained on: the friend's, or the liar's usable question scored with our own truth
    assert poisoned_rows_trained(outcome["trained"]) == 0, outcome["trained"]
    assert any(text.startswith("friend") for text, _ in outcome["trained"])
    # 3 usable candidates (the friend's 2 and the liar's usable question) for 3 slots: all are trained on, the
    # liar's lying group too, with the answer this node re-derived (the true completions rewarded, the lie not)
    friend, liar = outcome["friend"], outcome["liar"]
    assert trainer.taken_from[friend] == 2 and trainer.taken_from[liar] == 1
    assert set(trainer.taken_from) == {friend, liar}
    liar_rows = [(text, reward) for text, reward in outcome["trained"] if text.startswith("POISON-wrong_answer")]
    assert sorted(reward for _, reward in liar_rows) == [0.0, 0.0, 1.0, 1.0], liar_rows
