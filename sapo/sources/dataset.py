"""Datasets as a task source: items keyed by a hash of their content, so shuffles, splits and filters still verify.

An item is a question and its reference answer (plus any columns the rewards read). Its key is a hash of the
question and the answer, so a receiver finds its own copy of the item whatever its row order, split or filter; the
rewards get the receiver's own columns for it, on swarm rows as on own rows.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sapo.questions import DEFAULT_SYSTEM_PROMPT, GroupDropped, question_messages, question_of, reward_columns
from sapo.sources.base import Rederived, TaskSource
from swarm.records import Provenance

logger = logging.getLogger(__name__)

__all__ = ["DATASET_SOURCE", "DatasetSource", "item_key", "load_folder", "load_records", "mix_rows"]

DATASET_SOURCE = "dataset"
"""The provenance source of dataset items."""

_RESERVED = ("prompt", "answer", "task", "entry", "provenance")


def item_key(question: str, answer: Any) -> str:
    """The durable key of a dataset item: a hash of its question (stripped) and its answer (as JSON unless a string),
    the same on every peer that holds the item, whatever the row's position."""
    answer_text = answer if isinstance(answer, str) else json.dumps(answer, sort_keys=True)
    digest = hashlib.sha256(json.dumps([question.strip(), answer_text]).encode()).hexdigest()
    return digest[:24]


def load_folder(path: str | Path) -> Any:
    """A local data folder as `datasets` reads it: a folder written by `save_to_disk` (a `Dataset` or a `DatasetDict`),
    else a folder of data files as `datasets.load_dataset(folder)` reads it (TRL's local form: `train.jsonl` and
    `test.jsonl` are the splits `train` and `test`); raises ValueError (one line) when it is neither."""
    path = Path(path)
    if (path / "dataset_dict.json").is_file() or (path / "state.json").is_file():
        from datasets import load_from_disk

        return load_from_disk(str(path))
    from datasets import load_dataset

    try:
        return load_dataset(str(path))
    except Exception as e:  # datasets raises several kinds here (no data files, unknown format...): all one answer
        raise ValueError(
            f"{path}: neither a folder written by datasets' save_to_disk nor a folder of .jsonl, .json, .parquet or "
            f".csv files (split by file name: train.jsonl, test.jsonl); datasets said: {type(e).__name__}: "
            f"{' '.join(str(e).split())[:200]}"
        ) from None


def load_records(path: str | Path) -> list[dict[str, Any]]:
    """The records of a local data file or folder: JSON Lines (`.jsonl`), JSON (`.json`, a list of objects), Parquet
    (`.parquet`), CSV (`.csv`), or a folder (:func:`load_folder`: written by `datasets.Dataset.save_to_disk`, or of
    data files; its `train` split)."""
    path = Path(path)
    if path.is_dir():
        data = load_folder(path)
        if hasattr(data, "keys") and not hasattr(data, "column_names"):  # a DatasetDict: its train split
            if "train" not in data:
                raise ValueError(f"{path}: a dataset folder with splits {list(data)} and no 'train' split")
            data = data["train"]
        return [dict(row) for row in data]
    if not path.is_file():
        raise FileNotFoundError(f"data file not found: {path} (a .jsonl, .json, .parquet or .csv file, or a folder "
                                "written by datasets' save_to_disk)")  # fmt: skip
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        records = []
        with path.open(encoding="utf-8") as f:
            for line_no, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{line_no}: not valid JSON ({e.msg})") from None
                if not isinstance(record, dict):
                    raise ValueError(f"{path}:{line_no}: expected a JSON object, got {type(record).__name__}")
                records.append(record)
        return records
    if suffix in (".json", ".parquet", ".csv"):
        from datasets import load_dataset

        kind = {".json": "json", ".parquet": "parquet", ".csv": "csv"}[suffix]
        return [dict(row) for row in load_dataset(kind, data_files=str(path), split="train")]
    raise ValueError(
        f"{path}: unknown data file type {suffix!r}; use .jsonl, .json, .parquet, .csv or a dataset folder"
    )


@dataclass(frozen=True)
class _Item:
    question: str
    answer: str
    columns: dict[str, Any]
    prompt: list[dict[str, str]]


