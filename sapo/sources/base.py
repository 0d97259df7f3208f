"""The task-source protocol: a source names its items durably, and a receiver re-derives their truth from that name.

A :class:`TaskSource` has a name (the provenance's `source`) and a version, makes training rows whose `provenance`
column names the source, its version, its configuration and a durable key of the item, and, on a receiver,
re-derives from such a provenance the question, the reference answer and every column the rewards read
(:meth:`TaskSource.rederive`), or raises :class:`sapo.questions.GroupDropped` saying precisely why it cannot. The
:class:`SourceRegistry` routes each received group to the source that holds it; a provenance no registered source
holds follows the node's policy for unknown sources (:data:`SOURCE_POLICIES`).
"""

from __future__ import annotations

import json
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from sapo.questions import GroupDropped, cut_detail, question_of, reward_columns
from swarm.records import Group, Provenance, provenance_from_wire

logger = logging.getLogger(__name__)

SOURCE_POLICIES: dict[str, str] = {
    "verify": "drops the group (`unknown_source`): only sources this peer holds are trained on",
    "trust": "scores the group with the answer the sender put in its metadata, and accepts only a prompt of a single "
    "user message (anything else is dropped as untrusted_prompt)",
    "drop": "drops the group (`untrusted_source`)",
}
"""What a registry does with a group of a source this peer does not hold, by policy name: the one list of names that
:class:`SourceRegistry` and `SAPOConfig.external_source_policy` accept, and the text both document."""


class SourceErrorLimit(RuntimeError):
    """Task sources raised more often in a row than their registry's `max_source_errors` allows: training stops."""


def describe_source_policies() -> str:
    """Each policy name with what it does, as `SAPOConfig.external_source_policy` documents it."""
    return "; ".join(f'`"{name}"` {what}' for name, what in SOURCE_POLICIES.items())


@dataclass(frozen=True)
class Rederived:
    """What a receiver's own copy of a source says of an item.

    Parameters:
        question (`str`): the question, as this peer's own rows hold it (the prompt is written around it here).
        columns (`dict[str, Any]`): every column this peer's rewards read for the item (`answer`, `task`,
            `provenance`, and the source's own: a reasoning-gym `entry`, a dataset's extra columns).
    """

    question: str
    columns: dict[str, Any] = field(default_factory=dict)


class TaskSource(ABC):
    """A source of verifiable tasks (see the module docstring).

    Subclasses set `name` (the provenance's `source`; the same on every peer that shares the source) and `version`,
    and implement :meth:`holds` and :meth:`rederive` (what a receiver calls), :meth:`rows` (the trainer's rows, each
    with a `provenance` column, JSON of `swarm.records.provenance_to_wire`, that :meth:`rederive` can read back) and,
    for the held-out evaluation, :meth:`held_out`. :meth:`describe` names the source in logs and node-run.json.
    """

    name: str = ""
    version: str = ""

    @abstractmethod
    def holds(self, provenance: Provenance) -> bool:
        """Whether this source answers for ``provenance`` (its source name, and the task or dataset it names)."""

    @abstractmethod
    def rederive(self, provenance: Provenance, question: str) -> Rederived:
        """This peer's own question and reward columns for the item ``provenance`` names; ``question`` is the
        sender's, to compare. Raises :class:`GroupDropped` (`bad_provenance`, `version_skew`, `item_not_held`,
        `question_mismatch`, ...) when it cannot."""

    def costly(self, provenance: Provenance) -> bool:
        """Whether re-deriving ``provenance`` may cost what its sender chose, up to a limit of seconds (reasoning-gym:
        a config this peer does not run itself). While the senders not yet found usable have cost too much together
        (`SAPOConfig.newcomer_rederivation_seconds`), their costly items are set aside unread. Default: False (an
        item of this peer's own data or generator costs what its own items do)."""
        return False

    def new_round(self) -> None:
        """Told before a round's received groups are re-derived (:meth:`SourceRegistry.new_round`): a source that
        bounds what one round may cost it (reasoning-gym's `regeneration_budget`) starts afresh. Default: nothing."""
        return None

    def rows(self, *args: Any, **kwargs: Any) -> Any:
        """This source's training rows (a `datasets.Dataset`, or a list of dicts), each with a chat ``prompt``, an
        ``answer``, a ``task`` and a ``provenance`` that :meth:`rederive` reads back, plus any reward columns. A
        source that only verifies (never trains) need not implement it. `sapo-node --source` calls it with
        ``size`` and ``seed`` where its signature takes them."""
        raise NotImplementedError(f"{type(self).__name__} makes no training rows: implement rows()")

    def held_out(self, size: int | None = None) -> Any:
        """Up to ``size`` held-out rows (items training never draws), in the form of :meth:`rows`, chosen the same
        way on every peer; the held-out evaluation scores them. Default: none (an empty list)."""
        return []

    def describe(self) -> str:
        """One line naming the source, for logs."""
        return f"{self.name} {self.version}".strip()


