"""The sources of a trainer's own rows: which sources verify what it shares, found from its training rows."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from typing import Any

from sapo.questions import provenance_to_json, question_of
from sapo.reasoning_gym import REASONING_GYM_SOURCE, TaskSpec
from sapo.sources.base import SourceRegistry, TaskSource, row_provenances
from sapo.sources.dataset import DATASET_SOURCE, DatasetSource, item_key
from sapo.sources.reasoning_gym import ReasoningGymSource
from swarm.records import Provenance

logger = logging.getLogger(__name__)

UNNAMED_DATASET = "dataset"
"""The name under which rows without a provenance are keyed by content (peers verify them by key, whatever name)."""


def keyed_by_content(train_dataset: Any, name: str = UNNAMED_DATASET) -> Any:
    """``train_dataset`` with a `provenance` column on the rows that lack one: a dataset item of ``name`` keyed by
    its question (last user message) and ``answer``, so that peers holding the same rows in any order verify them.
    Rows keep their prompts and order. Returns the dataset unchanged when every row has a provenance or rows have
    no ``answer`` column."""
    columns = set(getattr(train_dataset, "column_names", None) or [])
    if "answer" not in columns or "prompt" not in columns:
        return train_dataset

    def add(row: dict[str, Any]) -> dict[str, Any]:
        if row.get("provenance"):
            return {"provenance": row["provenance"]}
        key = item_key(question_of(row["prompt"]), row["answer"])
        return {
            "provenance": provenance_to_json(Provenance(DATASET_SOURCE, name, {}, None, None, version="1", key=key))
        }

    if "provenance" in columns and all(train_dataset["provenance"]):
        return train_dataset
    return train_dataset.map(add, desc="keying rows by content")


def registry_for(
    train_dataset: Any,
    sources: Sequence[TaskSource] | None,
    policy: str,
    regeneration_timeout: float | None,
    regeneration_budget: float | None = 30.0,
) -> SourceRegistry:
    """The sources a trainer holds: ``sources`` as given, plus those its own rows need that none of them holds (dataset
    items keyed by content; reasoning-gym, when its rows hold reasoning-gym items, with ``regeneration_timeout`` and
    ``regeneration_budget``). Logs what it holds, and warns of rows no peer could verify, saying why."""
    registry = SourceRegistry(sources or (), policy)
    rows = _sample_rows(train_dataset)
    provenances = row_provenances(rows)
    tasks = {}
    for provenance in provenances:
        if provenance is not None and provenance.source == REASONING_GYM_SOURCE:
            task = TaskSpec(provenance.task, provenance.config)
            tasks.setdefault((task.name, task.config_key), task)
    # reasoning-gym regenerates any of its items cheaply (a foreign config in a child process, under a time limit and
    # a budget per round): a peer that trains on reasoning-gym tasks verifies every reasoning-gym group, of its own
    # tasks or not. A peer of other sources holds only those: its rewards need their columns.
    if tasks and not any(isinstance(s, ReasoningGymSource) for s in registry.sources):
        source = ReasoningGymSource(
            list(tasks.values()), regeneration_timeout=regeneration_timeout, regeneration_budget=regeneration_budget
        )
        registry.add(source)
    keyed = [(row, p) for row, p in zip(rows, provenances, strict=True) if p is not None and p.source == DATASET_SOURCE]
    unheld = [(row, p) for row, p in keyed if registry.source_of(p) is None]
    for name in dict.fromkeys(p.task for _, p in unheld):
        named = [row for row, p in unheld if p.task == name]
        version = next(p.version for _, p in unheld if p.task == name) or "1"
        registry.add(DatasetSource.from_rows(named, name=name, version=version))
    _warn_unverifiable(rows, provenances, registry)
    if registry.sources:
        logger.info("task sources held here: %s", "; ".join(s.describe() for s in registry.sources))
    return registry


def _sample_rows(train_dataset: Any) -> list[dict[str, Any]]:
    """Every row of a sized dataset; the first 1000 of a stream (whose other rows are not inspected)."""
    if train_dataset is None:
        return []
    if hasattr(train_dataset, "__len__"):
        return [dict(row) for row in train_dataset]
    rows = []
    for row in train_dataset:
        rows.append(dict(row))
        if len(rows) == 1000:
            break
    return rows


def _warn_unverifiable(
    rows: list[dict[str, Any]], provenances: list[Provenance | None], registry: SourceRegistry
) -> None:
    """One warning per kind of row that no peer could verify, with the count and the reason."""
    why: Counter[str] = Counter()
    for row, provenance in zip(rows, provenances, strict=True):
        if provenance is None:
            raw = row.get("provenance")
            why["an unreadable provenance" if raw else "no provenance and no 'answer' column to key them by"] += 1
        elif registry.source_of(provenance) is None:
            why[f"source {provenance.source!r}, which no registered TaskSource holds"] += 1
        elif provenance.source == DATASET_SOURCE and provenance.key is None:
            why["a dataset provenance without a content key (rows made by an old version)"] += 1
    for reason, count in why.items():
        logger.warning(
            "%d of %d training rows have %s: peers cannot verify them and drop the groups made from them; pass "
            "sources=[...] (sapo.sources) or build the rows with a TaskSource", count, len(rows), reason,
        )  # fmt: skip
