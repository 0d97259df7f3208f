"""Completion hygiene: limits a received completion must meet before its group may be chosen (length, character
classes, forbidden patterns, an optional user filter)."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

CompletionFilter = Callable[[str], "str | None"]
"""A user check of one received completion: None if it may be trained on, else a short reason (it is counted)."""

_ALLOWED_CONTROL = {"\n", "\t", "\r"}


@dataclass(frozen=True)
class CompletionHygiene:
    """What every completion of a received group must meet; one failing completion drops the whole group.

    Parameters:
        max_chars (`int` or `None`): most characters of one completion; `None`: no limit (completions longer than
            the local `max_completion_length` in tokens are cut to it, and scored as cut).
        forbid_control_chars (`bool`): refuse control and format characters other than newline, tab and carriage
            return (zero-width and bidirectional marks hide text from a reader).
        max_non_ascii_fraction (`float` or `None`): most share of non-ASCII characters; `None`: no limit.
        forbidden_patterns (`list[str]`): regular expressions a completion must not match (e.g. `https?://`).
        extra_filter (`CompletionFilter` or `None`): a user check run last.
    """

    max_chars: int | None = None
    forbid_control_chars: bool = True
    max_non_ascii_fraction: float | None = None
    forbidden_patterns: Sequence[str] = ()
    extra_filter: CompletionFilter | None = None
    _compiled: tuple[re.Pattern, ...] = field(init=False, repr=False, compare=False, default=())

    def __post_init__(self) -> None:
        try:
            compiled = tuple(re.compile(p) for p in self.forbidden_patterns)
        except re.error as e:
            raise ValueError(f"completion hygiene: {e.pattern!r} is not a regular expression: {e}") from None
        object.__setattr__(self, "_compiled", compiled)
        if self.max_non_ascii_fraction is not None and not 0 <= self.max_non_ascii_fraction <= 1:
            raise ValueError(f"max_non_ascii_fraction must be in [0, 1], got {self.max_non_ascii_fraction}")

    def problem(self, text: str) -> str | None:
        """Why ``text`` may not be trained on (a short reason), or None if it passes every check."""
        if self.max_chars is not None and len(text) > self.max_chars:
            return f"{len(text)} characters > {self.max_chars}"
        if self.forbid_control_chars:
            for char in text:
                if char not in _ALLOWED_CONTROL and unicodedata.category(char) in ("Cc", "Cf"):
                    return f"control or format character U+{ord(char):04X}"
        if self.max_non_ascii_fraction is not None and text:
            share = sum(not char.isascii() for char in text) / len(text)
            if share > self.max_non_ascii_fraction:
                return f"{share:.0%} non-ASCII characters > {self.max_non_ascii_fraction:.0%}"
        for pattern in self._compiled:
            if pattern.search(text):
                return f"matches forbidden pattern {pattern.pattern!r}"
        if self.extra_filter is not None:
            return self.extra_filter(text)
        return None

    def group_problem(self, completions: Sequence[str]) -> str | None:
        """The first completion's problem, naming which one, or None if all pass."""
        for index, text in enumerate(completions):
            reason = self.problem(text)
            if reason is not None:
                return f"completion {index}: {reason}"
        return None
