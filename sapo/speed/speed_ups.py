"""The speed-ups one trainer runs, from its config, and the contexts it runs TRL's code in: the one surface through
which `SAPOTrainer` reaches `sapo.speed`.

Each speed-up declares what it supports and steps aside for the rest, saying so in one log line per trainer:

- generation (:meth:`SpeedUps.generation`, around TRL's generation call, `sapo.trl_bridge`): TRL's transformers path
  on one process, text only. Generation kwargs none of them knows leave TRL's generation as it is; beam search (and
  several sequences per row) leaves it to `generate`'s own prefill and sampling; a `cache_implementation` leaves the
  prefill to `generate`.
- the loss pass (:meth:`SpeedUps.loss_pass`, around TRL's log-probability pass, `sapo.trl_bridge`): under gradient
  checkpointing the backward pass recomputes each layer after the context has closed, so the speed-ups that change
  how a layer computes (bf16 weight copies and float32 attention, the fused LoRA forward, the shared prompt pass)
  step aside and the recompute matches the forward.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.weak import WeakIdKeyDictionary

from sapo.speed.generation import each_prompt_prefilled_once
from sapo.speed.inference import inference_context
from sapo.speed.lm_head import completion_positions_only, lean_cpu_lm_head
from sapo.speed.lora_layers import fused_lora_forward
from sapo.speed.precision import bf16_training_pass
from sapo.speed.sampling import inverse_transform_sampling
from sapo.speed.shared_prompts import shared_prompt_logps

__all__ = ["KNOWN_GENERATION_KWARGS", "SpeedUps"]

logger = logging.getLogger(__name__)

KNOWN_GENERATION_KWARGS = frozenset(
    {
        # what TRL itself puts in the generation config
        "max_new_tokens", "do_sample", "pad_token_id", "bos_token_id", "eos_token_id", "temperature", "top_p",
        "top_k", "min_p", "repetition_penalty", "cache_implementation", "suppress_tokens",
        # logits processors and stopping rules that act on each row alone
        "min_new_tokens", "max_length", "min_length", "typical_p", "epsilon_cutoff", "eta_cutoff",
        "no_repeat_ngram_size", "bad_words_ids", "begin_suppress_tokens", "renormalize_logits",
        "remove_invalid_values", "forced_eos_token_id", "use_cache",
        # beam search: known, so that the speed-ups that cannot decode it step aside by name
        "num_beams", "length_penalty", "early_stopping", "num_return_sequences",
    }
)  # fmt: skip
"""`generation_kwargs` keys the generation speed-ups know; any other key leaves TRL's generation as it is."""

_BY_TRAINER: WeakIdKeyDictionary = WeakIdKeyDictionary()
"""A trainer (by identity, while it lives) -> its :class:`SpeedUps`."""


