"""SAPOTrainer as TRL's GRPOTrainer: without swarm groups it takes TRL's steps (bit-equal with the speed-ups off,
within a stated tolerance with them on), without a swarm it fills every slot itself, and with swarm rows TRL's own
paths still run (a reward model scores them, vLLM's importance-sampling correction leaves them uncorrected)."""

from __future__ import annotations

import math
from contextlib import nullcontext

import pytest
import torch
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from sapo import SAPOConfig, SAPOTrainer
from sapo.models import build_tiny_model
from swarm import MemorySwarm
from tests.trainer_fixtures import (  # noqa: F401  (frozen_heap: a fixture)
    G,
    RewardProbe,
    _args,
    _external_group,
    _math_dataset,
    _metric,
    _trainer,
    frozen_heap,
    tiny_model,
)

pytestmark = pytest.mark.usefixtures("frozen_heap")


def _drop_in_pair(tmp_path, smollm_tokenizer, speedups, **arguments):
    """GRPOTrainer and SAPOTrainer (no swarm groups: J = 0) trained two steps from the same arguments (``arguments``
    override the defaults below), SAPO's with ``speedups``. Returns (TRL's trainer, SAPO's trainer)."""
    from sapo.speed.sampling import inverse_transform_sampling

    dataset = _math_dataset()

    def reward(prompts, completions, **kw):
        return [float(len(c[0]["content"]) % 5) for c in completions]

    common = (
        dict(
            bf16=False,  # explicit on both sides: GRPOConfig's own default differs on CPU
            num_generations=G,
            per_device_train_batch_size=G,
            gradient_accumulation_steps=2,
            generation_batch_size=2 * G,
            max_completion_length=10,
            max_steps=2,
            learning_rate=1e-2,
            logging_steps=1,
            report_to="none",
            save_strategy="no",
            use_cpu=True,
            seed=11,
            epsilon_high=0.28,
            disable_tqdm=True,
        )
        | arguments
    )
    trl_trainer = GRPOTrainer(
        model=tiny_model(smollm_tokenizer),
        reward_funcs=[reward],
        args=GRPOConfig(output_dir=str(tmp_path / "trl"), **common),
        train_dataset=dataset,
        processing_class=smollm_tokenizer,
    )
    # The sampler of SAPO's generation on a CPU (a speed-up), on TRL's side too where SAPO uses it: the same draws.
    with inverse_transform_sampling() if speedups != "off" else nullcontext():
        trl_trainer.train()
    sapo_trainer = SAPOTrainer(
        model=tiny_model(smollm_tokenizer),
        reward_funcs=[reward],
        # TRL's loss pass over whole rows (the pass with each prompt once equals it up to rounding:
        # tests/test_shared_prompts.py and test_scoring_each_prompt_once_takes_the_same_steps)
        args=SAPOConfig(
            output_dir=str(tmp_path / "sapo"),
            num_local=2,
            num_external=0,
            speedups=speedups,
            scoring_prefill_once=False,
            **common,
        ),  # fmt: skip
        train_dataset=dataset,
        processing_class=smollm_tokenizer,
        swarm=MemorySwarm().join("solo"),
    )
    sapo_trainer.train()
    assert sapo_trainer.swarm.readout().counters["published_groups"] == 4  # 2 rounds x 2 groups, published all the same
    return trl_trainer, sapo_trainer


def test_no_external_groups_matches_trl_grpo_bit_for_bit(tmp_path, smollm_tokenizer):
    # With the speed-ups off, SAPOTrainer runs TRL's own generation and loss pass on the same tensor shapes: the same
    # kernels run on either side, so the steps are bit-equal on every CPU.
    trl_trainer, sapo_trainer = _drop_in_pair(tmp_path, smollm_tokenizer, "off")
    assert _metric(sapo_trainer, "loss") == _metric(trl_trainer, "loss")
    for a, b in zip(trl_trainer.model.parameters(), sapo_trainer.model.parameters(), strict=True):
        assert torch.equal(a, b)


# The default speed-ups change only the rounding of the gradients. With plain SGD a weight moves by the learning rate
# times its gradient, so the weights differ by rounding too: at most 1.7e-7 here after two steps at learning rate 1
# on an AMD EPYC, under its own kernels and under ATen's default, MKL's SSE4.2, AVX2-reproducible and compatible
# kernels and oneDNN's SSE4.1 (benchmarks/README.md, "The drop-in tests on other kernels"). Adam is no fair judge
# of rounding: it divides each gradient by its own running scale, so the rounding of a gradient near zero becomes a
# step of up to the learning rate (1.4e-4 at learning rate 1e-2 under MKL's compatible kernels).
SPEED_UPS_PARAMETER_TOLERANCE = 1e-5


def test_no_external_groups_with_default_speedups_matches_trl_grpo(tmp_path, smollm_tokenizer):
    # The default speed-ups (`speedups="auto"`) score only the completion positions in TRL's fused LM head, among
    # others. With a trained LM head (tied embeddings, full fine-tuning) its weight gradient is then a sum over fewer
    # positions: a matrix product of another shape, whose BLAS kernel may sum in another order. The same completions
    # and losses, the weights equal within the stated tolerance.
    trl_trainer, sapo_trainer = _drop_in_pair(tmp_path, smollm_tokenizer, "auto", optim="sgd", learning_rate=1.0)
    for name in ("loss", "num_tokens", "reward", "reward_std"):
        assert _metric(sapo_trainer, name) == pytest.approx(_metric(trl_trainer, name), rel=1e-5, abs=1e-7), name
    for a, b in zip(trl_trainer.model.parameters(), sapo_trainer.model.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=SPEED_UPS_PARAMETER_TOLERANCE)
    start = build_tiny_model(sapo_trainer.processing_class, seed=0).parameters()
    moved = max((a - p).abs().max().item() for a, p in zip(trl_trainer.model.parameters(), start, strict=True))
    assert moved > 100 * SPEED_UPS_PARAMETER_TOLERANCE  # the tolerance is far below what the two steps changed


