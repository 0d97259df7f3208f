"""What the intake (:mod:`sapo.intake`) counts and writes down: one round's outcome (:class:`Taken`), the running totals
logged as `sapo/total/<name>`, the outcomes per sender, and the group log's lines (:mod:`sapo.group_log`)."""

from __future__ import annotations

import logging
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from sapo.config import SAPOConfig
from sapo.group_log import GroupLog, GroupRecord, received_record
from sapo.questions import cut_detail
from sapo.sampling import SWARM, Candidate, OwnSuccess
from sapo.tally import SenderTally
from swarm.records import Group

logger = logging.getLogger("sapo.intake")  # the intake's lines, under the intake's name

SUMMARY_ROUNDS = 25
"""Rounds between the intake's summary lines (groups taken, set aside by reason)."""


@dataclass
class Taken:
    """One round's intake.

    Parameters:
        chosen (`list[Candidate]`): the external groups the node trains on this round (all processes), each with
            this peer's rewards.
        share (`list[Candidate]`): this process's part of `chosen`.
        candidates (`int`): groups fetched this round.
        scored (`int`): candidates that passed every check before sampling, and were scored.
        zero_advantage (`int`): scored candidates whose rewards were all equal.
        dropped (`collections.Counter`): groups set aside this round, by reason.
        records (`list[sapo.group_log.GroupRecord]`): every received group judged this round and what happened to it.
        scoring_seconds (`list[tuple[str, float]]`): each received group this process scored, as its sender and the
            wall seconds this peer's reward functions took on it.
        contested (`set[int]`): the ``id`` of each candidate kept whose group another sender sent too this round: who
            wrote it cannot be told, so it earns its sender no standing.
    """

    chosen: list[Candidate] = field(default_factory=list)
    share: list[Candidate] = field(default_factory=list)
    candidates: int = 0
    scored: int = 0
    zero_advantage: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    records: list[GroupRecord] = field(default_factory=list)
    scoring_seconds: list[tuple[str, float]] = field(default_factory=list)
    contested: set[int] = field(default_factory=set)


class IntakeLedger:
    """The intake's counts and group log.

    Args:
        args: the trainer's configuration (`groups_log`, `groups_log_max_bytes`, `output_dir`, `success_threshold`,
            `success_window`).
        is_main_process: whether this process writes the group log.

    Attributes:
        totals (`collections.Counter`): cumulative counts, logged as `sapo/total/<name>`.
        sender_outcomes (`sapo.tally.SenderTally`): per sender, its "taken", "dropped/<reason>" and
            "refused/<reason>" counts, for a bounded number of senders.
        own_success (`sapo.sampling.OwnSuccess`): the tasks this peer's own groups still fail on (a received group of
            one is logged as a rescue).
        group_log (`sapo.group_log.GroupLog` or None): every group judged, written by the main process
            (`args.groups_log` under `output_dir`; None: nowhere).
        step (`int`): the node's step, written on each record.
    """

    def __init__(self, args: SAPOConfig, is_main_process: bool):
        self.args = args
        self.totals: Counter[str] = Counter()
        self.sender_outcomes = SenderTally()
        self.own_success = OwnSuccess(args.success_threshold, args.success_window)
        self.group_log = None
        if args.groups_log is not None and is_main_process:
            path = os.path.join(args.output_dir, args.groups_log)
            self.group_log = GroupLog(path, max_bytes=args.groups_log_max_bytes)
        self.step = 0

    def count(self, taken: Taken, reason: str, count: int = 1, detail: str = "") -> None:
        """Count ``count`` groups set aside for ``reason``; the first time a reason appears it is logged (INFO)."""
        if not self.totals[f"dropped/{reason}"]:
            logger.info("first received group set aside as %s%s", reason, f" ({detail})" if detail else "")
        taken.dropped[reason] += count
        self.totals[f"dropped/{reason}"] += count

    def drop(
        self,
        taken: Taken,
        reason: str,
        sender: str,
        group: Group,
        detail: str,
        rewards: list[float] | None = None,
        origin: str = SWARM,
    ) -> None:
        """Count a group set aside for ``reason`` (against its sender's outcomes when received) and log it, ``detail``
        cut as a :class:`sapo.questions.GroupDropped`'s is (:func:`sapo.questions.cut_detail`)."""
        detail = cut_detail(detail)
        self.count(taken, reason, detail=f"{'key fingerprint ' + sender if origin == SWARM else 'replay'}: {detail}")
        if origin == SWARM:
            self.sender_outcomes.count(sender, f"dropped/{reason}")
        taken.records.append(self.record(sender, group, reason, rewards, origin))
        logger.debug("dropped a group of key fingerprint %s (%s): %s", sender, reason, detail)

    @property
    def taken_from(self) -> Counter[str]:
        """External groups trained on, by verified sender (`sender_outcomes`' "taken" counts)."""
        return self.sender_outcomes.taken()

    def running_totals(self) -> dict[str, Any]:
        """The cumulative counts (`totals`, `taken_from`, `sender_outcomes`) as JSON-ready mappings: what a checkpoint
        keeps, so that a resumed run counts on (:meth:`restore_totals`)."""
        senders = {sender: dict(counts) for sender, counts in self.sender_outcomes.items()}
        return {"totals": dict(self.totals), "taken_from": dict(self.taken_from), "senders": senders}

    def restore_totals(self, saved: dict[str, Any]) -> None:
        """Count on from ``saved`` (:meth:`running_totals` of the run being resumed); a missing part is left at 0."""
        self.totals.update({str(k): int(v) for k, v in (saved.get("totals") or {}).items()})
        for sender, counts in (saved.get("senders") or {}).items():  # `taken_from` is their "taken" counts
            for key, n in counts.items():
                self.sender_outcomes.count(str(sender), str(key), int(n))

    def log_summary(self, rounds: int) -> None:
        """One INFO line: what the intake took and set aside in its first ``rounds`` rounds, by reason."""
        drops = {k.split("/", 1)[1]: v for k, v in self.totals.items() if k.startswith("dropped/") and v}
        logger.info(
            "swarm intake after %d rounds: %d groups taken of %d fetched, %d replayed, %d slots filled in; "
            "set aside: %s",
            rounds, self.totals["external_groups"], self.totals["candidates"], self.totals["replay_groups"],
            self.totals["fill_ins"],
            ", ".join(f"{k} {v}" for k, v in sorted(drops.items(), key=lambda kv: -kv[1])) or "none",
        )  # fmt: skip

    def record(
        self,
        sender: str,
        group: Group,
        outcome: str,
        rewards: list[float] | None = None,
        origin: str = SWARM,
        task: str | None = None,
    ) -> GroupRecord:
        """The group log's line for a received (or replayed) group and what happened to it
        (:func:`sapo.group_log.received_record`)."""
        threshold, weak = self.args.success_threshold, self.own_success.is_weak
        return received_record(self.step, sender, group, outcome, rewards, threshold, origin, task, weak)

    def candidate_record(self, candidate: Candidate, outcome: str) -> GroupRecord:
        task = candidate.columns.get("task") if isinstance(candidate.columns, dict) else None
        return self.record(candidate.sender, candidate.group, outcome, candidate.rewards, candidate.origin, task)

    def write(self, records: list[GroupRecord]) -> None:
        """Append ``records`` to the group log, if this process writes one."""
        if self.group_log is not None and records:
            self.group_log.write(records)
