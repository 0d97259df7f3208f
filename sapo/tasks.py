"""Question sources with provenance: reasoning-gym tasks (training and held-out), local JSON Lines datasets.

Every row a source yields carries the columns the reward functions in :mod:`rewards` read (``answer``,
``task``, ``entry``, ``provenance``) besides the chat ``prompt``. Received groups are checked against these
sources by :mod:`sapo.verification`.
"""

from __future__ import annotations

import difflib
import json
import random
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from datasets import Dataset

from sapo.regeneration import (
    cached_generator,
    is_scalar,
    reasoning_gym_entry,
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

DEFAULT_SYSTEM_PROMPT = (
    "You are a helpful assistant. Think briefly, then give only the final answer between <answer> and "
    "</answer>, for example: <answer>42</answer>."
)
"""System message of every generated prompt; the reward functions also accept answers in other formats."""

REASONING_GYM_SOURCE = "reasoning_gym"
DATASET_SOURCE = "dataset"

_RESERVED_CONFIG_KEYS = ("seed", "size")


@dataclass
class TaskSpec:
    """One reasoning-gym task in a question mix.

    Parameters:
        name (`str`):
            reasoning-gym dataset name, e.g. `"basic_arithmetic"` (see `reasoning_gym.factory.DATASETS`).
        config (`dict[str, Any]`, defaults to `{}`):
            Keyword arguments of the dataset's config class (e.g. `{"max_terms": 2}`); `seed` and `size`
            are set by the dataset builder and are not allowed here. Values must be JSON-like scalars or
            flat lists of them, since the config travels in every shared group's provenance; tuples are
            stored as lists.
        weight (`float`, defaults to `1.0`):
            Relative share of this task's questions in the mix.
    """

    name: str
    config: dict[str, Any] = field(default_factory=dict)
    weight: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"TaskSpec.name must be a non-empty string, got {self.name!r}")
        if not (isinstance(self.weight, int | float) and self.weight > 0):
            raise ValueError(f"TaskSpec {self.name!r}: weight must be a positive number, got {self.weight!r}")
        self.config = _normalize_config(self.name, self.config)

    @property
    def config_key(self) -> str:
        """The config as canonical JSON (a hashable identity for caches)."""
        return _config_key(self.config)


