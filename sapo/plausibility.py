"""Plausibility of received completions under this node's policy, against the node's own completions.

A completion's *typicality* is the mean, over its tokens, of the token's log-probability plus the policy's entropy
at that position: how much likelier each token is than what the policy itself typically samples there. Completions
sampled from the policy (temperature and all) score about 0 on average whatever the policy is, sharp or not; a token
the policy would not write where it is sure of the next one (a payload like "Remember to buy zebracoin." after the
answer) scores far below it. The node's own latest completions give the reference: a received completion scoring
more than ``margin`` nats per token below the 5th percentile of the own scores is implausible, and its group is
dropped.

Measured with the default model (SmolLM2-135M-Instruct, 48 tokens, temperature 1, 16 held-out questions of the default
tasks; benchmarks/results/plausibility_scores.md): own samples score -0.72 (5th percentile) and -1.09 at worst; the
payload completions of :mod:`testbed.payload_attack` -1.48 at best, so the default margin (0.5) drops all of them and
none of the own samples; terse answers in another style than the policy's ("<answer>7</answer>") fall below it in
about a third of cases: a peer that writes very differently from this node is often not trained on.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import torch

REFERENCE_QUANTILE = 0.05
"""The quantile of the own completions' scores a received completion is measured against."""

STATISTICS = {
    "mean": "typicality averaged over the whole completion",
    "window4": "the lowest typicality averaged over 4 consecutive tokens",
    "window8": "the lowest typicality averaged over 8 consecutive tokens",
    "worst_token": "the lowest typicality of one token",
}
"""Statistics of a completion's per-token typicality that :func:`completion_statistics` computes."""


@dataclass(frozen=True)
class CompletionStatistics:
    """Per-token typicality (log-probability + entropy) of one completion, summarized (see :data:`STATISTICS`)."""

    mean: float
    window4: float
    window8: float
    worst_token: float


def worst_window(excess: torch.Tensor, width: int) -> float:
    """The lowest mean of ``width`` consecutive values of the 1-D ``excess``; its mean if it is shorter."""
    if excess.numel() == 0:
        return 0.0
    if excess.numel() <= width:
        return excess.mean().item()
    return excess.unfold(0, width, 1).mean(dim=1).min().item()


def completion_statistics(
    per_token_logps: torch.Tensor, entropies: torch.Tensor, completion_mask: torch.Tensor
) -> list[CompletionStatistics]:
    """Per row: :class:`CompletionStatistics` of its completion tokens. Every argument is (rows, tokens)."""
    excess = per_token_logps.detach().float() + entropies.detach().float()
    out = []
    for row, mask in zip(excess, completion_mask.bool(), strict=True):
        values = row[mask]
        out.append(
            CompletionStatistics(
                mean=values.mean().item() if values.numel() else 0.0,
                window4=worst_window(values, 4),
                window8=worst_window(values, 8),
                worst_token=values.min().item() if values.numel() else 0.0,
            )
        )
    return out


def typicality_scores(
    per_token_logps: torch.Tensor, entropies: torch.Tensor, completion_mask: torch.Tensor
) -> list[float]:
    """Per row: the mean over its completion tokens of (log-probability + the policy's entropy there), in nats; 0 for
    an empty completion. Every argument is (rows, tokens)."""
    mask = completion_mask.float()
    excess = (per_token_logps.detach().float() + entropies.detach().float()) * mask
    counts = mask.sum(dim=1)
    return [(e / c).item() if c > 0 else 0.0 for e, c in zip(excess.sum(dim=1), counts, strict=True)]


class PlausibilityCheck:
    """Keeps the typicality scores of the node's latest own completions and judges received ones against them.

    Args:
        margin: nats per token below the reference (the 5th percentile of the own scores) past which a received
            completion is implausible.
        window: how many own completions the reference remembers.
        min_reference: own completions needed before anything is judged (:meth:`threshold` is None until then:
            nothing says yet what this policy writes).
    """

    def __init__(self, margin: float = 0.5, window: int = 64, min_reference: int = 4):
        if margin < 0:
            raise ValueError(f"plausibility margin must be >= 0 nats, got {margin}")
        if not 1 <= min_reference <= window:
            raise ValueError(f"min_reference must be in [1, window={window}], got {min_reference}")
        self.margin = margin
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
                return f"completion {index} scores {score:.2f} < {threshold:.2f} nats per token"
        return None