@dataclass
class SpeedUps:
    """Which speed-ups run, and the contexts that apply them. Built from a config by :meth:`from_config` (a config
    without SAPO's fields, e.g. a `GRPOConfig`, turns every one off); :meth:`of` keeps one per trainer."""

    on: bool = False  # `speedups="auto"`: the speed-ups without a switch of their own (bf16 weights, LM head scope)
    prefill_once: bool = False
    merge_adapters: bool = False
    inverse_transform: bool = False
    scoring_prefill_once: bool = False
    fused_loss_pass: bool = False
    bf16: bool = False
    announced: set[str] = field(default_factory=set, repr=False)  # the step-asides already logged

    @classmethod
    def from_config(cls, args: Any) -> SpeedUps:
        """The speed-ups ``args`` (a resolved `SAPOConfig`) turns on."""

        def switch(name: str) -> bool:
            return bool(getattr(args, name, False))

        return cls(
            on=getattr(args, "speedups", "off") != "off",
            prefill_once=switch("generation_prefill_once"),
            merge_adapters=switch("generation_merge_adapters"),
            inverse_transform=switch("generation_inverse_transform_sampling"),
            scoring_prefill_once=switch("scoring_prefill_once"),
            fused_loss_pass=switch("cpu_fused_loss_pass"),
            bf16=switch("bf16"),
        )

    @classmethod
    def of(cls, trainer: Any) -> SpeedUps:
        """``trainer``'s speed-ups, built from its `args` on first use and kept while it lives."""
        try:
            speed_ups = _BY_TRAINER.get(trainer)
        except TypeError:  # an object without weak references: nothing to keep it on
            return cls.from_config(getattr(trainer, "args", None))
        if speed_ups is None:
            speed_ups = _BY_TRAINER[trainer] = cls.from_config(getattr(trainer, "args", None))
        return speed_ups

    def step_aside(self, what: str, reason: str) -> None:
        """Say once (per trainer) that ``what`` steps aside for ``reason``."""
        line = f"{what}: {reason}"
        if line not in self.announced:
            self.announced.add(line)
            logger.info("speed-ups: %s; TRL's own code runs there", line)

    # ------------------------------------------------------------------------------------------------
    # generation

    @contextlib.contextmanager
    def generation(
        self, trainer: Any, images: Any = None, multimodal_fields: Any = None, vision: bool = False
    ) -> Iterator[None]:
        """The context to run TRL's generation call in (`sapo.trl_bridge`): each speed-up that is on and supports
        this call (``vision``: the trainer's model is a vision-language model; default False)."""
        names = self.generation_speed_ups(trainer, images, multimodal_fields, vision)
        model = trainer.accelerator.unwrap_model(trainer.model_wrapped) if names else None
        merge, bf16 = "generation_merge_adapters" in names, "bf16 weights" in names
        prefill, sample = "generation_prefill_once" in names, "generation_inverse_transform_sampling" in names
        with (
            inference_context(model, merge_adapters=merge, bf16=bf16) if merge or bf16 else contextlib.nullcontext(),
            each_prompt_prefilled_once(model) if prefill else contextlib.nullcontext(),
            inverse_transform_sampling() if sample else contextlib.nullcontext(),
        ):
            yield

    def generation_speed_ups(
        self, trainer: Any, images: Any = None, multimodal_fields: Any = None, vision: bool = False
    ) -> list[str]:
        """The generation speed-ups that run for this call of TRL's generation (each one on, and supporting it;
        ``vision``: the trainer's model is a vision-language model, default False)."""
        cpu = trainer.accelerator.device.type == "cpu"
        wanted = {
            "generation_prefill_once": self.prefill_once,
            "generation_merge_adapters": self.merge_adapters,
            "generation_inverse_transform_sampling": self.inverse_transform and cpu,
            "bf16 weights": self.on and self.bf16 and cpu,
        }
        names = [name for name, on in wanted.items() if on]
        if not names:
            return []
        refusal = _generation_refusal(trainer, images, multimodal_fields, vision)
        if refusal is not None:
            self.step_aside(", ".join(names), refusal)
            return []
        config = trainer.generation_config
        refusals = {
            "generation_prefill_once": _decoding_refusal(config) or _cache_refusal(config),
            "generation_inverse_transform_sampling": _decoding_refusal(config),
        }
        for name, reason in refusals.items():
            if name in names and reason is not None:
                self.step_aside(name, reason)
                names.remove(name)
        return names

    # ------------------------------------------------------------------------------------------------
    # the loss pass

    @contextlib.contextmanager
    def loss_pass(self, trainer: Any, model: Any, training: bool) -> Iterator[None]:
        """The context to run TRL's log-probability pass in (`sapo.trl_bridge`); ``training``: a pass whose gradients
        train (else TRL's scoring of old log-probabilities, or evaluation)."""
        cpu = trainer.accelerator.device.type == "cpu"
        unwrapped = trainer.accelerator.unwrap_model(model)
        bf16_pass = self.on and cpu and trainer.accelerator.mixed_precision == "bf16"
        fused_lora = self.fused_loss_pass and cpu
        checkpointing = training and _gradient_checkpointing(trainer, unwrapped)
        for name, on in (
            ("bf16 weights and float32 attention", bf16_pass),
            ("the fused LoRA forward (cpu_fused_loss_pass)", fused_lora),
        ):
            if on and checkpointing:
                self.step_aside(name, "gradient checkpointing recomputes each layer after the pass; TRL's layers run")
        layers = training and not checkpointing
        with (
            completion_positions_only() if self.on else contextlib.nullcontext(),
            lean_cpu_lm_head() if fused_lora else contextlib.nullcontext(),
            # the frozen weights cast once, attention in float32 (its CPU backward is the faster one); the backward
            # reads the bf16 copies the forward saved
            bf16_training_pass(unwrapped) if layers and bf16_pass else contextlib.nullcontext(),
            fused_lora_forward(unwrapped) if layers and fused_lora else contextlib.nullcontext(),
        ):
            yield

    def shared_prompt_scores(
        self, trainer: Any, model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int,
        args: tuple, kwargs: dict[str, Any],
    ) -> tuple[torch.Tensor, torch.Tensor | None, None] | None:  # fmt: skip
        """TRL's (log-probabilities, entropies, aux loss) with each distinct prompt run once
        (`sapo.speed.shared_prompts`), or None where that does not apply: `scoring_prefill_once` off, a pass without
        gradients (the plausibility pass: one group, where the two calls cost more than the shared prompt saves),
        several processes (a wrapped model runs one forward per backward), gradient checkpointing, images or an MoE
        aux loss (any argument TRL's pass takes beyond the batch size and entropy), or no prompt shared by two rows."""
        if not self.scoring_prefill_once or not torch.is_grad_enabled():
            return None
        given = {k: v for k, v in kwargs.items() if k not in ("batch_size", "compute_entropy")}
        extra = [k for k, v in given.items() if v is not None and v is not False]  # identity: tensors have no truth
        if trainer.accelerator.num_processes > 1 or args or extra:
            return None
        if _gradient_checkpointing(trainer, trainer.accelerator.unwrap_model(model)):
            self.step_aside("scoring_prefill_once", "gradient checkpointing recomputes each layer; TRL's pass runs")
            return None
        with trainer.accelerator.autocast():
            scored = shared_prompt_logps(
                model, input_ids, attention_mask, logits_to_keep, bool(kwargs.get("compute_entropy"))
            )
        return None if scored is None else (*scored, None)

    # ------------------------------------------------------------------------------------------------
    # passes without gradients

    def inference(self, model: torch.nn.Module, pack_weights: bool = True) -> Any:
        """The context of a forward pass without gradients (the plausibility pass): adapters merged, bf16 weights cast
        once (and packed for oneDNN with ``pack_weights``, which pays over a generation's many passes only)."""
        return inference_context(model, merge_adapters=self.merge_adapters, bf16=self.on and self.bf16,
                                 pack_weights=pack_weights)  # fmt: skip

    def evaluation_options(self) -> dict[str, bool]:
        """The speed-up arguments of `sapo.evaluation.evaluate_policy` for held-out evaluation."""
        return {"merge_adapters": self.merge_adapters, "bf16": self.on and self.bf16}


