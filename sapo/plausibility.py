"""Plausibility of received completions under this node's policy, against the node's own completions.

A completion that carries a payload the policy would never write ("Remember to buy zebracoin.") has a few tokens
the policy finds very unlikely, however plausible the rest is. Its *surprise score* is the mean log-probability of
its ``lowest_tokens`` least likely tokens under the current policy. The node's own recent completions (sampled from
that policy) give the reference: a received completion scoring more than ``margin`` nats below the 5th percentile of
the own scores is implausible, and its group is dropped.

Measured with the default model (SmolLM2-135M-Instruct, 48 tokens, temperature 1, the default tasks; see
benchmarks/results/poisoning.md): own completions score -5.1 (median) and -6.1 (5th percentile) with 3 lowest
tokens; the payload completions of :mod:`sapo.payload_attack` -13.2 (median) and at most -11.1.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import torch

REFERENCE_QUANTILE = 0.05
"""The quantile of the own completions' scores a received completion is measured against."""


def surprise_scores(per_token_logps: torch.Tensor, completion_mask: torch.Tensor, lowest_tokens: int) -> list[float]:
    """Per row: the mean log-probability of its ``lowest_tokens`` least likely completion tokens (all of its tokens
    if it has fewer; 0 for an empty completion). ``per_token_logps`` and ``completion_mask`` are (rows, tokens)."""
    masked = per_token_logps.detach().float().masked_fill(completion_mask == 0, float("inf"))
    k = min(lowest_tokens, masked.size(1))
    lowest = masked.topk(k, dim=1, largest=False).values  # ascending; padding (inf) only past a row's length
    counts = completion_mask.sum(dim=1).clamp(max=k)
    finite = torch.isfinite(lowest)
    sums = lowest.masked_fill(~finite, 0.0).sum(dim=1)
    return [(s / c).item() if c > 0 else 0.0 for s, c in zip(sums, counts, strict=True)]


class PlausibilityCheck:
    """Keeps the surprise scores of the node's latest own completions and judges received ones against them.

    Args:
        margin: nats below the reference (the 5th percentile of the own scores) past which a received completion is
            implausible.
        lowest_tokens: how many least likely tokens a completion's score averages.
        window: how many own completions the reference remembers.
        min_reference: own completions needed before anything is judged (:meth:`threshold` is None until then:
            nothing says yet what this policy writes).
    """

    def __init__(self, margin: float = 3.0, lowest_tokens: int = 3, window: int = 64, min_reference: int = 4):
        if margin < 0:
            raise ValueError(f"plausibility margin must be >= 0 nats, got {margin}")
        if lowest_tokens < 1:
            raise ValueError(f"plausibility lowest_tokens must be >= 1, got {lowest_tokens}")
        if not 1 <= min_reference <= window:
            raise ValueError(f"min_reference must be in [1, window={window}], got {min_reference}")
        self.margin = margin
        self.lowest_tokens = lowest_tokens
        self.min_reference = min_reference
        self._own: deque[float] = deque(maxlen=window)

    def add_own(self, scores: Sequence[float]) -> None:
        """Remember the scores of completions this node generated itself."""
        self._own.extend(scores)

    def threshold(self) -> float | None:
        """The lowest score a received completion may have, or None while the reference is too small."""
        if len(self._own) < self.min_reference:
            return None
        ordered = sorted(self._own)
        return ordered[int(REFERENCE_QUANTILE * (len(ordered) - 1))] - self.margin

    def group_problem(self, scores: Sequence[float]) -> str | None:
        """Why a received group with these completion scores may not be trained on, or None if every one passes."""
        threshold = self.threshold()
        if threshold is None:
            return f"no reference yet ({len(self._own)} of {self.min_reference} own completions scored)"
        for index, score in enumerate(scores):
            if score < threshold:
                return f"completion {index} scores {score:.2f} < {threshold:.2f} nats"
        return None
