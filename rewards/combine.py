"""Combining reward functions into one weighted reward function with a name TRL can log."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["RewardFunc", "combine_rewards", "weighted"]

RewardFunc = Callable[..., list[float | None]]


def combine_rewards(pairs: Sequence[tuple[RewardFunc, float]], name: str | None = None) -> RewardFunc:
    """One reward function returning the weighted sum of several: ``sum(weight * fn(...))`` per completion.

    A component that returns None for a completion is left out of that completion's sum; when every
    component returns None the result is None (TRL's "not applicable"). The combined function's
    ``__name__`` (used by TRL in its ``rewards/<name>`` metrics) is ``name`` or built from the parts,
    e.g. ``"1*reasoning_gym_reward+0.5*format_reward"``.

    Passing the functions separately to ``GRPOTrainer(reward_funcs=[...])`` with
    ``GRPOConfig.reward_weights`` gives the same total and logs each part; combine when one callable is
    needed (e.g. a node's single reward slot).
    """
    pairs = [(fn, float(weight)) for fn, weight in pairs]
    if not pairs:
        raise ValueError("combine_rewards needs at least one (reward_function, weight) pair")
    for fn, _ in pairs:
        if not callable(fn):
            raise TypeError(f"{fn!r} is not callable")

    def combined(prompts: Sequence[Any], completions: Sequence[Any], **columns: Any) -> list[float | None]:
        totals: list[float | None] = [None] * len(completions)
        for fn, weight in pairs:
            values = fn(prompts=prompts, completions=completions, **columns)
            if len(values) != len(completions):
                raise ValueError(f"{_name(fn)} returned {len(values)} rewards for {len(completions)} completions")
            for i, value in enumerate(values):
                if value is not None:
                    totals[i] = (totals[i] or 0.0) + weight * float(value)
        return totals

    combined.__name__ = name or "+".join(f"{weight:g}*{_name(fn)}" for fn, weight in pairs)
    combined.__qualname__ = combined.__name__
    return combined


def weighted(*pairs: tuple[RewardFunc, float], name: str | None = None) -> RewardFunc:
    """Shorthand for :func:`combine_rewards`: ``weighted((reasoning_gym_reward, 1.0), (format_reward, 1.0))``."""
    return combine_rewards(pairs, name=name)


def _name(fn: Any) -> str:
    return getattr(fn, "__name__", None) or type(fn).__name__
