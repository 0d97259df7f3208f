"""Re-deriving a round's received groups: senders in turns, those found usable first, a sender whose groups cost too
much time lately (to re-derive in vain, or to score beyond what is free) rested, and the costly items of senders
not yet found usable rested while they cost too much together."""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections import OrderedDict
from collections.abc import Collection, Sequence
from typing import Any

from sapo.questions import GroupDropped
from sapo.sources import SourceRegistry, by_turns
from sapo.standing import MAX_SENDERS, SenderStanding
from swarm.records import ReceivedGroup

logger = logging.getLogger(__name__)

NEWCOMERS = "senders not yet found usable"
"""The account of :attr:`RoundRederivation.newcomers`: what the senders not found usable lately cost together."""

HALF_LIFE_SECONDS = 300.0
"""How fast a sender's re-derivation spend is forgotten: it halves every five minutes."""

SCORING_FREE_SECONDS = 0.5
"""Seconds of scoring a received group may take without charge to its sender, whatever the round's usual cost: half of
:data:`rewards.functions.SCORER_SECONDS`; honest groups score in milliseconds with the default rewards."""

SCORING_FREE_FACTOR = 4.0
"""A received group may take this many times the round's cheapest sender's usual scoring time without charge: with a
slow reward (a judge model, code that runs) every sender's groups cost about as much, and none is charged."""


SOURCE_ERROR_SECONDS = 1.0
"""Seconds a received group whose item made a task source raise (``source_error``) is charged to its sender at least:
such an error costs a logged line and counts toward `max_source_errors`, so that a sender of items a source raises on
(found offline in a user's generator with a rare bug) is rested after about ``sender_rederivation_seconds`` of
them, as one of slow items is."""


def scoring_excess(scored: Sequence[tuple[str, float]]) -> list[float]:
    """What scoring each of a round's received groups cost beyond what is free (``scored``: each group's sender and
    seconds; the same rule serves re-deriving items of this peer's own kind): the larger of
    :data:`SCORING_FREE_SECONDS` and :data:`SCORING_FREE_FACTOR` times the cheapest sender's median. The cheapest
    sender's, not the round's: one sender sending more groups than the others moves a round's median to its own."""
    by_sender: dict[str, list[float]] = {}
    for sender, seconds in scored:
        by_sender.setdefault(sender, []).append(seconds)
    if not by_sender:
        return []
    usual = min(statistics.median(seconds) for seconds in by_sender.values())
    free = max(SCORING_FREE_SECONDS, SCORING_FREE_FACTOR * usual)
    return [max(0.0, seconds - free) for _, seconds in scored]


class RederivationCosts:
    """Wall seconds this node spent re-deriving each sender's received groups in vain (:mod:`sapo.sources`: the groups
    dropped there, and costly items re-derived but not trained on; reasoning-gym's foreign configs run in a child
    process, up to `regeneration_timeout` each), and scoring them beyond what is free (:func:`scoring_excess`),
    halving every ``half_life`` seconds. Items of this peer's own kind re-derived count only what they cost beyond what
    is usual (:func:`scoring_excess`), however slow their source.

    A sender whose spend is over ``allowance`` is *rested*: its groups are set aside unread
    (``rederivation_cost``) until the spend decays under the allowance. A rest is not a verdict (an honest peer with a
    costly config is not lying), so it never counts in the sender's standing. The round's `regeneration_budget`
    bounds what all senders together cost one round; the rest bounds what one sender costs over many: one that names
    a new costly config in every group costs about one `regeneration_timeout` every few minutes instead of a budget
    every round. At most :data:`sapo.standing.MAX_SENDERS` senders are remembered (the one that spent longest ago
    forgotten first, a rested one only when every one is rested).

    Args:
        allowance: seconds of decayed spend over which a sender is rested.
        half_life: seconds in which a sender's spend halves.
    """

    def __init__(self, allowance: float, half_life: float = HALF_LIFE_SECONDS):
        if not allowance > 0:
            raise ValueError(f"allowance must be positive seconds, got {allowance}")
        if not half_life > 0:
            raise ValueError(f"half_life must be positive seconds, got {half_life}")
        self.allowance = allowance
        self.half_life = half_life
        self._spent: OrderedDict[str, tuple[float, float]] = OrderedDict()  # sender -> (seconds, when), oldest first

    def spent(self, sender: str, now: float) -> float:
        """``sender``'s decayed spend at ``now``."""
        seconds, when = self._spent.get(sender, (0.0, now))
        return seconds * 0.5 ** (max(0.0, now - when) / self.half_life)

    def spend(self, sender: str, seconds: float, now: float) -> None:
        """Add ``seconds`` spent re-deriving a group of ``sender`` at ``now``."""
        total = self.spent(sender, now) + max(0.0, seconds)
        self._spent.pop(sender, None)
        self._spent[sender] = (total, now)
        if len(self._spent) > MAX_SENDERS:
            forget = next((s for s in self._spent if not self.is_rested(s, now)), next(iter(self._spent)))
            del self._spent[forget]

    def is_rested(self, sender: str, now: float) -> bool:
        """Whether ``sender``'s spend is over the allowance at ``now``."""
        return self.spent(sender, now) > self.allowance

    def rest_left(self, sender: str, now: float) -> float:
        """Seconds until ``sender``'s spend decays under the allowance (0.0 when it is already under)."""
        spent = self.spent(sender, now)
        return self.half_life * math.log2(spent / self.allowance) if spent > self.allowance else 0.0


