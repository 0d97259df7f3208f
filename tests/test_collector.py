"""While a SAPOTrainer trains, what was alive when it started is left out of the garbage collector's scans: a full
collection would otherwise walk the model and its libraries while the swarm transport's event loop waits."""

from __future__ import annotations

import gc

from transformers import TrainerCallback

from sapo.collector import freeze_long_lived, frozen_on_top, long_lived_frozen, owner_froze, thaw
from sapo.tasks import build_reasoning_gym_dataset
from testbed.hostile_peer import TASKS
from testbed.tiny_run import tiny_trainer


def test_training_scans_only_what_it_made_and_the_collector_is_as_before_afterwards(tmp_path, smollm_tokenizer):
    class Watch(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            seen.update(frozen=gc.get_freeze_count(), scanned=len(gc.get_objects()))

    def no_reward(prompts, completions, **columns):
        return [0.0] * len(completions)

    thaw()  # whatever an earlier test in this process left frozen
    seen: dict[str, int] = {}
    trainer = tiny_trainer(
        tmp_path, smollm_tokenizer, [no_reward], build_reasoning_gym_dataset(TASKS, size=4, seed=5),
        callbacks=[Watch()], num_local=1, max_steps=1,
    )  # fmt: skip
    alive = len(gc.get_objects())
    trainer.train()
    assert seen["frozen"] >= 0.9 * alive  # the libraries, the model, the trainer: out of every scan
    assert seen["scanned"] < 0.2 * seen["frozen"]  # a full collection during the step walks what training made
    assert gc.get_freeze_count() == 0  # afterwards the collector scans everything again


def test_objects_a_caller_froze_stay_frozen_after_training():
    # The owner's freeze, as the node's before it joins the swarm (marked: no count needed), and a bare gc.freeze().
    for freeze in (freeze_long_lived, gc.freeze):
        thaw()
        freeze()
        try:
            frozen, on_top = gc.get_freeze_count(), frozen_on_top()
            # a frozen object that dies meanwhile (another thread of this process may free some) leaves the count, so
            # the count may fall by a few; thawed, it would be 0
            with long_lived_frozen():
                assert gc.get_freeze_count() >= 0.99 * frozen
            assert frozen > 0 and gc.get_freeze_count() >= 0.99 * frozen, freeze  # not undone by the block's exit
            assert frozen_on_top() == on_top + 1  # what the block froze on top stays frozen: the owner may refreeze
            assert owner_froze() == (freeze is freeze_long_lived)
        finally:
            thaw()
    assert not owner_froze() and gc.get_freeze_count() == 0
