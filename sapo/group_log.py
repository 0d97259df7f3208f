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
from pathlib import Path
from typing import Any

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
    """Appends :class:`GroupRecord` lines to a JSONL file, rotated when it would pass ``max_bytes``.

    Rotation keeps ``backups`` older files (``groups.jsonl.1`` the newest of them); a reader reads them oldest first
    (:func:`read_group_log`). A line is written whole or not at all: the file is opened in append mode and each line is
    one write.

    Args:
        path: the JSONL file.
        max_bytes: size past which the file is rotated before the next line (default 20 MB).
        backups: rotated files kept (default 5).
    """

    def __init__(self, path: str | os.PathLike[str], max_bytes: int = 20_000_000, backups: int = 5):
        if max_bytes <= 0 or backups < 0:
            raise ValueError(f"max_bytes must be positive and backups at least 0, got {max_bytes} and {backups}")
        self.path = Path(path)
        self.max_bytes, self.backups = max_bytes, backups
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, records: Sequence[GroupRecord]) -> None:
        """Append ``records``, one line each."""
        now = time.time()
        for record in records:
            fields = {**asdict(record), "time": record.time or now}
            if record.rewards is not None:  # JSON has no NaN: a reward no function gave is null
                fields["rewards"] = [None if math.isnan(r) else r for r in record.rewards]
            line = json.dumps(fields, allow_nan=False)
            self._rotate_if_full(len(line) + 1)
            with self.path.open("a", encoding="utf-8") as f:
                f.write(line + "\n")

    def _rotate_if_full(self, incoming: int) -> None:
        size = self.path.stat().st_size if self.path.exists() else 0
        if size == 0 or size + incoming <= self.max_bytes:
            return
        if self.backups == 0:
            self.path.unlink()
            return
        for i in range(self.backups - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{i}")
            if older.exists():
                os.replace(older, self.path.with_name(f"{self.path.name}.{i + 1}"))
        os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))


def read_group_log(path: str | os.PathLike[str]) -> list[dict]:
    """Every line of a group log and its rotated files, oldest first (a torn last line is skipped)."""
    path = Path(path)
    rotated = [p for p in path.parent.glob(f"{path.name}.*") if p.suffix[1:].isdigit()]
    records = []
    for file in [*sorted(rotated, key=lambda p: -int(p.suffix[1:])), path]:
        if not file.exists():
            continue
        for line in file.read_text(encoding="utf-8").splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line cut by a kill mid-write
    return records
