"""Plausibility of received completions under this node's policy, against the node's own completions.

A token's *typicality* is its log-probability plus the policy's entropy at that position: how much likelier it is
than what the policy itself typically samples there (about 0 on average for the policy's own samples, sharp or not).
Two statistics of a completion are judged against the node's own latest completions (their 5th percentile):

- the *mean* typicality over the whole completion: a completion in a style the policy never writes (the hand-written
  payload "Remember to buy zebracoin." around a terse answer) falls far below;
- the *worst span*: the lowest mean typicality over ``span_tokens`` consecutive tokens. An attacker who runs the same
  public model samples its text as the node does and splices a payload of a few tokens in: the mean over 40 tokens
  of the policy's own text hardly moves, the span that holds the payload falls far below the node's own worst spans.

Not judged fairly: a peer sampling at a much higher temperature or writing in a very different style, and a payload
this policy already finds likely. What passes is kept from being learned by the token floor
(`SAPOConfig.external_token_floor`, applied in the loss through :func:`floor_mask`: a token below the floor and its
neighbours get no weight). How often each test drops honest and attacker groups: `benchmarks/README.md` (trust).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import torch

REFERENCE_QUANTILE = 0.05
"""The quantile of the own completions' scores a received completion is measured against."""


class Implausible(str):
    """Why a received group may not be trained on (the message, as logged), with the test that said so: ``mean``
    (typicality over the whole completion), ``span`` (the worst span) or ``reference`` (nothing to judge against
    yet). Counted per test in the node's metrics (``implausible/<test>``)."""

    test: str

    def __new__(cls, message: str, test: str) -> Implausible:
        problem = super().__new__(cls, message)
        problem.test = test
        return problem

    def __getnewargs__(self) -> tuple[str, str]:  # verdicts cross processes pickled (multi-process training)
        return str(self), self.test


@dataclass(frozen=True)
class CompletionStatistics:
    """What the check knows of one completion: its typicality (``mean``, nats per token) and the lowest mean
    typicality of any ``span_tokens`` consecutive tokens of it (``span``: the worst short stretch)."""

    mean: float
    span: float


def token_typicality(per_token_logps: torch.Tensor, entropies: torch.Tensor) -> torch.Tensor:
    """Each token's typicality: its log-probability plus the policy's entropy at its position, in nats (float32,
    detached; same shape as the arguments)."""
    return per_token_logps.detach().float() + entropies.detach().float()


def floor_mask(typicality: Sequence[float], floor: float, before: int = 0, after: int = 0) -> list[int]:
    """Per token: 0 if its typicality lies below ``floor``, or if it lies within ``before`` tokens before or ``after``
    tokens after such a token; else 1. The neighbours matter because a payload's rare token is one of several: once
    " zeb" is written, "racoin" and " is the future" are likely, and "Remember to buy" before it is ordinary text."""
    mask = [1] * len(typicality)
    for k, value in enumerate(typicality):
        if value < floor:
            mask[max(0, k - before) : k + after + 1] = [0] * (min(len(mask), k + after + 1) - max(0, k - before))
    return mask


def typicality_scores(
    per_token_logps: torch.Tensor, entropies: torch.Tensor, completion_mask: torch.Tensor
) -> list[float]:
    """Per row: the mean over its completion tokens of (log-probability + the policy's entropy there), in nats; 0 for
    an empty completion. Every argument is (rows, tokens)."""
    mask = completion_mask.float()
    excess = token_typicality(per_token_logps, entropies) * mask
    counts = mask.sum(dim=1)
    return [(e / c).item() if c > 0 else 0.0 for e, c in zip(excess.sum(dim=1), counts, strict=True)]


def worst_span(excess: torch.Tensor, width: int) -> float:
    """The lowest mean of ``width`` consecutive values of the 1-D ``excess``; its mean if it is shorter; 0 if empty."""
    if excess.numel() == 0:
        return 0.0
    if excess.numel() <= width:
        return excess.mean().item()
    return excess.unfold(0, width, 1).mean(dim=1).min().item()


def completion_statistics(
    per_token_logps: torch.Tensor, entropies: torch.Tensor, completion_mask: torch.Tensor, span_tokens: int
) -> list[CompletionStatistics]:
    """Per row: :class:`CompletionStatistics` of its completion tokens (the mask's ones; a completion's tokens are
    contiguous). Every tensor is (rows, tokens)."""
    excess = token_typicality(per_token_logps, entropies)
    means = typicality_scores(per_token_logps, entropies, completion_mask)
    return [
        CompletionStatistics(mean=mean, span=worst_span(row[mask], span_tokens))
        for mean, row, mask in zip(means, excess.cpu(), completion_mask.bool().cpu(), strict=True)
    ]


