"""The per-group log: one JSON line for each own group and each received group a node judged, rotated by size.

Each line says what a group was and what happened to it (:class:`GroupRecord`), so that a report counts what sharing
carried (groups taken, drops by reason, rescues) instead of inferring it from per-step means.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from sapo.jsonl_files import RotatingJsonl, read_jsonl

OWN = "own"
"""The `outcome` of a group this node generated and trained on."""

TAKEN = "taken"
"""The `outcome` of a received group this node trained on."""

HELD = "held"
"""The `outcome` of a usable received group left unchosen and kept for a later round (`SAPOConfig.swarm_hold`)."""


@dataclass
class GroupRecord:
    """One group as this node saw it.

    Parameters:
        step (`int`): this node's optimizer step when the group was judged (own: generated).
        origin (`str`): `"own"` (generated here) or `"swarm"` (received).
        group_id (`str`): the group's id (the sender's).
        task (`str`): the task its provenance names.
        sender (`str`): the peer that published it (this node's peer id, or `"self"` without a swarm, for own groups).
        model (`str`): the sender's model name as it published it.
        rewards (`list[float] | None`): this node's reward of each completion; None when it was not scored.
        success (`bool | None`): whether some completion's reward reached the success threshold.
        spread (`bool | None`): whether the rewards differ (a GRPO signal).
        outcome (`str`): `"own"`, `"taken"`, or the reason it was set aside (`stale`, `question_mismatch`,
            `zero_advantage`, `implausible`, `not_chosen`, ...), or `"held"`: usable, left unchosen and kept for a
            later round (`SAPOConfig.swarm_hold`), so the group may have lines at later steps too.
        age_seconds (`float`): seconds from the group's creation to this judgement.
        step_lag (`int | None`): this node's step minus the sender's step at publication.
        rescue (`bool`): a taken group with a success on a task where this node's own recent groups had none.
        time (`float`): when this line was written (Unix seconds).
    """

    step: int
    origin: str
    group_id: str
    task: str
    sender: str
    model: str
    rewards: list[float] | None
    success: bool | None
    spread: bool | None
    outcome: str
    age_seconds: float
    step_lag: int | None = None
    rescue: bool = False
    time: float = 0.0


def reward_summary(rewards: Sequence[float] | None, threshold: float) -> tuple[bool | None, bool | None]:
    """(success, spread) of a group's rewards: a reward at least ``threshold``, rewards that differ (NaN ignored)."""
    if rewards is None:
        return None, None
    finite = [r for r in rewards if not math.isnan(r)]
    return any(r >= threshold for r in finite), len(set(finite)) > 1


def own_records(
    step: int, groups: Iterable[tuple[str, str, Sequence[float]]], sender: str, model: str, threshold: float
) -> list[GroupRecord]:
    """The lines of this node's own groups of one round, ``(group id, task, rewards)`` each, made by ``model``."""
    return [
        GroupRecord(
            step, OWN, group_id, task, sender, model, list(rewards), *reward_summary(rewards, threshold), OWN, 0.0, 0
        )  # fmt: skip
        for group_id, task, rewards in groups
    ]


def received_record(
    step: int,
    sender: str,
    group: Any,
    outcome: str,
    rewards: Sequence[float] | None,
    threshold: float,
    origin: str,
    task: str | None = None,
    is_weak: Callable[[str], bool] = lambda task: False,
) -> GroupRecord:
    """The line of a received (``origin`` `"swarm"`) or replayed group (a `swarm.records.Group`) and what happened to
    it at ``step``; ``task``: the name this node's own source gave the item, else the provenance's; a rescue is a taken
    swarm group with a success on a task where ``is_weak(task)`` (this node's own recent groups had none)."""
    success, spread = reward_summary(rewards, threshold)
    task = task or getattr(group.provenance, "task", "") or ""
    return GroupRecord(
        step=step, origin=origin, group_id=str(group.group_id), task=task, sender=sender,
        model=str(group.model or ""), rewards=None if rewards is None else list(rewards), success=success,
        spread=spread, outcome=outcome, age_seconds=max(0.0, time.time() - group.created_at),
        step_lag=step - group.step, rescue=origin == "swarm" and outcome == TAKEN and bool(success) and is_weak(task),
    )  # fmt: skip


class GroupLog:
    """Appends :class:`GroupRecord` lines to a JSONL file, rotated when it would pass ``max_bytes``
    (:class:`sapo.jsonl_files.RotatingJsonl`).

    Rotation keeps ``backups`` older files (``groups.jsonl.1`` the newest of them); a reader reads them oldest first
    (:func:`read_group_log`). A line is written whole or not at all.

    Args:
        path: the JSONL file.
        max_bytes: size past which the file is rotated before the next line (default 20 MB).
        backups: rotated files kept (default 5).
    """

    def __init__(self, path: str | os.PathLike[str], max_bytes: int = 20_000_000, backups: int = 5):
        self._file = RotatingJsonl(path, max_bytes, backups)

    def write(self, records: Sequence[GroupRecord]) -> None:
        """Append ``records``, one line each."""
        now = time.time()
        lines = []
        for record in records:
            fields = {**asdict(record), "time": record.time or now}
            if record.rewards is not None:  # JSON has no NaN: a reward no function gave is null
                fields["rewards"] = [None if math.isnan(r) else r for r in record.rewards]
            lines.append(json.dumps(fields, allow_nan=False))
        self._file.append(lines)


def read_group_log(path: str | os.PathLike[str]) -> list[dict]:
    """Every line of a group log and its rotated files, oldest first (a torn last line is skipped)."""
    return list(read_jsonl(path))
