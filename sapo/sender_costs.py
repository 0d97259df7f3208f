"""Per-sender cost: a sender whose received groups lately cost this node too much time to re-derive is rested."""

from __future__ import annotations

import math
from collections import OrderedDict

from sapo.standing import MAX_SENDERS

HALF_LIFE_SECONDS = 300.0
"""How fast a sender's re-derivation spend is forgotten: it halves every five minutes."""


class RederivationCosts:
    """Wall seconds this node spent re-deriving each sender's received groups (:mod:`sapo.sources`; reasoning-gym's
    foreign configs run in a child process, up to `regeneration_timeout` each), halving every ``half_life`` seconds.

    A sender whose spend is at ``allowance`` or over is *rested*: its groups are set aside unread
    (``rederivation_cost``) until the spend decays under the allowance. A rest is not a verdict (an honest peer with a
    costly config is not lying), so it never counts in the sender's standing. The round's `regeneration_budget`
    bounds what all senders together cost one round; the rest bounds what one sender costs over many: one that names
    a new costly config in every group costs about one `regeneration_timeout` every few minutes instead of a budget
    every round. At most :data:`sapo.standing.MAX_SENDERS` senders are remembered (the one that spent longest ago
    forgotten first).

    Args:
        allowance: seconds of decayed spend at which a sender is rested.
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
            self._spent.popitem(last=False)

    def is_rested(self, sender: str, now: float) -> bool:
        """Whether ``sender``'s spend is at the allowance or over at ``now``."""
        return self.spent(sender, now) >= self.allowance

    def rest_left(self, sender: str, now: float) -> float:
        """Seconds until ``sender``'s spend decays under the allowance (0.0 when it is already under)."""
        spent = self.spent(sender, now)
        return self.half_life * math.log2(spent / self.allowance) if spent >= self.allowance else 0.0