class RoundRederivation:
    """What the sources re-derive of each of a round's received groups (their columns, or why they cannot:
    :mod:`sapo.sources`).

    Senders take turns at the sources (:func:`sapo.sources.by_turns`), those ``standing`` found usable lately first, so
    that neither one sender's groups nor new identities spend a per-round bound (reasoning-gym's `regeneration_budget`)
    before the others' are tried. The wall time of each re-derivation that ends in a drop is added to its sender's
    spend in ``costs``, and a rested sender's groups are set aside unread (``rederivation_cost``).

    Identities cost nothing to make, so the senders not found usable lately also share one account, ``newcomers``:
    what their re-derivations cost in vain is added to it as well, and while it is over its allowance their *costly*
    items (:meth:`sapo.sources.SourceRegistry.costly`: reasoning-gym configs this peer does not run itself, whose cost
    the sender chose) are set aside unread as ``rederivation_cost``. Many new identities then cost what one sender
    does; a newcomer on this peer's own configs, and every sender found usable, is never held up by them.

    Args:
        sources: the sources that re-derive.
        costs: each sender's spend (`SAPOConfig.sender_rederivation_seconds`); None: no rest.
        standing: the senders' standing, whose usable senders go first; None: only turns (every sender a newcomer).
        newcomers: the newcomers' shared spend (`SAPOConfig.newcomer_rederivation_seconds`; one account,
            :data:`NEWCOMERS`); None: no shared rest.
    """

    def __init__(
        self,
        sources: SourceRegistry,
        costs: RederivationCosts | None = None,
        standing: SenderStanding | None = None,
        newcomers: RederivationCosts | None = None,
    ):
        self.sources, self.costs, self.standing, self.newcomers = sources, costs, standing, newcomers
        # costly items re-derived and not yet settled (this round's, and those held since): (item, s, newcomer)
        self._unsettled: list[tuple[ReceivedGroup, float, bool]] = []

    def truths(self, received: list[ReceivedGroup]) -> list[dict[str, Any] | GroupDropped]:
        """The columns (or the drop) of each of ``received``, in their order; the sources' per-round bounds start
        afresh. The costly items re-derived are charged at :meth:`settle`, unless used."""
        self.sources.new_round()
        now = time.time()
        known = {item.sender for item in received if self._found_usable(item.sender, now)}
        truths: list[dict[str, Any] | GroupDropped | None] = [None] * len(received)
        own_kind: list[tuple[str, float]] = []  # items of this peer's own kind re-derived: (sender, seconds)
        for i in by_turns([item.sender for item in received], first=known.__contains__):
            truths[i] = self._rederive(received[i], newcomer=received[i].sender not in known, own_kind=own_kind)
        # An item of this peer's own kind costs what is usual for it free, however slow the source: honest senders,
        # drawing items as they come, never rest; one that picks the rare slow items of a user's generator is charged
        # what they cost beyond that, as answers slow to score are.
        self._charge_excess(own_kind)
        return truths

    def settle(self, taken: Collection[int], held: Collection[int] = ()) -> None:
        """Charge the costly items re-derived but not used: a sender whose items its source re-derives slowly but
        correctly, and whose groups are then dropped (too few completions, zero advantage, implausible), pays for them
        as for items that could not be re-derived. ``taken`` and ``held`` are the ``id`` of each :class:`Group` the
        round trained on and the hold keeps for a later round: one held is settled at a later round, charged once it
        leaves the hold unused. By the group object, not its id (the sender's to choose: one id on every group had a
        single group taken spare them all)."""
        pending = []
        for item, seconds, newcomer in self._unsettled:
            if id(item.group) in held:
                pending.append((item, seconds, newcomer))
            elif id(item.group) not in taken:
                self._charge(item.sender, seconds, newcomer)
        self._unsettled = pending

    def charge_scoring(self, scored: Sequence[tuple[str, float]]) -> None:
        """Charge what scoring the round's received groups cost beyond what is free (:func:`scoring_excess`;
        ``scored``: each group's sender and seconds), used or not: answers that keep this peer's reward near its
        deadline cost a sender as groups that could not be re-derived, and rest it at the same allowance."""
        self._charge_excess(scored)

    def _charge_excess(self, spent: Sequence[tuple[str, float]]) -> None:
        """Charge each ``(sender, seconds)`` of a round what it cost beyond what is free (:func:`scoring_excess`)."""
        now = time.time()
        for (sender, _), excess in zip(spent, scoring_excess(spent), strict=True):
            if excess > 0:
                self._charge(sender, excess, newcomer=not self._found_usable(sender, now))

    def _found_usable(self, sender: str, now: float) -> bool:
        """Whether ``standing`` found a group of ``sender`` usable lately (never, without a standing)."""
        return self.standing is not None and self.standing.found_usable(sender, now)

    def _rederive(
        self, item: ReceivedGroup, newcomer: bool, own_kind: list[tuple[str, float]]
    ) -> dict[str, Any] | GroupDropped:
        """The truth of one received group, unless its sender is rested (or it is a newcomer's costly item while the
        newcomers are). The time it took is charged to its sender (and the newcomers) when it could not be
        re-derived; for a costly item re-derived, at :meth:`settle`; for an item of this peer's own kind re-derived,
        added to ``own_kind`` (charged beyond what is usual, :meth:`truths`)."""
        now = time.time()
        if self.costs is not None and self.costs.is_rested(item.sender, now):
            return _rested(self.costs, item.sender, now, "its groups")
        costly = self.sources.costly(item.group)
        if newcomer and costly and self.newcomers is not None and self.newcomers.is_rested(NEWCOMERS, now):
            return _rested(self.newcomers, NEWCOMERS, now, "the costly groups of senders not yet found usable")
        started = time.monotonic()
        try:
            truth = self.sources.columns_for(item.group)
        except GroupDropped as e:
            seconds = time.monotonic() - started
            self._charge(
                item.sender, max(seconds, SOURCE_ERROR_SECONDS) if e.reason == "source_error" else seconds, newcomer
            )
            return e
        seconds = time.monotonic() - started
        if costly:
            self._unsettled.append((item, seconds, newcomer))
        else:
            own_kind.append((item.sender, seconds))
        return truth

    def _charge(self, sender: str, seconds: float, newcomer: bool) -> None:
        """Add ``seconds`` to ``sender``'s spend, and to the newcomers' when it is one."""
        if self.costs is not None:
            _spend(self.costs, sender, seconds, f"sender {sender}", "its groups are")
        if newcomer and self.newcomers is not None:
            _spend(self.newcomers, NEWCOMERS, seconds, "the senders not yet found usable", "their costly items are")


def _rested(costs: RederivationCosts, account: str, now: float, whose: str) -> GroupDropped:
    """The drop of a group whose ``account`` is rested."""
    spent, left = costs.spent(account, now), costs.rest_left(account, now)
    return GroupDropped(
        "rederivation_cost",
        f"{whose} cost {spent:.1f} s of re-derivation and scoring lately (allowance {costs.allowance:g} s); "
        f"rested {left:.0f} s more",
    )


def _spend(costs: RederivationCosts, account: str, seconds: float, who: str, set_aside: str) -> None:
    """Add ``seconds`` to ``account``'s spend, and say so when that rests it."""
    now = time.time()
    was_rested = costs.is_rested(account, now)
    costs.spend(account, seconds, now)
    if not was_rested and costs.is_rested(account, now):
        logger.info(
            "resting %s for %.0f s: re-deriving in vain and scoring cost %.1f s lately (allowance %g s); %s set aside "
            "unread meanwhile, never held against a sender's standing",
            who, costs.rest_left(account, now), costs.spent(account, now), costs.allowance, set_aside,
        )  # fmt: skip
