"""Local generation at the machine's speed: each prompt prefilled once, LoRA adapters merged, bf16 where native.

Three independent speed-ups of `model.generate` as TRL calls it for a node's own rows, each with a switch in
`SAPOConfig` (see `docs` of `generation_prefill_once`, `generation_merge_adapters`, `bf16`):

- **each prompt prefilled once** (:func:`generate_completions`): a GRPO batch holds every prompt `num_generations`
  times. The distinct prompts are run through the model once, and the key/value cache of each is copied to its
  rows; `model.generate` then continues from that cache, so sampling, logits processors and stopping are exactly
  the ones `generate` applies. Only the prompt's forward pass is shared, so the sampling distribution is unchanged.
- **adapters merged** (:func:`inference_weights`): during generation every LoRA linear layer of a PEFT model runs on
  one merged weight (base + B A scaled) instead of three matmuls. The merged weight is a new tensor swapped in for
  the base weight, and the base weight object is put back afterwards, untouched: training continues on exactly the
  weights it left.
- **bf16** (:func:`inference_autocast`): where the CPU computes bf16 natively (`sapo.config.device_defaults`),
  generation runs under bf16 autocast, with the merged weights made in bf16 directly and every other linear
  layer's weight (the LM head above all) cast to bf16 once for the context (float32 master weights are kept for
  training), each packed once for oneDNN (`sapo.precision.packed_bf16_linears`: the same products).

On a CPU, each sampled token is drawn by inverse transform (:func:`sample_rows`: one uniform number per row against
the cumulative probabilities) instead of `torch.multinomial`, which draws an exponential number for every word of
the vocabulary: 7.3 ms against 0.3 ms per token at 8 rows of 49,152 words, one thread. The distribution is the same;
the draws for a given seed are not.

The same two contexts serve held-out evaluation (`sapo.evaluation.generate_greedy`) and the plausibility pass.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from sapo.lora_layers import plain_lora_linears
from sapo.precision import linear_weights_in, packed_bf16_linears, weight_in

__all__ = [
    "fast_generation_applies",
    "generate_completions",
    "inference_autocast",
    "inference_context",
    "inference_weights",
    "sample_rows",
    "trainer_generate",
    "unique_prompts",
]


@contextlib.contextmanager
def inference_weights(
    model: torch.nn.Module, merge_adapters: bool = True, dtype: torch.dtype | None = None, pack_weights: bool = True
):
    """Within the context, ``model``'s LoRA linear layers compute with merged weights (one matmul each).

    Each adapted layer's base weight is replaced by a new tensor ``W + delta`` (in ``dtype`` when given, e.g. bf16
    for bf16 autocast) and marked merged, so PEFT's forward uses the base layer alone. With ``dtype``, every other
    linear weight computes with a copy in ``dtype`` too (:func:`sapo.precision.linear_weights_in`): autocast cast
    the default model's tied LM head, 28 M weights, at every generated token (a quarter of bf16 generation's time);
    and in bf16, with ``pack_weights``, each weight is packed once into oneDNN's layout
    (:func:`sapo.precision.packed_bf16_linears`), which pays back over a generation's many forward passes; a single
    forward pass (the plausibility pass) would pay the packing and gain nothing.
    On exit the original weight objects are put back unchanged (exactly, not by subtraction) and the merge marks
    removed. No gradient flows through the swapped weights: use it for generation and forward passes without
    gradients. A model without LoRA layers, or ``merge_adapters=False``, keeps its adapters unmerged.
    """
    layers = plain_lora_linears(model) if merge_adapters else []
    swapped = []
    try:
        with torch.no_grad():
            for module, adapters in layers:
                base = module.get_base_layer()
                weight = base.weight
                # in dtype: from the frozen base's copy, cast once for the run (sapo.precision), not per generation
                merged = (weight.detach() if dtype is None else weight_in(weight, dtype)).clone()
                for adapter in adapters:
                    merged += module.get_delta_weight(adapter).to(merged.dtype)
                swapped.append((module, base, weight))
                base.weight = torch.nn.Parameter(merged, requires_grad=False)
                module.merged_adapters = list(adapters)
        with (
            linear_weights_in(model, dtype) if dtype is not None else contextlib.nullcontext(),
            packed_bf16_linears(model) if dtype == torch.bfloat16 and pack_weights else contextlib.nullcontext(),
        ):
            yield model
    finally:
        for module, base, weight in swapped:
            base.weight = weight
            module.merged_adapters = []


def inference_autocast(model: torch.nn.Module, bf16: bool) -> contextlib.AbstractContextManager:
    """bf16 autocast on the model's device when ``bf16`` is set and the model is on a CPU (a GPU's mixed precision is
    TRL's and accelerate's business), else a context that does nothing."""
    device = next(model.parameters()).device
    if bf16 and device.type == "cpu":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


@contextlib.contextmanager
def inference_context(
    model: torch.nn.Module, merge_adapters: bool = True, bf16: bool = False, pack_weights: bool = True
) -> Iterator[None]:
    """The speed-ups of forward passes without gradients (generation, evaluation, the plausibility pass) in one
    context: LoRA adapters merged (:func:`inference_weights`, in bf16 when bf16 autocast is on, packed for oneDNN
    with ``pack_weights``) and bf16 autocast on a CPU (:func:`inference_autocast`)."""
    autocast = inference_autocast(model, bf16)
    dtype = torch.bfloat16 if isinstance(autocast, torch.autocast) else None
    with inference_weights(model, merge_adapters=merge_adapters, dtype=dtype, pack_weights=pack_weights), autocast:
        yield


def unique_prompts(prompt_ids: Sequence[Sequence[int]]) -> tuple[list[list[int]], list[int]]:
    """The distinct prompts, in order of first appearance, and for each row the index of its prompt among them."""
    first: dict[tuple[int, ...], int] = {}
    index = [first.setdefault(tuple(ids), len(first)) for ids in prompt_ids]
    return [list(ids) for ids in first], index


def _left_pad(rows: Sequence[Sequence[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ids and attention mask of token-id rows."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            ids[i, width - len(r) :] = torch.tensor(list(r), dtype=torch.long)
            mask[i, width - len(r) :] = 1
    return ids, mask


def _cache_argument(model: Any) -> str:
    """The name under which this transformers version passes a key/value cache (`cache` since 5.2x, before
    `past_key_values`)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(type(base).forward).parameters else "past_key_values"