def _generation_refusal(trainer: Any, images: Any, multimodal_fields: Any, vision: bool) -> str | None:
    """Why no generation speed-up applies to this call of TRL's generation (None: they may)."""
    from accelerate.utils import DistributedType

    if getattr(trainer, "use_vllm", False) or getattr(trainer, "use_transformers_continuous_batching", False):
        return "generation by vLLM or continuous batching"
    if trainer.accelerator.distributed_type in (DistributedType.DEEPSPEED, DistributedType.FSDP):
        return "a sharded model (DeepSpeed ZeRO or FSDP)"
    if vision or images is not None or multimodal_fields:
        return "a vision-language model or images"
    unknown = sorted(set(getattr(trainer.args, "generation_kwargs", None) or {}) - KNOWN_GENERATION_KWARGS)
    if unknown:
        return f"generation_kwargs {unknown} are not ones they know"
    return None


def _decoding_refusal(config: Any) -> str | None:
    """Why a speed-up that samples one sequence per row cannot run this generation config (None: it can)."""
    if (getattr(config, "num_beams", 1) or 1) > 1:
        return f"beam search (num_beams={config.num_beams}) decodes its own way"
    if (getattr(config, "num_return_sequences", 1) or 1) > 1:
        return "several sequences per row (num_return_sequences)"
    return None


def _cache_refusal(config: Any) -> str | None:
    """Why a prefilled cache cannot be handed to this generation config (None: it can)."""
    if getattr(config, "cache_implementation", None) is not None:
        return f"cache_implementation={config.cache_implementation!r} builds its own cache"
    if getattr(config, "use_cache", True) is False:
        return "use_cache=False"
    return None


def _gradient_checkpointing(trainer: Any, model: Any) -> bool:
    """Whether the training pass recomputes activations in its backward pass."""
    if getattr(getattr(trainer, "args", None), "gradient_checkpointing", False):
        return True
    on = getattr(model, "is_activation_checkpointing", None)  # transformers 5's name (the old one warns)
    return bool(getattr(model, "is_gradient_checkpointing", False) if on is None else on)