def _normalize_config(name: str, config: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in dict(config).items():
        if key in _RESERVED_CONFIG_KEYS:
            raise ValueError(f"TaskSpec {name!r}: config key {key!r} is set by the dataset builder, remove it")
        if isinstance(value, tuple | list):
            if not all(is_scalar(v) for v in value):
                raise ValueError(f"TaskSpec {name!r}: config[{key!r}] must be a flat list of scalars")
            value = list(value)
        elif not is_scalar(value):
            raise ValueError(
                f"TaskSpec {name!r}: config[{key!r}]={value!r} is not a JSON scalar or flat list; "
                "it must travel in provenance"
            )
        out[str(key)] = value
    return out


def _config_key(config: Mapping[str, Any]) -> str:
    return json.dumps(config, sort_keys=True)


_EASY_BASIC_ARITHMETIC = {
    "min_terms": 2,
    "max_terms": 2,
    "min_digits": 1,
    "max_digits": 1,
    "operators": ["+", "-"],
    "allow_parentheses": False,
    "allow_negation": False,
}
_EASY_BASE_CONVERSION = {"min_base": 2, "max_base": 10, "min_value": 0, "max_value": 16}
_EASY_FRACTIONS = {"min_value": 1, "max_value": 20, "min_factor": 2, "max_factor": 5, "styles": ["plain"]}
_EASY_CALENDAR = {"tasks": ["weekday_of_date", "is_leap_year"]}

PAPER_TASKS: tuple[TaskSpec, ...] = (
    TaskSpec("base_conversion", _EASY_BASE_CONVERSION),
    TaskSpec("basic_arithmetic", _EASY_BASIC_ARITHMETIC),
    TaskSpec("arc_1d", {"min_size": 10, "max_size": 10}),
    TaskSpec("bf", {"difficulty": 1}),
    TaskSpec(
        "propositional_logic",
        {"min_vars": 2, "max_vars": 2, "min_statements": 2, "max_statements": 2, "max_complexity": 1},
    ),
    TaskSpec("fraction_simplification", _EASY_FRACTIONS),
    TaskSpec("decimal_arithmetic", {"max_num_decimal_places": 1, "min_num_decimal_places": 1, "max_terms": 2}),
    TaskSpec("calendar_arithmetic", _EASY_CALENDAR),
    TaskSpec("binary_matrix", {"min_n": 2, "max_n": 3, "p_zero": 0.5}),
)
"""The nine reasoning-gym tasks of the SAPO paper, at the easiest settings their configs allow; for models
larger than the default (most score zero with a 135M model, see :data:`DEFAULT_TASKS`)."""

# Measured with SmolLM2-135M-Instruct (the embedded default), DEFAULT_SYSTEM_PROMPT, sampling at
# temperature 1.0, 128-160 new tokens, 4-6 questions x 4 completions per task, scored by
# rewards.reasoning_gym_reward ("full" = completions scoring 1.0):
#   basic_arithmetic        6/24 full, mean 0.25      base_conversion      2/24 full, mean 0.10
#   fraction_simplification 1/16 full, mean 0.10      calendar_arithmetic  1/16 full, mean 0.07
#   propositional_logic     0/16 full, mean 0.006     decimal_arithmetic   0/16, mean 0
#   bf, binary_matrix, arc_1d: 0/16, mean 0
# The default keeps the tasks with correct answers: GRPO learns only from groups whose rewards differ.
DEFAULT_TASKS: tuple[TaskSpec, ...] = (
    TaskSpec("basic_arithmetic", _EASY_BASIC_ARITHMETIC),
    TaskSpec("base_conversion", _EASY_BASE_CONVERSION),
    TaskSpec("fraction_simplification", _EASY_FRACTIONS),
    TaskSpec("calendar_arithmetic", _EASY_CALENDAR),
)
"""The default question mix: the SAPO paper's reasoning-gym tasks, at easy settings, on which
SmolLM2-135M-Instruct gets some answers right (measurement in the comment above)."""


def _task_names() -> list[str]:
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


def validate_task_names(tasks: Sequence[TaskSpec | str]) -> None:
    """Raise ``ValueError`` naming the first unknown reasoning-gym task and its close matches."""
    known = _task_names()
    for task in tasks:
        name = task.name if isinstance(task, TaskSpec) else task
        if name not in known:
            close = difflib.get_close_matches(name, known, n=5, cutoff=0.5)
            hint = f"close matches: {', '.join(close)}" if close else "no close match"
            raise ValueError(
                f"unknown reasoning-gym task {name!r} ({hint}); reasoning-gym has {len(known)} tasks, "
                "listed in reasoning_gym.factory.DATASETS"
            )


def _task_seed(seed: int, task: TaskSpec) -> int:
    # Derived from the task's identity, not its position, so adding a task leaves the others' questions alone.
    return zlib.crc32(f"{seed}:{task.name}:{task.config_key}".encode()) & 0x7FFFFFFF


def provenance_to_json(provenance: Provenance) -> str:
    """The wire form of a provenance (the keys of ``swarm.records``), as a JSON string column."""
    return json.dumps(
        {
            "source": provenance.source,
            "dataset": provenance.dataset,
            "config": dict(provenance.config),
            "seed": provenance.seed,
            "index": provenance.index,
        },
        sort_keys=True,
    )


def _messages(question: str, system_prompt: str | None) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return [*messages, {"role": "user", "content": question}]


def _make_generator(name: str, config: Mapping[str, Any], seed: int) -> Any:
    """The reasoning-gym dataset for (name, config, seed), cached; ValueError when reasoning-gym rejects it."""
    try:
        return cached_generator(name, _config_key(config), seed)
    except ValueError:
        raise
    except (TypeError, AssertionError, KeyError) as e:
        raise ValueError(f"reasoning-gym rejected {name!r} with config {dict(config)}: {e}") from e


def _row(entry: Mapping[str, Any], provenance: Provenance, system_prompt: str | None) -> dict[str, Any]:
    safe = reasoning_gym_entry(entry)
    answer = safe["answer"]
    if answer is None:
        # Some tasks (propositional_logic) have no single oracle answer: their scorer checks the metadata,
        # and the column holds one valid answer when the generator offers one.
        answer = safe["metadata"].get("example_answer") or ""
    return {
        "prompt": _messages(safe["question"], system_prompt),
        "answer": str(answer),
        "task": provenance.dataset,
        "entry": json.dumps(safe, sort_keys=True),
        "provenance": provenance_to_json(provenance),
    }


MAX_TRAINING_QUESTIONS = 2**30
"""Most questions :func:`build_reasoning_gym_dataset` draws per call (keeps training seeds below the held-out band)."""

HELD_OUT_SEED_BASE = 3 * 2**30
"""reasoning-gym generates entry ``i`` of a dataset with seed ``s`` from ``Random(s + i)``. Training draws task seeds
below ``2**31`` and indices below :data:`MAX_TRAINING_QUESTIONS`, so its generator seeds stay below ``3 * 2**30``;
held-out questions use task seeds from here up, so no held-out question shares a generator seed with training."""

MAX_HELD_OUT_QUESTIONS = 2**20
_HELD_OUT_SEED_SPAN = 2**28  # held-out seeds + indices stay below 2**32 (numpy's seed limit)


def build_reasoning_gym_dataset(
    tasks: Sequence[TaskSpec | str] = DEFAULT_TASKS,
    size: int = 1000,
    seed: int = 0,
    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
) -> Dataset:
    """A ``datasets.Dataset`` of ``size`` reasoning-gym questions mixed by task weight.

    Columns: ``prompt`` (system + user chat messages), ``answer`` (the oracle answer, or an example answer for tasks
    without a single one), ``task`` (dataset name), ``entry`` (the reasoning-gym entry as JSON) and ``provenance``
    (JSON of :class:`swarm.records.Provenance` with source ``"reasoning_gym"``, the task's config, the
    task's own seed and the entry's index). Each task draws entries 0, 1, 2, ... from its own generator;
    the task of each row is drawn by weight. The same arguments give the same rows.
    """
    specs = _specs(tasks)
    if not 0 < size <= MAX_TRAINING_QUESTIONS:
        raise ValueError(f"size must be between 1 and {MAX_TRAINING_QUESTIONS}, got {size}")
    picks = random.Random(seed).choices(range(len(specs)), weights=[t.weight for t in specs], k=size)
    return _reasoning_gym_rows(specs, picks, [_task_seed(seed, task) for task in specs], system_prompt)


def build_held_out_dataset(
    tasks: Sequence[TaskSpec | str] = DEFAULT_TASKS,
    size: int = 32,
    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
) -> Dataset:
    """``size`` held-out reasoning-gym questions of ``tasks``: questions :func:`build_reasoning_gym_dataset`
    never draws, whatever its seed and size, for measuring what a policy learned.

    The tasks, sorted by name and config, take turns (question ``k`` belongs to the ``k % len(tasks)``-th; weights are
    ignored), so every task has its share and the per-task figures have known sizes. The set depends only on the
    set of tasks, their configs and ``size`` (a larger set extends a smaller one), not on their order: every peer
    of a swarm, and ``sapo-node eval``, measure on the same questions. Disjointness is by generator seed (see
    :data:`HELD_OUT_SEED_BASE`); a task whose question space is small (two one-digit numbers) still repeats
    question *texts* that training also draws.
    Columns are those of :func:`build_reasoning_gym_dataset`.
    """
    specs = sorted(_specs(tasks), key=lambda task: (task.name, task.config_key))
    if not 0 < size <= MAX_HELD_OUT_QUESTIONS:
        raise ValueError(f"held-out size must be between 1 and {MAX_HELD_OUT_QUESTIONS}, got {size}")
    picks = [k % len(specs) for k in range(size)]
    return _reasoning_gym_rows(specs, picks, [held_out_seed(task) for task in specs], system_prompt)


def held_out_seed(task: TaskSpec) -> int:
    """The generator seed of ``task``'s held-out questions (in the band training never reaches)."""
    return HELD_OUT_SEED_BASE + zlib.crc32(f"held-out:{task.name}:{task.config_key}".encode()) % _HELD_OUT_SEED_SPAN


def reasoning_gym_tasks_of(dataset: Dataset) -> list[TaskSpec]:
    """The distinct reasoning-gym tasks (name and config) a dataset's ``provenance`` column names, in order of first
    appearance; empty for a dataset of other sources or without that column."""
    if "provenance" not in dataset.column_names:
        return []
    tasks: dict[tuple[str, str], TaskSpec] = {}
    for raw in dataset["provenance"]:
        wire = json.loads(raw) if isinstance(raw, str) else raw
        if wire.get("source") == REASONING_GYM_SOURCE:
            task = TaskSpec(wire["dataset"], wire["config"])
            tasks.setdefault((task.name, task.config_key), task)
    return list(tasks.values())


def _specs(tasks: Sequence[TaskSpec | str]) -> list[TaskSpec]:
    specs = [t if isinstance(t, TaskSpec) else TaskSpec(t) for t in tasks]
    if not specs:
        raise ValueError("a question set needs at least one task")
    validate_task_names(specs)
    return specs


def _reasoning_gym_rows(
    specs: list[TaskSpec], picks: Sequence[int], task_seeds: list[int], system_prompt: str | None
) -> Dataset:
    """Rows for the task sequence ``picks``: each task draws entries 0, 1, 2, ... of its generator."""
    next_index = [0] * len(specs)
    rows = []
    for k in picks:
        task, index = specs[k], next_index[k]
        next_index[k] += 1
        generator = _make_generator(task.name, task.config, task_seeds[k])
        provenance = Provenance(REASONING_GYM_SOURCE, task.name, dict(task.config), task_seeds[k], index)
        rows.append(_row(generator[index], provenance, system_prompt))
    return Dataset.from_list(rows)


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
    provenance = Provenance(DATASET_SOURCE, name, {}, None, index)
    return {
        "prompt": _messages(question, system_prompt),
        "answer": answer if isinstance(answer, str) else json.dumps(answer),
        "task": name,
        "entry": "",
        "provenance": provenance_to_json(provenance),
    }
