"""Question rows: the columns every question source yields, and the error a received question is dropped with.

A row holds the chat ``prompt`` and the columns the reward functions in :mod:`rewards` read: ``answer``, ``task``
(the task's name, as in :attr:`swarm.records.Provenance.task`), ``entry`` (a reasoning-gym entry as JSON, or
``""``) and ``provenance`` (JSON of :func:`swarm.records.provenance_to_wire`), plus a source's own columns. The
task sources (:mod:`sapo.sources`) build their rows here, re-derive these columns for received groups and drop the
others with :class:`GroupDropped`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from swarm.records import Provenance, provenance_to_wire

__all__ = [
    "DEFAULT_SYSTEM_PROMPT",
    "DETAIL_MAX_CHARS",
    "GROUP_DROP_REASONS",
    "REWARD_COLUMNS",
    "GroupDropped",
    "cut_detail",
    "provenance_to_json",
    "question_messages",
    "question_of",
    "question_row",
    "questions_of_rows",
    "reward_columns",
    "system_messages",
]

DEFAULT_SYSTEM_PROMPT = (
    "You are a helpful assistant. Think briefly, then give only the final answer between <answer> and "
    "</answer>, for example: <answer>42</answer>."
)
"""System message of every generated prompt; the reward functions also accept answers in other formats."""

REWARD_COLUMNS = ("answer", "task", "entry", "provenance")
"""The columns of a row besides ``prompt``: what the reward functions read, and what verification re-derives."""

GROUP_DROP_REASONS = (
    "unknown_source",  # no source this peer holds answers for the group's provenance (policy "verify")
    "item_not_held",  # the source is held here, but not the item (a dataset split or filter without it)
    "version_skew",  # the item's source has another version here
    "unknown_task",  # task unknown to reasoning-gym, or a config it rejects
    "question_mismatch",  # the group's question is not the one its provenance regenerates
    "bad_provenance",  # provenance lacks what its source needs (seed, index) or is malformed
    "untrusted_source",  # a non-procedural source under the "drop" policy
    "index_out_of_range",  # the index is negative or beyond the local copy
    "no_answer",  # "trust" policy, but the sender attached no answer
    "regeneration_limit",  # regenerating a foreign reasoning-gym config took too long or too much memory
    "regeneration_budget",  # the round's time for regenerating foreign reasoning-gym configs was spent
    "rederivation_cost",  # the sender's groups cost this peer too much re-derivation time lately (a rest, no verdict)
    "untrusted_prompt",  # "trust" policy, but the prompt is more than one user message (a system or assistant turn)
    "held_out",  # the question is one of this peer's held-out evaluation questions (never trained on)
    "source_error",  # the source holding the item raised while re-deriving it (logged; counted as a source error)
    "unsupported_task",  # the item is held, but its task cannot be scored offline (a container, tools, turns)
)


DETAIL_MAX_CHARS = 500
"""The longest ``detail`` a :class:`GroupDropped` keeps (longer ones are cut, saying how long they were): a detail may
quote what a sender sent (a config of up to 3 MiB was quoted whole into the log)."""


def cut_detail(text: str) -> str:
    """``text`` as a drop's detail: at most :data:`DETAIL_MAX_CHARS`, a longer one cut saying how long it was."""
    if len(text) <= DETAIL_MAX_CHARS:
        return text
    return f"{text[: DETAIL_MAX_CHARS - 40]}... ({len(text):,} characters in all)"


class GroupDropped(Exception):
    """A received group whose ground truth cannot be re-derived; ``reason`` is one of :data:`GROUP_DROP_REASONS`,
    ``detail`` what happened, cut to :data:`DETAIL_MAX_CHARS`."""

    def __init__(self, reason: str, detail: str):
        if reason not in GROUP_DROP_REASONS:
            raise ValueError(f"unknown drop reason {reason!r}; expected one of {GROUP_DROP_REASONS}")
        detail = cut_detail(detail)
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        # pickled whole (the main process's verdicts travel to the others): ``args`` holds the message only
        return GroupDropped, (self.reason, self.detail)


def provenance_to_json(provenance: Provenance) -> str:
    """The ``provenance`` column of a row: the wire form of ``provenance`` as canonical JSON."""
    return json.dumps(provenance_to_wire(provenance), sort_keys=True)


def question_of(prompt: Sequence[Mapping[str, str]]) -> str:
    """The question of a chat prompt: its last user message, stripped of surrounding whitespace ("" if none)."""
    users = [m["content"] for m in prompt if m.get("role") == "user"]
    return users[-1].strip() if users else ""


def questions_of_rows(rows: Any) -> frozenset[str]:
    """The questions of rows with a ``prompt`` column (chat messages: :func:`question_of`; text: stripped): a
    `datasets.Dataset` or a list of dicts, such as a trainer's evaluation set; a `dict` of them (TRL's named evaluation
    sets) gives all of theirs. Empty for None, rows without prompts, and a streamed (iterable) dataset, which is not
    read ahead."""
    if isinstance(rows, Mapping):
        return frozenset().union(*(questions_of_rows(part) for part in rows.values()))
    if isinstance(rows, list | tuple):
        prompts = [row.get("prompt") for row in rows if isinstance(row, Mapping)]
    elif "prompt" in (getattr(rows, "column_names", None) or ()) and hasattr(rows, "__len__"):
        prompts = rows["prompt"]
    else:
        return frozenset()
    questions = (question_of(p) if isinstance(p, list) else p.strip() for p in prompts if isinstance(p, list | str))
    return frozenset(q for q in questions if q)


def question_messages(question: str, system_prompt: str | None) -> list[dict[str, str]]:
    """A question as chat messages: the system prompt (if any), then the question as the user's message."""
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return [*messages, {"role": "user", "content": question}]


def reward_columns(answer: str, provenance: Provenance, entry: str = "") -> dict[str, str]:
    """The :data:`REWARD_COLUMNS` of a question with ``answer`` from ``provenance`` (``task`` is the provenance's
    task): what a row holds besides its prompt, and what verification returns for a received group it regenerated
    or trusts."""
    return {"answer": answer, "task": provenance.task, "entry": entry, "provenance": provenance_to_json(provenance)}


def question_row(
    question: str, answer: str, provenance: Provenance, entry: str = "", system_prompt: str | None = None
) -> dict[str, Any]:
    """One row: the chat ``prompt`` around ``question`` and the :data:`REWARD_COLUMNS` (:func:`reward_columns`)."""
    return {"prompt": question_messages(question, system_prompt), **reward_columns(answer, provenance, entry)}


def system_messages(train_dataset: Any) -> list[dict[str, str]]:
    """The system messages of a trainer's own prompts (its first row's), or none for a plain-text or empty dataset
    (or one that is not a `datasets.Dataset`)."""
    from datasets import Dataset

    if not isinstance(train_dataset, Dataset) or len(train_dataset) == 0:
        return []
    prompt = train_dataset[0].get("prompt")
    return [dict(m) for m in prompt if m.get("role") == "system"] if isinstance(prompt, list) else []