def sample_rows(probs: torch.Tensor) -> torch.Tensor:
    """One index per row of ``probs`` (rows of non-negative weights, shape (rows, words)), drawn with probability
    proportional to its weight: where the row's cumulative weights (float64, so that 49,152 small terms add up
    exactly enough) first reach a uniform draw in (0, total]. A word of weight 0 is never drawn."""
    cumulative = probs.double().cumsum(-1)
    total = cumulative[:, -1:]
    draws = (1.0 - torch.rand(total.shape, dtype=torch.float64, device=probs.device)) * total  # in (0, total]
    return torch.searchsorted(cumulative, draws).squeeze(-1).clamp_(max=probs.shape[-1] - 1)


@contextlib.contextmanager
def inverse_transform_sampling() -> Iterator[None]:
    """Within the context, `torch.multinomial` of one draw per row from CPU rows (the call `generate` makes to
    sample a token) goes through :func:`sample_rows`; every other call is `torch.multinomial`'s own."""
    multinomial = torch.multinomial

    def one_draw_per_row(input: torch.Tensor, num_samples: int, *args: Any, **kwargs: Any) -> torch.Tensor:
        if num_samples == 1 and input.dim() == 2 and input.device.type == "cpu" and not args and not kwargs:
            return sample_rows(input).unsqueeze(-1)
        return multinomial(input, num_samples, *args, **kwargs)

    torch.multinomial = one_draw_per_row
    try:
        yield
    finally:
        torch.multinomial = multinomial