class SourceRegistry:
    """The task sources a peer holds, and the policy for those it does not.

    Args:
        sources: the sources this peer holds (several are a mixture: each verifies its own items); another registry
            gives its sources and, unless ``max_source_errors`` is given, its limit.
        policy: a key of :data:`SOURCE_POLICIES`: what a group of a source no registered source holds gets.
        max_source_errors: how many times in a row the sources may raise (an error other than :class:`GroupDropped`)
            before :class:`SourceErrorLimit` stops training; each error drops its group as ``source_error``, and an
            item re-derived starts the count again: a broken source stops training, a peer that sends only the rare
            items a source raises on is outnumbered by the others' groups (and rested by
            :data:`sapo.rederivation.SOURCE_ERROR_SECONDS`). None: no limit.

    In library use the limit travels with the sources, as a reward's limit travels with its
    `sapo.reward_guard.RewardGuard`: ``SAPOTrainer(..., sources=SourceRegistry([questions], max_source_errors=100))``
    (the trainer's registry takes the given sources and limit, under `SAPOConfig.external_source_policy`).
    """

    def __init__(
        self, sources: Iterable[TaskSource] = (), policy: str = "verify", max_source_errors: int | None = None
    ):
        if policy not in SOURCE_POLICIES:
            raise ValueError(f"unknown source policy {policy!r}; expected one of {list(SOURCE_POLICIES)}")
        if max_source_errors is not None and max_source_errors < 0:
            raise ValueError(f"max_source_errors must be >= 0 or None (no limit), got {max_source_errors}")
        if isinstance(sources, SourceRegistry) and max_source_errors is None:
            max_source_errors = sources.max_source_errors
        self.policy = policy
        self.sources: list[TaskSource] = list(sources)
        self.source_errors = 0  # in all
        self.source_errors_in_a_row = 0
        self.max_source_errors = max_source_errors
        self.held_out_questions: frozenset[str] = frozenset()

    def hold_out(self, questions: Iterable[str]) -> None:
        """The questions this peer evaluates on (its held-out set, e.g. :func:`sapo.questions.questions_of_rows` of
        its evaluation rows): a received group whose question (the one vouched for here) is one of them is dropped as
        ``held_out``, never counted against its sender (a peer with another split of the same data sends them
        honestly), so that no peer's group has this one train on what it is measured on."""
        self.held_out_questions = frozenset(question.strip() for question in questions)

    def __iter__(self) -> Iterator[TaskSource]:
        """The sources held, in order."""
        return iter(self.sources)

    def add(self, source: TaskSource) -> None:
        """Hold ``source`` too."""
        self.sources.append(source)

    def new_round(self) -> None:
        """Begin a round: tell every source (:meth:`TaskSource.new_round`), so that per-round bounds start afresh."""
        for source in self.sources:
            # a source of another make (not a TaskSource subclass) may not have the hook
            if callable(hook := getattr(source, "new_round", None)):
                hook()

    def costly(self, group: Group) -> bool:
        """Whether re-deriving ``group`` may cost what its sender chose (:meth:`TaskSource.costly` of the source that
        holds it; False for a group no source holds, which is refused at once)."""
        provenance = group.provenance
        if not isinstance(provenance, Provenance):
            return False
        try:
            source = next((s for s in self.sources if s.holds(provenance)), None)  # an error: counted when re-derived
        except Exception:
            return False
        # a source of another make (not a TaskSource subclass) may not have the hook
        if source is None or not callable(hook := getattr(source, "costly", None)):
            return False
        try:
            return bool(hook(provenance))
        except Exception as e:  # a source's own error never stops training: its re-derivation will say what it is
            logger.warning("task source %s raised in costly(): %s: %s", source.describe(), type(e).__name__, e)
            return False

    def source_of(self, provenance: Provenance) -> TaskSource | None:
        """The registered source that holds ``provenance``, or None. A source's own error in
        :meth:`TaskSource.holds` drops the group as ``source_error`` (:meth:`_source_error`)."""
        for source in self.sources:
            try:
                if source.holds(provenance):
                    return source
            except Exception as e:
                raise self._source_error(source, provenance, "holds", e) from None
        return None

    def columns_for(self, group: Group) -> dict[str, Any]:
        """The reward columns this peer re-derives for a received group, and the ``question`` it vouches for (the
        one its own source holds; under the ``"trust"`` policy, the sender's single user message). The receiver
        writes its training prompt around that question; nothing else of the sender's prompt is trained on.

        Raises :class:`GroupDropped` when the group's truth cannot be re-derived here.
        """
        provenance = group.provenance
        if not isinstance(provenance, Provenance):  # a transport parses it (swarm.records.group_from_wire)
            raise GroupDropped(
                "bad_provenance",
                f"the group's provenance is a {type(provenance).__name__}, not a swarm.records.Provenance "
                "(build it from the wire form with swarm.records.provenance_from_wire)",
            )
        question = question_of(group.prompt)
        if not question:
            raise GroupDropped("question_mismatch", "the group's prompt has no user message")
        if question in self.held_out_questions:  # the sender's question: nothing re-derived in vain
            raise _held_out(provenance)
        columns = self._columns(group, provenance, question)
        if columns["question"].strip() in self.held_out_questions:  # the question vouched for here
            raise _held_out(provenance)
        return columns

    def _columns(self, group: Group, provenance: Provenance, question: str) -> dict[str, Any]:
        """:meth:`columns_for` before the held-out check."""
        source = self.source_of(provenance)
        if source is not None:
            rederived = self._rederive(source, provenance, question)
            return {**rederived.columns, "question": rederived.question}
        held = ", ".join(s.describe() for s in self.sources) or "none"
        family = [s for s in self.sources if s.name == provenance.source]
        if family and provenance.key is not None:
            # A source of this kind is held here (a dataset, whatever its file's name): the item is what is missing.
            raise GroupDropped(
                "item_not_held", f"no {provenance.source} held here has item {provenance.key} (held: {held})"
            )
        if self.policy == "trust":
            return {**_trusted_columns(group), "question": question}
        reason = "unknown_source" if self.policy == "verify" else "untrusted_source"
        raise GroupDropped(
            reason, f"no source here holds {provenance.source}/{provenance.task} (held: {held}; policy {self.policy!r})"
        )

    def _rederive(self, source: TaskSource, provenance: Provenance, question: str) -> Rederived:
        """``source.rederive``, with an error of the source's own (not a :class:`GroupDropped`) logged with the item
        and counted in :attr:`source_errors`, and the group dropped as ``source_error``: a source that raises on
        one item never stops training."""
        try:
            rederived = source.rederive(provenance, question)
        except GroupDropped:
            raise
        except Exception as e:
            raise self._source_error(source, provenance, "rederive", e) from None
        self.source_errors_in_a_row = 0
        return rederived

    def _source_error(self, source: TaskSource, provenance: Provenance, method: str, error: Exception) -> GroupDropped:
        """An error of ``source``'s own ``method`` on a received item: logged with the item and counted in
        :attr:`source_errors` (and :attr:`source_errors_in_a_row`); the group's drop (``source_error``), or
        :class:`SourceErrorLimit` past the limit."""
        self.source_errors += 1
        self.source_errors_in_a_row += 1
        item, what = _item(provenance), cut_detail(f"{type(error).__name__}: {error}")
        logger.error(
            "task source %s raised in %s() on item %s (%d source error(s) in a row, %d in all): %s",
            source.describe(), method, item, self.source_errors_in_a_row, self.source_errors, what,
        )  # fmt: skip
        if self.max_source_errors is not None and self.source_errors_in_a_row > self.max_source_errors:
            raise SourceErrorLimit(
                f"task sources raised {self.source_errors_in_a_row} times in a row (limit {self.max_source_errors}); "
                f"last, {source.describe()} in {method}() on item {item}: {what}"
            ) from error
        return GroupDropped("source_error", f"{source.describe()} raised in {method}() on item {item}: {what}")


