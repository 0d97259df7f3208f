"""Per-sender counts of received groups, kept for a bounded number of senders (identities cost nothing to make)."""

from __future__ import annotations

from collections import Counter

OTHER_SENDERS = "(other senders)"
"""The name under which the counts of senders no longer tallied by name are summed (no key fingerprint looks so)."""

MAX_TALLIED_SENDERS = 512
"""Senders counted by name: the most recently counted ones."""


class SenderTally(dict[str, Counter[str]]):
    """Counts by sender (``"taken"``, ``"dropped/<reason>"``, ``"refused/<reason>"``): the ``max_senders`` senders
    counted most recently each under its name, the counts of the others summed under :data:`OTHER_SENDERS`, so that a
    peer making fresh identities grows neither this node's memory nor its status page, checkpoints and
    ``senders.json``. Totals over all senders stay exact. Read it as a dict; count with :meth:`count`.

    Args:
        max_senders: how many senders are counted by name (default :data:`MAX_TALLIED_SENDERS`).
    """

    def __init__(self, max_senders: int = MAX_TALLIED_SENDERS):
        super().__init__()
        if max_senders < 1:
            raise ValueError(f"max_senders must be at least 1, got {max_senders}")
        self.max_senders = max_senders

    def count(self, sender: str, key: str, n: int = 1) -> None:
        """Add ``n`` to ``sender``'s ``key``; the sender counted least recently beyond the bound is summed into
        :data:`OTHER_SENDERS`."""
        counts = self.pop(sender, None) or Counter()
        counts[key] += n
        self[sender] = counts  # a dict keeps insertion order: the most recently counted last
        if len(self) - (OTHER_SENDERS in self) > self.max_senders:
            oldest = next(name for name in self if name != OTHER_SENDERS)
            self.setdefault(OTHER_SENDERS, Counter()).update(self.pop(oldest))

    def taken(self) -> Counter[str]:
        """Groups trained on, by sender (those with at least one)."""
        return Counter({sender: counts["taken"] for sender, counts in self.items() if counts["taken"]})
