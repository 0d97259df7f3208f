"""Re-deriving a round's received groups: senders in turns, those found usable first, and a sender whose groups cost
too much time lately rested."""

from __future__ import annotations

import logging
import math
import time
from collections import OrderedDict
from typing import Any

from sapo.questions import GroupDropped
from sapo.sources import SourceRegistry, by_turns
from sapo.standing import MAX_SENDERS, SenderStanding
from swarm.records import ReceivedGroup

logger = logging.getLogger(__name__)

HALF_LIFE_SECONDS = 300.0
"""How fast a sender's re-derivation spend is forgotten: it halves every five minutes."""


class RederivationCosts:
    """Wall seconds this node spent trying to re-derive each sender's received groups in vain (:mod:`sapo.sources`: the
    groups dropped there; reasoning-gym's foreign configs run in a child process, up to `regeneration_timeout` each),
    halving every ``half_life`` seconds. Groups re-derived count nothing, however slow their source.

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

    Args:
        sources: the sources that re-derive.
        costs: each sender's spend (`SAPOConfig.sender_rederivation_seconds`); None: no rest.
        standing: the senders' standing, whose usable senders go first; None: only turns.
    """

    def __init__(
        self, sources: SourceRegistry, costs: RederivationCosts | None = None, standing: SenderStanding | None = None
    ):
        self.sources, self.costs, self.standing = sources, costs, standing

    def truths(self, received: list[ReceivedGroup]) -> list[dict[str, Any] | GroupDropped]:
        """The columns (or the drop) of each of ``received``, in their order; the sources' per-round bounds start
        afresh."""
        self.sources.new_round()
        now = time.time()
        usable = (lambda sender: False) if self.standing is None else (lambda s: self.standing.found_usable(s, now))
        truths: list[dict[str, Any] | GroupDropped | None] = [None] * len(received)
        for i in by_turns([item.sender for item in received], first=usable):
            truths[i] = self._rederive(received[i])
        return truths

    def _rederive(self, item: ReceivedGroup) -> dict[str, Any] | GroupDropped:
        """The truth of one received group, unless its sender is rested; the time it took, when it could not be
        re-derived, is added to its sender's spend."""
        now = time.time()
        if self.costs is not None and self.costs.is_rested(item.sender, now):
            spent, left = self.costs.spent(item.sender, now), self.costs.rest_left(item.sender, now)
            return GroupDropped(
                "rederivation_cost",
                f"its groups cost {spent:.1f} s of re-derivation lately (allowance {self.costs.allowance:g} s); "
                f"rested {left:.0f} s more",
            )
        started = time.monotonic()
        try:
            return self.sources.columns_for(item.group)
        except GroupDropped as e:
            # only what yielded nothing counts: a source that is slow on honest items never rests their senders
            if self.costs is not None:
                self._spend(item.sender, time.monotonic() - started)
            return e

    def _spend(self, sender: str, seconds: float) -> None:
        """Add ``seconds`` to ``sender``'s spend, and say so when that rests it."""
        now = time.time()
        was_rested = self.costs.is_rested(sender, now)
        self.costs.spend(sender, seconds, now)
        if not was_rested and self.costs.is_rested(sender, now):
            logger.info(
                "resting sender %s for %.0f s: its groups cost %.1f s of re-derivation lately (allowance %g s, "
                "sender_rederivation_seconds); its groups are set aside unread meanwhile, not held against it",
                sender, self.costs.rest_left(sender, now), self.costs.spent(sender, now), self.costs.allowance,
            )  # fmt: skip
