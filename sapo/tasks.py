"""Question sources: reasoning-gym tasks (from :mod:`sapo.reasoning_gym`, re-exported here) and local datasets.

Every row a source yields carries the chat ``prompt`` and the columns the reward functions in :mod:`rewards` read
(``answer``, ``task``, ``entry``, ``provenance``; see :mod:`sapo.questions`). Received groups are checked against
these sources by :mod:`sapo.verification`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from datasets import Dataset

from sapo.questions import DEFAULT_SYSTEM_PROMPT, provenance_to_json, question_row
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
from swarm.records import Provenance

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

DATASET_SOURCE = "dataset"
"""The provenance source of questions from a named local dataset."""


def load_jsonl_dataset(
    path: str | Path,
    question_field: str = "question",
    answer_field: str = "answer",
    name: str | None = None,
    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
) -> Dataset:
    """A dataset of questions from a local JSON Lines file (one JSON object per line).

    Rows have the same columns as :func:`build_reasoning_gym_dataset` (``entry`` is ``""``, so
    :func:`rewards.reasoning_gym_reward` skips them; score them with :func:`rewards.math_reward`), with
    provenance source ``"dataset"``, dataset ``name`` (default: the file stem) and index = row number.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"question file not found: {path} (expected a JSON Lines file)")
    name = name or path.stem
    rows = []
    with path.open(encoding="utf-8") as fh:
        for line_no, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{line_no}: not valid JSON ({e.msg})") from None
            if not isinstance(record, dict):
                raise ValueError(f"{path}:{line_no}: expected a JSON object, got {type(record).__name__}")
            for wanted in (question_field, answer_field):
                if wanted not in record:
                    raise KeyError(
                        f"{path}:{line_no}: field {wanted!r} missing; fields present: {sorted(record)} "
                        f"(choose them with question_field= / answer_field=)"
                    )
            question, answer = record[question_field], record[answer_field]
            if not isinstance(question, str) or not question.strip():
                raise ValueError(f"{path}:{line_no}: field {question_field!r} must be a non-empty string")
            rows.append(_question_row(question, answer, name, len(rows), system_prompt))
    if not rows:
        raise ValueError(f"{path}: no questions (the file is empty)")
    return Dataset.from_list(rows)


def questions_from_dataset(
    dataset: Dataset,
    name: str,
    question_field: str = "question",
    answer_field: str = "answer",
    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
) -> Dataset:
    """SAPO rows from any ``datasets.Dataset`` of questions and answers (e.g. ``load_dataset("json", ...)``).

    The rows are those of :func:`load_jsonl_dataset`: provenance source ``"dataset"``, dataset ``name``, index =
    row number. A receiver checks a shared group against its own copy of the same rows (same ``name``, same
    order), so every peer that shares questions this way must build them from the same data.
    """
    missing = [f for f in (question_field, answer_field) if f not in dataset.column_names]
    if missing:
        raise KeyError(
            f"dataset {name!r} has no field(s) {missing}; fields present: {dataset.column_names} "
            "(choose them with question_field= / answer_field=)"
        )
    rows = []
    for index, record in enumerate(dataset):
        question = record[question_field]
        if not isinstance(question, str) or not question.strip():
            raise ValueError(f"dataset {name!r}, row {index}: field {question_field!r} must be a non-empty string")
        rows.append(_question_row(question, record[answer_field], name, index, system_prompt))
    if not rows:
        raise ValueError(f"dataset {name!r} has no questions")
    return Dataset.from_list(rows)


def _question_row(question: str, answer: Any, name: str, index: int, system_prompt: str | None) -> dict[str, Any]:
    answer = answer if isinstance(answer, str) else json.dumps(answer)
    return question_row(question, answer, Provenance(DATASET_SOURCE, name, {}, None, index), "", system_prompt)