def _held_out(provenance: Provenance) -> GroupDropped:
    """The drop of a group whose question is one of this peer's held-out evaluation questions."""
    return GroupDropped("held_out", f"{_item(provenance)} is one of this peer's held-out evaluation questions")


def _item(provenance: Provenance) -> str:
    """A received item's name for logs: its key, or its task, seed and index (each cut to 100 characters)."""
    if provenance.key is not None:
        return str(provenance.key)[:100]
    return f"{str(provenance.task)[:100]}[{provenance.seed}, {provenance.index}]"


def _trusted_columns(group: Group) -> dict[str, Any]:
    """The columns of a group under the ``"trust"`` policy: the sender's answer, for a prompt of one user message."""
    answer = group.metadata.get("answer")
    if answer is None:
        raise GroupDropped("no_answer", "policy 'trust' but the group's metadata has no 'answer'")
    roles = [message.get("role") for message in group.prompt]
    if roles != ["user"]:
        # Unverifiable text is accepted only as a plain question: a sender's system or assistant turns
        # would condition the completions this node trains on.
        raise GroupDropped("untrusted_prompt", f"policy 'trust' takes one user message, got roles {roles}")
    return reward_columns(str(answer), group.provenance)


def as_dataset(rows: Any, what: str) -> Any:
    """``rows`` (what a source's :meth:`TaskSource.rows` or :meth:`TaskSource.held_out` returned) as a
    `datasets.Dataset`: a Dataset as is, a list of dicts converted. Raises TypeError, one line naming ``what``, for
    anything else."""
    from datasets import Dataset

    if isinstance(rows, Dataset):
        return rows
    if isinstance(rows, list | tuple) and all(isinstance(row, dict) for row in rows):
        return Dataset.from_list([dict(row) for row in rows])
    kind = type(rows).__name__
    if isinstance(rows, list | tuple):
        kind = f"{kind} holding a {type(next(r for r in rows if not isinstance(r, dict))).__name__}"
    raise TypeError(f"{what} returned a {kind}; it must return a datasets.Dataset or a list of dicts (one per row)")