def _prefilled_cache(model: Any, ids: torch.Tensor, mask: torch.Tensor, rows: list[int]) -> Any:
    """The key/value cache of every token of the distinct prompts ``ids`` but the last, copied to each row."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    prefix, prefix_mask = ids[:, :-1], mask[:, :-1]
    position_ids = (prefix_mask.cumsum(-1) - 1).clamp(min=0)  # as generate() numbers left-padded rows
    model(input_ids=prefix, attention_mask=prefix_mask, position_ids=position_ids, use_cache=True, logits_to_keep=1,
          **{_cache_argument(model): cache})  # fmt: skip
    cache.reorder_cache(torch.tensor(rows, device=ids.device))
    return cache


def generate_completions(
    model: Any,
    prompt_ids: Sequence[Sequence[int]],
    generation_config: Any,
    eos_token_ids: Sequence[int],
    pad_token_id: int,
    prefill_once: bool = True,
    inverse_transform: bool = True,
) -> list[list[int]]:
    """Completion token ids of each prompt row as `model.generate(..., generation_config)` samples them, cut after the
    first EOS token (TRL's convention); ``model`` must be in eval or no-dropout state and ``torch.no_grad`` active.

    With ``prefill_once``, rows that share a prompt (a GRPO group) share one prefill: the distinct prompts (all tokens
    but the last) are run once, their cache is copied to every row, and `generate` continues from there. With
    ``inverse_transform`` (on a CPU), tokens are drawn by :func:`sample_rows` instead of `torch.multinomial`.
    """
    device = next(model.parameters()).device
    fast_sampling = inverse_transform and device.type == "cpu"
    sampling = inverse_transform_sampling() if fast_sampling else contextlib.nullcontext()
    with sampling:
        output, prompt_width = _generate(model, prompt_ids, generation_config, pad_token_id, prefill_once, device)
    completions = output[:, prompt_width:].tolist()
    eos = set(eos_token_ids)
    return [c[: next((k + 1 for k, t in enumerate(c) if t in eos), len(c))] for c in completions]


def _generate(model: Any, prompt_ids: Sequence[Sequence[int]], generation_config: Any, pad_token_id: int,
              prefill_once: bool, device: torch.device) -> tuple[torch.Tensor, int]:  # fmt: skip
    """`model.generate`'s output for the prompt rows (prefilled once per distinct prompt if asked) and the width of
    its prompt part."""
    if prefill_once:
        distinct, rows = unique_prompts(prompt_ids)
        distinct_ids, distinct_mask = _left_pad(distinct, pad_token_id)
        prefill_once = len(distinct) < len(rows) and distinct_ids.shape[1] > 1
    if prefill_once:
        distinct_ids, distinct_mask = distinct_ids.to(device), distinct_mask.to(device)
        cache = _prefilled_cache(model, distinct_ids, distinct_mask, rows)
        index = torch.tensor(rows, device=device)
        ids, mask = distinct_ids[index], distinct_mask[index]
        output = model.generate(
            input_ids=ids, attention_mask=mask, generation_config=generation_config, **{_cache_argument(model): cache}
        )
    else:
        ids, mask = _left_pad(prompt_ids, pad_token_id)
        ids, mask = ids.to(device), mask.to(device)
        output = model.generate(input_ids=ids, attention_mask=mask, generation_config=generation_config)
    return output, ids.shape[1]


def fast_generation_applies(trainer: Any, images: Any, multimodal_fields: Any) -> bool:
    """Whether a `SAPOTrainer`'s local rows go through :func:`trainer_generate` instead of TRL's `generate` path: a
    speed-up is on (`generation_prefill_once`, `generation_merge_adapters`, or bf16 on a CPU), the model is a
    text-only one generating with transformers (no vLLM, no continuous batching, no images) and it is not sharded
    (DeepSpeed ZeRO-3 and FSDP keep TRL's path, which gathers the weights)."""
    from accelerate.utils import DistributedType

    args = trainer.args
    cpu_bf16 = bool(args.bf16) and trainer.accelerator.device.type == "cpu"
    if not (args.generation_prefill_once or args.generation_merge_adapters or cpu_bf16):
        return False
    sharded = trainer.accelerator.distributed_type in (DistributedType.DEEPSPEED, DistributedType.FSDP)
    return not (
        trainer.use_vllm
        or trainer.use_transformers_continuous_batching
        or sharded
        or getattr(trainer, "_is_vlm", False)
        or images is not None
        or multimodal_fields
    )


def trainer_generate(trainer: Any, prompt_ids: Sequence[Sequence[int]]) -> list[list[int]]:
    """Completion ids of a GRPO trainer's prompt rows (its generation config, EOS ids and pad token), with the
    speed-ups its config turns on; what TRL's `_generate_single_turn` returns for the transformers path."""
    from trl.models import unwrap_model_for_generation

    args = trainer.args
    with (
        unwrap_model_for_generation(
            trainer.model_wrapped,
            trainer.accelerator,
            generation_kwargs=trainer.generation_kwargs,
            gradient_checkpointing_kwargs=args.gradient_checkpointing_kwargs,
        ) as model,
        torch.no_grad(),
        inference_context(model, merge_adapters=bool(args.generation_merge_adapters), bf16=bool(args.bf16)),
    ):
        return generate_completions(
            model,
            prompt_ids,
            trainer.generation_config,
            trainer.eos_token_ids,
            trainer._tokenizer.pad_token_id,
            prefill_once=bool(args.generation_prefill_once),
            inverse_transform=bool(args.generation_inverse_transform_sampling),
        )
