"""Inverse-transform sampling: each generated token drawn with one uniform number per row on a CPU.

`torch.multinomial` draws an exponential number for every word of the vocabulary to sample one of them; inverse
transform draws one uniform number per row and finds where the row's cumulative probabilities reach it. The
distribution is the same; the draws for a given seed are not.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from sapo.speed.scoped import attribute_replaced

__all__ = ["inverse_transform_sampling", "sample_rows"]


def sample_rows(probs: torch.Tensor) -> torch.Tensor:
    """One index per row of ``probs`` (rows of non-negative weights, shape (rows, words)), drawn with probability
    proportional to its weight: where the row's cumulative weights (float64, so that tens of thousands of small terms
    add up exactly enough) first reach a uniform draw in (0, total]. A word of weight 0 is never drawn."""
    cumulative = probs.double().cumsum(-1)
    total = cumulative[:, -1:]
    draws = (1.0 - torch.rand(total.shape, dtype=torch.float64, device=probs.device)) * total  # in (0, total]
    return torch.searchsorted(cumulative, draws).squeeze(-1).clamp_(max=probs.shape[-1] - 1)


@contextlib.contextmanager
def inverse_transform_sampling() -> Iterator[None]:
    """Within the context, `torch.multinomial` of one draw per row from CPU rows (the call `generate` makes to
    sample a token) goes through :func:`sample_rows`; every other call is `torch.multinomial`'s own. The original
    function is back on exit."""
    multinomial = torch.multinomial

    def one_draw_per_row(input: torch.Tensor, num_samples: int, *args: Any, **kwargs: Any) -> torch.Tensor:
        if num_samples == 1 and input.dim() == 2 and input.device.type == "cpu" and not args and not kwargs:
            return sample_rows(input).unsqueeze(-1)
        return multinomial(input, num_samples, *args, **kwargs)

    with attribute_replaced(torch, "multinomial", one_draw_per_row):
        yield