class PlausibilityCheck:
    """Keeps the statistics of the node's latest own completions and judges received ones against them.

    A received completion is implausible if its typicality lies more than ``margin`` below the reference (the 5th
    percentile of the own completions' typicality), or if its worst span of ``span_tokens`` consecutive tokens lies
    more than ``span_margin`` below the 5th percentile of the own completions' worst spans. The second test sees a
    short payload spliced into text the policy writes itself, which the mean over the whole completion hides.

    Args:
        margin: nats per token below the typicality reference past which a completion is implausible.
        window: how many own completions the reference remembers.
        min_reference: own completions needed before anything is judged (:meth:`threshold` is None until then:
            nothing says yet what this policy writes).
        span_margin: nats per token below the worst-span reference past which a completion is implausible; None
            leaves the worst span unjudged (the check of the mean alone).
        span_tokens: how many consecutive tokens a span holds.
    """

    def __init__(
        self,
        margin: float = 0.5,
        window: int = 64,
        min_reference: int = 4,
        span_margin: float | None = None,
        span_tokens: int = 3,
    ):
        if margin < 0:
            raise ValueError(f"plausibility margin must be >= 0 nats, got {margin}")
        if span_margin is not None and span_margin < 0:
            raise ValueError(f"plausibility span margin must be >= 0 nats or None, got {span_margin}")
        if span_tokens < 1:
            raise ValueError(f"a span holds at least 1 token, got span_tokens={span_tokens}")
        if not 1 <= min_reference <= window:
            raise ValueError(f"min_reference must be in [1, window={window}], got {min_reference}")
        self.margin = margin
        self.span_margin = span_margin
        self.span_tokens = span_tokens
        self.min_reference = min_reference
        self._own: deque[CompletionStatistics] = deque(maxlen=window)

    def statistics(
        self, per_token_logps: torch.Tensor, entropies: torch.Tensor, completion_mask: torch.Tensor
    ) -> list[CompletionStatistics]:
        """:func:`completion_statistics` of each row, with this check's span width: what :meth:`add_own` and
        :meth:`group_problem` take. Every tensor is (rows, tokens), as TRL's per-token log-probs and entropies."""
        return completion_statistics(per_token_logps, entropies, completion_mask, self.span_tokens)

    def add_own(self, scores: Sequence[CompletionStatistics | float]) -> None:
        """Remember the statistics (or bare typicality scores) of completions this node generated itself."""
        self._own.extend(_as_statistics(s) for s in scores)

    def threshold(self) -> float | None:
        """The lowest typicality a received completion may have, or None while the reference is too small."""
        if len(self._own) < self.min_reference:
            return None
        return _reference([s.mean for s in self._own]) - self.margin

    def span_threshold(self) -> float | None:
        """The lowest worst-span value a received completion may have; None while the reference is too small or
        when spans are not judged."""
        spans = [s.span for s in self._own if not math.isnan(s.span)]  # bare scores carry no span
        if self.span_margin is None or len(spans) < self.min_reference:
            return None
        return _reference(spans) - self.span_margin

    def group_problem(self, scores: Sequence[CompletionStatistics | float]) -> Implausible | None:
        """Why a received group with these completion statistics (or bare typicality scores, which the span test
        cannot judge) may not be trained on, or None if every one passes."""
        threshold, span_threshold = self.threshold(), self.span_threshold()
        if threshold is None:
            return Implausible(
                f"no reference yet ({len(self._own)} of {self.min_reference} own completions scored)", "reference"
            )
        for index, score in enumerate(scores):
            stats = _as_statistics(score)
            if stats.mean < threshold:
                return Implausible(
                    f"completion {index} scores {stats.mean:.2f} < {threshold:.2f} nats per token", "mean"
                )
            if span_threshold is not None and stats.span < span_threshold:  # a bare score's NaN span passes
                return Implausible(
                    f"completion {index}: its worst {self.span_tokens} consecutive tokens score {stats.span:.2f} < "
                    f"{span_threshold:.2f} nats per token",
                    "span",
                )
        return None


def _as_statistics(score: CompletionStatistics | float) -> CompletionStatistics:
    return score if isinstance(score, CompletionStatistics) else CompletionStatistics(mean=float(score), span=math.nan)


def _reference(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[int(REFERENCE_QUANTILE * (len(ordered) - 1))]
