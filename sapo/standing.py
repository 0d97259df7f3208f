"""Per-sender standing: a peer whose recent groups keep being dropped is not sampled from for a while."""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass

MAX_BENCH_SECONDS = 24 * 3600.0
"""The longest a sender is benched, however often it was benched before."""

MAX_SENDERS = 10_000
"""Senders whose record is kept (identities are free: the memory of them is bounded); beyond it, the one heard of
longest ago is forgotten, a benched one only when every one is benched."""


@dataclass
class _Record:
    outcomes: deque[bool]  # True: the group was usable; False: dropped (mismatch, malformed, hygiene, implausible, ...)
    benched_until: float = 0.0
    times_benched: int = 0


class SenderStanding:
    """Remembers, per sender, whether its last ``window`` received groups were usable or dropped.

    A sender with at least ``drop_limit`` drops among them is benched: its groups are set aside unread (counted as
    ``benched_sender``) for ``bench_seconds``, twice as long each further time it is benched (at most a day), and its
    record starts over. Zero-advantage groups are not drops (honest peers send them); only groups this node refused
    are. At most :data:`MAX_SENDERS` senders are remembered.

    Args:
        drop_limit: drops within the window that bench a sender.
        window: how many of a sender's latest groups are remembered.
        bench_seconds: how long a sender is benched the first time.
    """

    def __init__(self, drop_limit: int = 5, window: int = 10, bench_seconds: float = 600.0):
        if not 1 <= drop_limit <= window:
            raise ValueError(f"drop_limit must be in [1, window={window}], got {drop_limit}")
        if bench_seconds <= 0:
            raise ValueError(f"bench_seconds must be positive, got {bench_seconds}")
        self.drop_limit = drop_limit
        self.window = window
        self.bench_seconds = bench_seconds
        self._records: OrderedDict[str, _Record] = OrderedDict()  # least recently noted first

    def is_benched(self, sender: str, now: float) -> bool:
        """True while ``sender`` serves its bench time."""
        record = self._records.get(sender)
        return record is not None and now < record.benched_until

    def found_usable(self, sender: str, now: float) -> bool:
        """Whether one of ``sender``'s remembered groups was usable and it is not benched at ``now``."""
        record = self._records.get(sender)
        return record is not None and now >= record.benched_until and True in record.outcomes

    def record(self, sender: str, usable: bool, now: float) -> float | None:
        """Note one received group of ``sender``; returns the seconds it is now benched for if this outcome benched
        it, else None."""
        record = self._records.pop(sender, None) or _Record(deque(maxlen=self.window))
        self._records[sender] = record
        if len(self._records) > MAX_SENDERS:
            forget = next((s for s, r in self._records.items() if now >= r.benched_until), next(iter(self._records)))
            del self._records[forget]
        record.outcomes.append(usable)
        if record.outcomes.count(False) < self.drop_limit:
            return None
        seconds = min(self.bench_seconds * 2**record.times_benched, MAX_BENCH_SECONDS)
        record.benched_until = now + seconds
        record.times_benched += 1
        record.outcomes.clear()
        return seconds

    def benched(self, now: float) -> list[str]:
        """Senders benched at ``now``."""
        return [sender for sender, record in self._records.items() if now < record.benched_until]