def test_a_reward_model_scores_external_groups_so_the_paper_sampler_keeps_them(tmp_path, smollm_tokenizer):
    """A reward model (an nn.Module) scores external candidates through TRL's own reward path: before, they were
    all NaN, read as zero advantage, and a node with a reward model silently trained alone."""
    from transformers import LlamaConfig, LlamaForSequenceClassification

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(smollm_tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, num_labels=1, pad_token_id=smollm_tokenizer.pad_token_id,
    )  # fmt: skip
    reward_model = LlamaForSequenceClassification(config).eval()
    swarm = MemorySwarm()
    sender = swarm.join("sender")
    completions = ["banana", "apple pie with cream", "42", "a long answer about cherries and plums"]
    groups = [[*completions[:3], f"{completions[3]} {i}"] for i in range(4)]  # distinct: no repeat set aside
    sender.publish([_external_group("What is 0 + 0?", texts, f"g{i}", answer="0") for i, texts in enumerate(groups)])
    trainer = SAPOTrainer(
        model=tiny_model(smollm_tokenizer),
        reward_funcs=[reward_model],
        reward_processing_classes=[smollm_tokenizer],
        args=_args(tmp_path, "rm", external_source_policy="trust", max_steps=1),
        train_dataset=_math_dataset(),
        processing_class=smollm_tokenizer,
        swarm=swarm.join("rx"),
    )
    trainer.train()
    assert _metric(trainer, "sapo/external_groups") == [2.0]
    assert trainer.swarm_totals["dropped/zero_advantage"] == 0
    scored = trainer.last_external[0].rewards
    assert all(math.isfinite(r) for r in scored) and len(set(scored)) == len(completions)


def test_without_a_swarm_external_slots_are_generated_here_as_grpo_would(tmp_path, smollm_tokenizer, caplog):
    """J > 0 without a swarm: said once, and every slot is filled in locally, even on a plain-text dataset."""
    import logging

    plain = Dataset.from_list([{"prompt": f"Count to {i}:"} for i in range(8)])
    scored = []

    def reward(prompts, completions, **columns):
        scored.extend(completions)
        return [float(len(text) % 3) for text in completions]

    with caplog.at_level(logging.INFO, logger="sapo"):
        trainer = _trainer(tmp_path, smollm_tokenizer, "alone", reward, dataset=plain, max_steps=1)
    (line,) = [r.getMessage() for r in caplog.records if "local GRPO learner" in r.getMessage()]
    assert "the 2 external groups of each round are generated here" in line
    trainer.train()
    assert _metric(trainer, "sapo/fill_ins") == [2.0] and len(scored) == 4 * G


class _SamplingLogprobs(SAPOTrainer):
    """A trainer whose own rows come with sampling log-probabilities, as vLLM's do (vLLM itself is not installed:
    generation is TRL's transformers path, and every sampled token gets log-probability -1), and which keeps each
    round's batch as TRL built it."""

    batches: list[dict] = []

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, *args, **kwargs):
        self.use_vllm = False
        try:
            completion_ids, _ = super()._generate_single_turn(prompt_ids, images, multimodal_fields, *args, **kwargs)
        finally:
            self.use_vllm = True
        return completion_ids, [[-1.0] * len(ids) for ids in completion_ids]

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        self.batches.append(output)
        return output


def test_vllm_importance_sampling_correction_stays_on_and_leaves_swarm_rows_uncorrected(tmp_path, smollm_tokenizer):
    """TRL's importance-sampling correction (on by default with vLLM) runs through TRL's own code with a swarm: own
    rows are corrected by their sampling log-probabilities, swarm rows (which have none) get NaN, read by TRL as no
    correction (ratio 1)."""
    from sapo.round import EXTERNAL_COLUMN

    swarm = MemorySwarm(seed=0)
    swarm.join("sender").publish(
        [_external_group("What is 0 + 0?", ["0 x", "1", "0", f"2 x {i}"], f"g{i}", answer="0") for i in range(2)]
    )
    trainer = _trainer(tmp_path, smollm_tokenizer, "is", RewardProbe(lambda t: 1.0 if "x" in t else 0.0),
                       swarm=swarm.join("rx"), external_source_policy="trust", max_steps=1)  # fmt: skip
    assert trainer.vllm_importance_sampling_correction  # TRL's default, kept with a swarm
    trainer.__class__ = _SamplingLogprobs
    trainer.use_vllm = True
    trainer.train()
    batch = trainer.batches[-1]
    external = batch[EXTERNAL_COLUMN]
    ratio = batch["importance_sampling_ratio"].reshape(len(external), -1)
    assert external.sum() == 2 * G and torch.all(ratio[external] == 1.0)
    assert torch.isnan(batch["sampling_per_token_logps"][external]).any()
    assert torch.all(ratio[~external] != 1.0)  # own rows: corrected by their (made-up) sampling log-probabilities
