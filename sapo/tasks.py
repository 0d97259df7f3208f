"""Question sources: reasoning-gym tasks (from :mod:`sapo.reasoning_gym`, re-exported here) and local datasets.

Every row a source yields carries the chat ``prompt`` and the columns the reward functions in :mod:`rewards` read
(``answer``, ``task``, ``entry``, ``provenance``; see :mod:`sapo.questions`). Received groups are checked against
their sources (:mod:`sapo.sources`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from datasets import Dataset

from sapo.questions import DEFAULT_SYSTEM_PROMPT, provenance_to_json
from sapo.reasoning_gym import (
    DEFAULT_TASKS,
    HELD_OUT_SEED_BASE,
    PAPER_TASKS,
    TaskSpec,
    build_held_out_dataset,
    build_reasoning_gym_dataset,
    held_out_seed,
    reasoning_gym_entry,
    reasoning_gym_tasks_of,
    validate_task_names,
)
from sapo.sources.dataset import DatasetSource

__all__ = [
    "DEFAULT_SYSTEM_PROMPT",
    "DEFAULT_TASKS",
    "PAPER_TASKS",
    "HELD_OUT_SEED_BASE",
    "TaskSpec",
    "build_held_out_dataset",
    "build_reasoning_gym_dataset",
    "held_out_seed",
    "load_jsonl_dataset",
    "provenance_to_json",
    "questions_from_dataset",
    "reasoning_gym_tasks_of",
    "reasoning_gym_entry",
    "validate_task_names",
]


def load_jsonl_dataset(
    path: str | Path,
    question_field: str = "question",
    answer_field: str = "answer",
    name: str | None = None,
    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
) -> Dataset:
    """The training rows of a local JSON Lines file of questions (one JSON object per line): those of a
    :class:`sapo.sources.DatasetSource` named ``name`` (default: the file stem), items keyed by content; every other
    field of a line is a reward column."""
    path = Path(path)
    return DatasetSource(path, name or path.stem, question_field, answer_field, system_prompt=system_prompt).rows()


def questions_from_dataset(
    dataset: Any,
    name: str,
    question_field: str = "question",
    answer_field: str = "answer",
    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
) -> Dataset:
    """The training rows of any ``datasets.Dataset`` of questions and answers (e.g. ``load_dataset("json", ...)``):
    those of a :class:`sapo.sources.DatasetSource` named ``name``, items keyed by content, so a receiver verifies
    them in any row order, split or filter of the same data."""
    return DatasetSource(dataset, name, question_field, answer_field, system_prompt=system_prompt).rows()