def by_turns(senders: Sequence[str], first: Callable[[str], bool] = lambda sender: False) -> list[int]:
    """The positions of ``senders`` (one per received group) in an order where senders take turns: every sender's first
    group, then every one's second, and so on (within a turn in the given order); a sender's own groups keep theirs.
    The groups of senders for which ``first`` is true (those this node found usable lately) come before all others, in
    turns among themselves. A round re-derives its groups in this order, so that one sender's groups cannot spend a
    per-round budget (reasoning-gym's `regeneration_budget`) before the other senders' groups are tried, nor new
    identities before the senders this node found usable."""
    rank: dict[str, int] = {}
    keyed = []
    for position, sender in enumerate(senders):
        turn = rank[sender] = rank.get(sender, -1) + 1
        keyed.append((not first(sender), turn, position))
    return [position for *_, position in sorted(keyed)]


def row_provenances(rows: Sequence[dict[str, Any]]) -> list[Provenance | None]:
    """The provenance of each row (its `provenance` column read back), or None where it has none or it is
    unreadable."""
    out: list[Provenance | None] = []
    for row in rows:
        raw = row.get("provenance")
        try:
            out.append(provenance_from_wire(json.loads(raw) if isinstance(raw, str) else raw) if raw else None)
        except (ValueError, TypeError):
            out.append(None)
    return out
