"""A loss pass over rows that share prompts: each distinct prompt run once, its key/value cache shared by its rows.

A GRPO batch holds every prompt `num_generations` times, and TRL's loss pass runs the whole prompt again in each row.
:func:`shared_prompt_logps` runs each distinct prompt (all its tokens but the last) once, copies its key/value cache to
the rows that share it (an `index_select`, so gradients from every row flow back into the one prompt pass), and runs
only the last prompt token and the completion of each row on top, through TRL's fused LM head. The positions, masks and
scored tokens are those of TRL's pass over the whole rows, so the log-probabilities and gradients are the same up to the
order of floating-point sums (tested). It pays where a micro-batch holds the rows of whole groups, as the node's default
micro-batch (the round) does (`sapo.speed.devices.round_micro_batch`). On by default on a CPU
(`SAPOConfig.scoring_prefill_once`).
"""

from __future__ import annotations

from typing import Any

import torch

from sapo.speed.generation import cache_argument, prompt_groups

__all__ = ["shared_prompt_logps"]


def shared_prompt_logps(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int, compute_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """Per-token log-probabilities (and entropies, with ``compute_entropy``) of the last ``logits_to_keep`` tokens
    of each row, as TRL's log-probability pass (`sapo.trl_bridge`) computes them with the fused LM head (``model``
    must have it, `trl.trainer.utils.add_fused_lm_head`), each distinct prompt run once. None when no two rows share a
    prompt or the prompt has a single token: then there is nothing to share, and the caller runs the plain pass."""
    from transformers import DynamicCache

    prompt_len = input_ids.shape[1] - logits_to_keep
    if prompt_len < 2:
        return None
    firsts, rows = prompt_groups(input_ids[:, :prompt_len], attention_mask[:, :prompt_len])
    if len(firsts) == len(rows):
        return None
    cache = DynamicCache(config=model.config)
    distinct = torch.tensor(firsts, device=input_ids.device)
    # No position ids anywhere: like TRL's pass over whole rows, positions count from the row's first (padded) slot.
    model(
        input_ids=input_ids[distinct, : prompt_len - 1],
        attention_mask=attention_mask[distinct, : prompt_len - 1],
        **{cache_argument(model): cache},
        use_cache=True,
        logits_to_keep=1,
    )
    cache.reorder_cache(torch.tensor(rows, device=input_ids.device))
    tail_ids, tail_mask = input_ids[:, prompt_len - 1 :], attention_mask[:, prompt_len - 1 :]
    labels = tail_ids.masked_fill(tail_mask == 0, -100)
    labels[:, 0] = -100  # the last prompt token is input only; the completion tokens are scored
    outputs = model(
        input_ids=tail_ids,
        attention_mask=attention_mask,
        labels=labels,
        fused_lm_head=True,
        **{cache_argument(model): cache},
    )
    return outputs.log_probs, (outputs.entropy if compute_entropy else None)