class DatasetSource(TaskSource):
    """A dataset of questions and answers as a task source (see the module docstring).

    Args:
        data: the items: a `datasets.Dataset` or `IterableDataset` (a stream is read once, to index its items), a
            list of dicts, or a path to a local file or folder (:func:`load_records`).
        name: the dataset's name (the provenance's task; also the task of its per-task figures). Peers sharing a
            dataset use the same name; items still verify by content under another name.
        question_column: the column of the question: a string, or chat messages (the last user message is the
            question; the messages are the prompt of own rows). Default `"question"`.
        answer_column: the column of the reference answer (a string, or any JSON value), the rows' `answer`; a
            column of another name (TRL's `solution`) stays in the rows under its own name too. Default `"answer"`.
        columns: the other columns handed to the reward functions (looked up locally for swarm rows as for own
            rows); None (default): every other column.
        version: the dataset's version as its peers declare it (default `"1"`): an item a receiver does not hold
            from a dataset of the same name and another version is reported as a version skew.
        system_prompt: the system message of the prompts built around string questions (default: the node's).
        eval_fraction: the share of items held out for evaluation, chosen by item key (the same items on every
            peer; never in the training rows). Default 0.
        eval_data: held-out items given explicitly (a test split), in the same form as ``data``; they are never
            trained on either.
    """

    name = DATASET_SOURCE

    def __init__(
        self,
        data: Any,
        name: str,
        question_column: str = "question",
        answer_column: str = "answer",
        columns: Sequence[str] | None = None,
        version: str = "1",
        system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
        eval_fraction: float = 0.0,
        eval_data: Any = None,
    ):
        if not name or not isinstance(name, str):
            raise ValueError("a DatasetSource needs a name (the same on every peer that shares the dataset)")
        if not 0.0 <= eval_fraction < 1.0:
            raise ValueError(f"eval_fraction must be in [0, 1), got {eval_fraction}")
        self.dataset_name, self.version, self.eval_fraction = name, str(version), eval_fraction
        self.question_column, self.answer_column, self.system_prompt = question_column, answer_column, system_prompt
        self.extra_columns = None if columns is None else list(columns)
        self._items: dict[str, _Item] = {}
        self._order: list[str] = []  # training items in their given order
        self._held_out: list[str] = []
        self._given_held_out: set[str] = set()
        self._seen_columns: set[str] = set()
        self._by_question: dict[str, list[str]] = {}
        for key, item in self._read(data):
            self._add(key, item, held_out=self._held_out_by_key(key))
        self._check_columns()
        for key, item in self._read(eval_data) if eval_data is not None else ():
            self._add(key, item, held_out=True, given=True)
        self.conflicting_questions = self._set_conflicts_aside()
        if not self._order and not self._held_out:
            raise ValueError(f"dataset {name!r} has no items")

    @classmethod
    def from_rows(cls, rows: Any, name: str = "dataset", version: str = "1") -> DatasetSource:
        """A source over rows that already have a chat ``prompt`` and an ``answer`` (TRL's form): their prompts
        are kept for own training, their question is the last user message, and every other column but the
        reserved ones goes to the rewards."""
        return cls(rows, name=name, question_column="prompt", answer_column="answer", version=version)

    # ------------------------------------------------------------------------------------------------
    # items

    def _read(self, data: Any) -> Iterable[tuple[str, _Item]]:
        records = load_records(data) if isinstance(data, (str, Path)) else data
        for position, record in enumerate(records):
            record = dict(record)
            for wanted in (self.question_column, self.answer_column):
                if wanted not in record:
                    raise KeyError(
                        f"dataset {self.dataset_name!r}, item {position}: column {wanted!r} missing; columns present: "
                        f"{sorted(record)} (choose them with question_column= / answer_column=)"
                    )
            self._seen_columns.update(record)
            raw_question, answer = record[self.question_column], record[self.answer_column]
            if isinstance(raw_question, list):
                question, prompt = question_of(raw_question), [dict(m) for m in raw_question]
            elif isinstance(raw_question, str):
                question, prompt = raw_question.strip(), question_messages(raw_question, self.system_prompt)
            else:
                question, prompt = "", []
            if not question:
                raise ValueError(
                    f"dataset {self.dataset_name!r}, item {position}: column {self.question_column!r} must be a "
                    "non-empty string or chat messages with a user message"
                )
            answer_text = answer if isinstance(answer, str) else json.dumps(answer)
            wanted = self.extra_columns
            # An answer column of another name (TRL's `solution`) stays under its name too, for rewards that read it.
            extra_names = [c for c in record if c != self.question_column and c not in _RESERVED]
            columns = {c: record.get(c) for c in (wanted if wanted is not None else extra_names)}
            yield item_key(question, answer), _Item(question, answer_text, columns, prompt)

    def _check_columns(self) -> None:
        """Refuse reward columns that no item has (a typo would otherwise reach the rewards as None)."""
        missing = [c for c in self.extra_columns or () if c not in self._seen_columns]
        if missing:
            raise ValueError(
                f"dataset {self.dataset_name!r}: reward column(s) {', '.join(missing)} not in the data; columns "
                f"present: {', '.join(sorted(self._seen_columns))}"
            )

    def _add(self, key: str, item: _Item, held_out: bool, given: bool = False) -> None:
        if key in self._items:  # the same question and answer twice: one item
            return
        self._items[key] = item
        self._by_question.setdefault(item.question, []).append(key)
        (self._held_out if held_out else self._order).append(key)
        if given:
            self._given_held_out.add(key)

    def _set_conflicts_aside(self) -> int:
        """Warn of questions held with several answers (count and first examples), and keep their items out of the
        held-out set: a question trained on under one answer would be evaluated under another. Items held out by
        key train instead; items of ``eval_data`` are left out. Returns the number of such questions."""
        conflicts = {q: keys for q, keys in self._by_question.items() if len(keys) > 1}
        if not conflicts:
            return 0
        examples = "; ".join(
            f"{q[:60]!r}: {' / '.join(repr(a) for a in where_they_differ([self._items[k].answer for k in keys[:3]]))}"
            for q, keys in list(conflicts.items())[:3]
        )
        logger.warning(
            "dataset %r: %d question(s) appear with different answers (%s); each answer is an item of its own, kept "
            "out of the held-out set", self.dataset_name, len(conflicts), examples,
        )  # fmt: skip
        conflicting = {k for keys in conflicts.values() for k in keys}
        moved = [k for k in self._held_out if k in conflicting and k not in self._given_held_out]
        self._held_out = [k for k in self._held_out if k not in conflicting]
        self._order.extend(moved)
        return len(conflicts)

    def _held_out_by_key(self, key: str) -> bool:
        return self.eval_fraction > 0 and int(key[:8], 16) / 2**32 < self.eval_fraction

    def __len__(self) -> int:
        return len(self._order)

    def provenance(self, key: str) -> Provenance:
        """The provenance of the item ``key``."""
        return Provenance(DATASET_SOURCE, self.dataset_name, {}, None, None, version=self.version, key=key)

    def _row(self, key: str) -> dict[str, Any]:
        item = self._items[key]
        return {"prompt": item.prompt, **reward_columns(item.answer, self.provenance(key)), **item.columns}

    def rows(self) -> Any:
        """The training rows (a `datasets.Dataset`): chat ``prompt``, ``answer``, ``task``, ``entry`` (""),
        ``provenance`` (this source, its version and the item's key) and the reward columns; held-out items left
        out."""
        from datasets import Dataset

        return Dataset.from_list([self._row(key) for key in self._order])

    def held_out(self, size: int | None = None) -> Any:
        """Up to ``size`` held-out rows (all when None), in the same form as :meth:`rows`, the first by item key: peers
        holding the same data in any order evaluate the same items, in the same order. Empty when the source holds
        none out."""
        from datasets import Dataset

        ordered = sorted(self._held_out)  # by key: the same items on every peer that holds them, in any order
        keys = ordered if size is None else ordered[:size]
        return Dataset.from_list([self._row(key) for key in keys])

    # ------------------------------------------------------------------------------------------------
    # the protocol

    def holds(self, provenance: Provenance) -> bool:
        """A dataset provenance with a key this source holds, or naming this dataset."""
        if provenance.source != DATASET_SOURCE or provenance.key is None:
            return False
        return provenance.key in self._items or provenance.task == self.dataset_name

    def rederive(self, provenance: Provenance, question: str) -> Rederived:
        """This peer's question, answer and columns for the item the key names."""
        item = self._items.get(provenance.key or "")
        if item is None:
            if provenance.task == self.dataset_name and provenance.version not in (None, self.version):
                raise GroupDropped(
                    "version_skew",
                    f"{provenance.task} version {provenance.version} from the sender, {self.version} here",
                )
            raise GroupDropped("item_not_held", f"{provenance.task}: this peer's copy has no item {provenance.key}")
        if item.question != question.strip():
            raise GroupDropped("question_mismatch", f"{provenance.task}: item {provenance.key} holds another question")
        return Rederived(
            item.question, {**reward_columns(item.answer, self.provenance(provenance.key)), **item.columns}
        )

    def describe(self) -> str:
        return f"dataset {self.dataset_name} {self.version} ({len(self._items)} items)"


def where_they_differ(texts: Sequence[str], width: int = 30) -> list[str]:
    """Each of ``texts`` cut to ``width`` characters around where they first differ (the common start elided as
    `...`), so that answers that share a long start (GSM8K's reasoning before `#### N`) print differently."""
    start = 0
    while all(len(t) > start for t in texts) and len({t[start] for t in texts}) == 1:
        start += 1
    start = max(0, start - 10)  # a little of the common part, for context
    head = "..." if start else ""
    return [head + t[start : start + width] + ("..." if len(t) > start + width else "") for t in texts]


def mix_rows(datasets: Sequence[Any], seed: int = 0) -> Any:
    """One training dataset of several sources' rows (a mixture), shuffled with ``seed``: columns a source lacks are
    filled with None (TRL's batch needs the same columns in every row)."""
    from datasets import Dataset

    rows = [dict(row) for data in datasets for row in data]
    names = list(dict.fromkeys(name for row in rows for name in row))
    random.Random(seed).shuffle(rows)
    return Dataset.from_list([{name: row.get(name) for name in names} for row in rows])
