"""Publication: what a peer publishes of each round (its own groups, as decoded text) and how, the mirror of the intake.

A published group carries the question alone as one user message (receivers write their own prompt around the
question they re-derive), the completions as text, the provenance of the question's source, and the reference
answer as metadata for receivers that trust it. Nothing but text crosses the network.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from rewards import completion_text
from swarm.records import Group, Provenance, RecordRejected, provenance_from_wire
from swarm.transport import SwarmTransport

logger = logging.getLogger(__name__)


def published_prompt(prompt: Any) -> Any:
    """The prompt a peer publishes with a group: its question alone, as one user message.

    Receivers write their own prompt around the question they verify, so a system prompt or earlier turns would be
    dead weight on the wire, and a receiver under the ``"trust"`` policy accepts a lone user message only. A plain
    string prompt (not conversational) is published as it is.
    """
    if isinstance(prompt, str):
        return prompt
    users = [m for m in prompt if m.get("role") == "user"]
    return [{"role": "user", "content": users[-1]["content"]}] if users else list(prompt)


def row_provenance(row: dict[str, Any]) -> Provenance:
    """The provenance a dataset row carries in its 'provenance' column (JSON), or a 'custom' one named after its
    'task' column."""
    raw = row.get("provenance")
    if raw:
        try:
            return provenance_from_wire(json.loads(raw) if isinstance(raw, str) else raw)
        except (ValueError, TypeError) as e:
            logger.warning("row has an unreadable provenance (%s); publishing it as a custom source", e)
    return Provenance(source="custom", task=str(row.get("task") or "unknown"))


def group_id(step: int, process: int, index: int) -> str:
    """The id of the ``index``-th own group of ``process`` at ``step``: the same in the group log and on the wire."""
    return f"{step}-{process}-{index}"


def own_groups(
    rows: Sequence[dict[str, Any]],
    completions: dict[int, Any],
    group_starts: Sequence[int],
    num_generations: int,
    step: int,
    process: int,
    model: str,
) -> list[Group]:
    """The groups generated here in a round, as published: for each group (its first row in ``group_starts``), the
    question of ``rows`` and the completions generated for its rows (``completions``: row index -> TRL's completion)."""
    now, groups = time.time(), []
    for index, start in enumerate(group_starts):
        row = rows[start]
        groups.append(
            Group(
                group_id=group_id(step, process, index),
                prompt=published_prompt(row["prompt"]),
                completions=[completion_text(completions[i]) for i in range(start, start + num_generations)],
                provenance=row_provenance(row),
                metadata={"answer": str(row["answer"])} if row.get("answer") is not None else {},
                model=model,
                step=step,
                created_at=now,
            )
        )
    return groups


def publish(swarm: SwarmTransport, groups: list[Group], totals: Counter[str]) -> None:
    """Publish ``groups`` to ``swarm``, counting them in ``totals`` (`published_groups`). Groups that break this
    peer's own record limits (e.g. a huge completion) are skipped, counted and logged: training goes on."""
    if not groups:
        return
    try:
        swarm.publish(groups)
        totals["published_groups"] += len(groups)
    except RecordRejected as e:
        totals[f"publish_rejected/{e.reason}"] += len(groups)
        logger.warning("not publishing %d groups of step %d: %s", len(groups), groups[0].step, e)
