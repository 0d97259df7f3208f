"""Helpers of the trainer tests: tiny SAPO configs, a question set, a reward that records what is trained on, groups
as a peer publishes them, and what the trainer test modules share: a tiny model built once per tokenizer and seed
(each test trains its own copy), and a garbage collector that leaves the libraries' objects out of its scans."""

from __future__ import annotations

import copy
import functools
import json
import time
from collections import Counter

import pytest
from datasets import Dataset

from sapo import SAPOConfig, SAPOTrainer
from sapo.collector import long_lived_frozen
from sapo.models import build_tiny_model
from sapo.sampling import Candidate
from swarm import Group, Provenance
from testbed.tiny_run import tiny_config

G = 4  # completions per group in these tests


@functools.cache
def _pristine_tiny_model(tokenizer, seed: int):
    return build_tiny_model(tokenizer, seed=seed)


def tiny_model(tokenizer, seed: int = 0):
    """A fresh copy of ``build_tiny_model(tokenizer, seed=seed)``: the same weights, built once per tokenizer and seed
    (a fresh build initialises a 49,152-word embedding each time), so no test sees another's training."""
    return copy.deepcopy(_pristine_tiny_model(tokenizer, seed))


@pytest.fixture(scope="module")
def frozen_heap():
    """The objects alive when the module starts (torch, transformers, TRL, the session's tokenizers) frozen out of the
    garbage collector's scans for the module's tests: every ``Trainer.train()`` runs a full collection (accelerate's
    ``free_memory``), which otherwise walks them all, tenths of a second a call. Thawed after the module unless
    something else froze them first."""
    with long_lived_frozen(collect_first=True):
        yield


def _args(tmp_path, name: str, **overrides) -> SAPOConfig:
    base = dict(
        num_local=2,
        num_external=2,
        num_generations=G,
        per_device_train_batch_size=G,
        max_completion_length=12,
        max_steps=2,
        learning_rate=1e-2,
        logging_steps=1,
        seed=7,
        # These tests are about other parts of the round: a random tiny model has no plausibility to speak of, and
        # the check refuses external groups until one own round was trained on (tests/test_defences.py tests it).
        plausibility_margin=None,
    )
    return tiny_config(tmp_path / name, **{**base, **overrides})


def _math_dataset(n: int = 16) -> Dataset:
    return Dataset.from_list(
        [
            {
                "prompt": [{"role": "user", "content": f"What is {i} + {i}?"}],
                "answer": str(2 * i),
                "provenance": json.dumps(
                    {"source": "custom", "dataset": "doubling", "config": {}, "seed": None, "index": i}
                ),
            }
            for i in range(n)
        ]
    )


class RewardProbe:
    """A reward function that counts the completions it scores (`calls`), and, once it `watch`es a trainer, records
    every row TRL trains on (`trained`): what the trainer's generation hook hands TRL, own rows and external ones."""

    __name__ = "probe"

    def __init__(self, score):
        self.score = score
        self.calls: Counter[str] = Counter()  # times each completion text was scored
        self.trained: list[tuple[str, str]] = []  # (question, completion) of every trained row

    def __call__(self, prompts, completions, completion_ids=None, **columns):
        texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
        self.calls.update(texts)
        return [self.score(t) for t in texts]

    def watch(self, trainer) -> None:
        generate = trainer._generate

        def recording(prompts):
            result = generate(prompts)
            if trainer.model.training:
                texts = [c[0]["content"] if isinstance(c, list) else c for c in result[3]]
                self.trained.extend((p[-1]["content"], t) for p, t in zip(prompts, texts, strict=True))
            return result

        trainer._generate = recording


def _external_group(question: str, completions: list[str], gid: str, provenance=None, answer=None) -> Group:
    return Group(
        group_id=gid,
        prompt=[{"role": "user", "content": question}],
        completions=completions,
        provenance=provenance or Provenance(source="custom", dataset="doubling", index=0),
        metadata={} if answer is None else {"answer": answer},
        model="other-model",
        step=1,
        created_at=time.time(),
    )


def _trainer(tmp_path, tokenizer, name, reward, swarm=None, dataset=None, seed=0, **overrides):
    trainer = SAPOTrainer(
        model=tiny_model(tokenizer, seed=seed),
        reward_funcs=[reward],
        args=_args(tmp_path, name, **overrides),
        train_dataset=dataset if dataset is not None else _math_dataset(),
        processing_class=tokenizer,
        swarm=swarm,
    )
    if isinstance(reward, RewardProbe):
        reward.watch(trainer)
    return trainer


def _metric(trainer, name):
    return [h[name] for h in trainer.state.log_history if name in h and "train_runtime" not in h]


def candidate(sender: str, rewards: list[float], age: float = 0.0, gid: str = "g") -> Candidate:
    """A received group of ``sender`` as the sampler sees it: ``rewards`` under this node, ``age`` seconds old."""
    group = Group(
        group_id=gid,
        prompt=[{"role": "user", "content": "q"}],
        completions=[str(r) for r in rewards],
        provenance=Provenance(source="custom", dataset="t"),
        created_at=time.time() - age,
    )
    return Candidate(sender=sender, group=group, rewards=rewards)
