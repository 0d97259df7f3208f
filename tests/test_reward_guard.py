"""A reward that raises on some of a peer's own rows: the rows are scored as failed (None, TRL's "not applicable"),
each error is logged with the row's item and counted, training goes on; a reward failing on every row stops training
with the reason once its limit is reached."""

from __future__ import annotations

import json
import logging

import pytest

from sapo.reward_guard import RewardErrorLimit, RewardGuard, letting_errors_through
from tests.trainer_fixtures import _math_dataset, _metric, _trainer


def picky_reward(prompts, completions, answer, **kwargs):
    """Raises on items whose answer ends in 0 (a fifth of the doubling questions), like a parser that chokes."""
    if any(a.endswith("0") for a in answer):
        raise ValueError(f"cannot parse answer {answer}")
    return [0.5 for _ in completions]


def test_a_reward_raising_on_some_own_rows_scores_them_as_failed_and_training_goes_on(
    tmp_path, smollm_tokenizer, caplog
):
    guard = RewardGuard(max_errors_in_a_row=1000)
    [reward] = guard.wrap_all([picky_reward])
    assert reward.__name__ == "picky_reward"  # TRL names the reward's metrics by it

    def keyed(row, i):
        return {"provenance": json.dumps({**json.loads(row["provenance"]), "key": f"k{i}"})}

    dataset = _math_dataset(16).map(keyed, with_indices=True)
    trainer = _trainer(tmp_path, smollm_tokenizer, "guarded", reward, dataset=dataset, max_steps=4, num_external=0)
    with caplog.at_level(logging.ERROR, logger="sapo.reward_guard"):
        trainer.train()
    assert trainer.state.global_step == 4
    assert guard.errors > 0 and guard.errors % 4 == 0  # every completion of a failing question, never another
    failed = [r for r in caplog.records if "raised on" in r.getMessage()]
    assert len(failed) == guard.errors and "ValueError: cannot parse answer" in failed[0].getMessage()
    assert any(f"doubling item k{i}" in failed[0].getMessage() for i in (0, 5, 10, 15))  # the row's item key
    assert _metric(trainer, "sapo/total/reward_errors")[-1] == guard.errors


def test_a_reward_failing_on_every_row_stops_training_at_its_limit(tmp_path, smollm_tokenizer):
    def broken(prompts, completions, **kwargs):
        raise KeyError("units")

    guard = RewardGuard(max_errors_in_a_row=6)
    trainer = _trainer(tmp_path, smollm_tokenizer, "broken", guard.wrap(broken), max_steps=3, num_external=0)
    with pytest.raises(RewardErrorLimit, match=r"reward broken failed on 6 own rows in a row \(limit 6\)"):
        trainer.train()


def test_errors_pass_through_where_the_caller_handles_them():
    guard = RewardGuard()
    reward = guard.wrap(picky_reward)
    assert reward(["q"], ["c"], answer=["12"]) == [0.5]
    with letting_errors_through(), pytest.raises(ValueError, match="cannot parse"):
        reward(["q"], ["c"], answer=["10"])
    assert reward(["q", "q"], ["c", "c"], answer=["10", "12"]) == [None, 0.5] and guard.errors == 1


def test_a_guarded_reward_raising_on_a_received_group_drops_the_group_and_counts_no_own_error(
    tmp_path, smollm_tokenizer
):
    from swarm import MemorySwarm
    from tests.trainer_fixtures import _external_group

    guard = RewardGuard(max_errors_in_a_row=1)  # one own error would stop training
    swarm = MemorySwarm(seed=0)
    swarm.join("peer").publish([_external_group("What is 5 + 5?", ["a", "b", "c", "d"], "g", answer="10")])
    own = _math_dataset(5).select(range(1, 5))  # answers 2, 4, 6, 8: the reward never raises on them
    trainer = _trainer(tmp_path, smollm_tokenizer, "received", guard.wrap(picky_reward), swarm=swarm.join("rx"),
                       dataset=own, max_steps=1, external_source_policy="trust")  # fmt: skip
    trainer.train()
    assert trainer.swarm_totals["dropped/reward_error"] == 1 and guard.errors == 0


def test_a_reward_failing_on_one_kind_of_item_trips_the_rate_limit_though_never_many_in_a_row(caplog):
    def parses_only_numbers(prompts, completions, answer, **kwargs):
        if any(not a.isdigit() for a in answer):
            raise ValueError(f"cannot parse {answer}")
        return [1.0 for _ in completions]

    # Every batch of 4 rows: 3 items of the kind the reward chokes on, 1 it scores; never 64 failures in a row.
    mixed = ["x", "y", "7", "z"]
    guard = RewardGuard(max_errors_in_a_row=64, max_error_rate=0.5, window=16)
    reward = guard.wrap(parses_only_numbers)
    with caplog.at_level(logging.CRITICAL):
        reward(["q"] * 4, ["c"] * 4, answer=mixed)
        reward(["q"] * 4, ["c"] * 4, answer=mixed)
        reward(["q"] * 4, ["c"] * 4, answer=mixed)  # 12 rows: the window of 16 is not full yet
        with pytest.raises(RewardErrorLimit, match=r"failed on 12 of its last 16 own rows \(limit 0.5 of them\)") as e:
            reward(["q"] * 4, ["c"] * 4, answer=mixed)
    assert e.value.limit == "max_error_rate"
    # A quarter of the rows failing stays under the limit: the node goes on.
    calm = RewardGuard(max_errors_in_a_row=64, max_error_rate=0.5, window=16).wrap(parses_only_numbers)
    with caplog.at_level(logging.CRITICAL):
        for _ in range(20):
            assert calm(["q"] * 4, ["c"] * 4, answer=["1", "x", "2", "3"]) == [1.0, None, 1.0, 1.0]
    with pytest.raises(ValueError, match=r"max_error_rate must be in \[0, 1\) or None"):
        RewardGuard(max_error_rate=1.5)
