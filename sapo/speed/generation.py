"""Generation with each prompt prefilled once: the rows of a GRPO group share one forward pass over their prompt.

A GRPO batch holds every prompt `num_generations` times. Within :func:`each_prompt_prefilled_once`, the model's
`generate` runs the distinct prompts (all tokens but the last) through the model once, copies the key/value cache of
each to its rows, and continues with the model's own `generate` from that cache, so sampling, logits processors and
stopping are exactly the ones `generate` applies. Only the prompt's forward pass is shared, so the sampling
distribution is unchanged. :func:`generate_completions` is the same path for a caller with prompt ids in hand (the
benchmarks); `SAPOTrainer` runs TRL's own generation inside the context (`sapo.speed.speed_ups`).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from sapo.speed.sampling import inverse_transform_sampling
from sapo.speed.scoped import attribute_replaced

__all__ = ["cache_argument", "each_prompt_prefilled_once", "generate_completions", "prompt_groups", "unique_prompts"]

_PREFILLED_ARGUMENTS = {"input_ids", "attention_mask", "generation_config"}
"""The `generate` arguments a prefilled call accepts (TRL's text-only call); any other call is `generate`'s own."""


def unique_prompts(prompt_ids: Sequence[Sequence[int]]) -> tuple[list[list[int]], list[int]]:
    """The distinct prompts, in order of first appearance, and for each row the index of its prompt among them."""
    first: dict[tuple[int, ...], int] = {}
    index = [first.setdefault(tuple(ids), len(first)) for ids in prompt_ids]
    return [list(ids) for ids in first], index


def prompt_groups(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> tuple[list[int], list[int]]:
    """For rows of (left-padded) prompts: the first row of each distinct prompt (tokens and padding alike), and for
    every row the index of its prompt among those."""
    keyed = prompt_ids.masked_fill(prompt_mask == 0, -1).tolist()  # padding told apart from every token id
    distinct, rows = unique_prompts(keyed)
    return [rows.index(k) for k in range(len(distinct))], rows


def cache_argument(model: Any) -> str:
    """The name under which this transformers version passes a key/value cache (`cache` since 5.2x, before
    `past_key_values`)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(type(base).forward).parameters else "past_key_values"


def _prefilled_cache(model: Any, ids: torch.Tensor, mask: torch.Tensor, rows: list[int]) -> Any:
    """The key/value cache of every token of the distinct prompts ``ids`` but the last, copied to each row."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    prefix, prefix_mask = ids[:, :-1], mask[:, :-1]
    position_ids = (prefix_mask.cumsum(-1) - 1).clamp(min=0)  # as generate() numbers left-padded rows
    model(input_ids=prefix, attention_mask=prefix_mask, position_ids=position_ids, use_cache=True, logits_to_keep=1,
          **{cache_argument(model): cache})  # fmt: skip
    cache.reorder_cache(torch.tensor(rows, device=ids.device))
    return cache


@contextlib.contextmanager
def each_prompt_prefilled_once(model: Any) -> Iterator[None]:
    """Within the context, ``model.generate(input_ids=..., attention_mask=..., generation_config=...)`` on rows that
    share prompts runs each distinct prompt through the model once and generates every row from a copy of its cache
    (module docstring). A call with other arguments, or with no two rows alike, is `generate`'s own. ``model``'s
    own `generate` is back on exit. The caller makes sure the generation config decodes one sequence per row (no beam
    search, no `cache_implementation`: `sapo.speed.speed_ups`)."""
    generate = model.generate

    def prefilled(*args: Any, **kwargs: Any) -> Any:
        if args or not {"input_ids", "attention_mask"} <= set(kwargs) <= _PREFILLED_ARGUMENTS:
            return generate(*args, **kwargs)
        ids, mask = kwargs["input_ids"], kwargs["attention_mask"]
        firsts, rows = prompt_groups(ids, mask)
        if len(firsts) == len(rows) or ids.shape[1] < 2:
            return generate(**kwargs)
        distinct = torch.tensor(firsts, device=ids.device)
        cache = _prefilled_cache(model, ids[distinct], mask[distinct], rows)
        return generate(**kwargs, **{cache_argument(model): cache})

    with attribute_replaced(model, "generate", prefilled):
        yield


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

    With ``prefill_once``, rows that share a prompt (a GRPO group) share one prefill
    (:func:`each_prompt_prefilled_once`). With ``inverse_transform`` (on a CPU), tokens are drawn by
    `sapo.speed.sampling.sample_rows` instead of `torch.multinomial`.
    """
    device = next(model.parameters()).device
    ids, mask = _left_pad(prompt_ids, pad_token_id)
    with (
        inverse_transform_sampling() if inverse_transform and device.type == "cpu" else contextlib.nullcontext(),
        each_prompt_prefilled_once(model) if prefill_once else contextlib.nullcontext(),
    ):
        output = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device),
                                generation_config=generation_config)  # fmt: skip
    completions = output[:, ids.shape[1] :].tolist()
    eos = set(eos_token_ids)
    return [c[: next((k + 1 for k, t in enumerate(c) if t in eos), len(c))] for c in completions]
