"""The swarm hold: usable received groups a round's sampler left unchosen, offered again to the next rounds.

The transport returns a received group once; without a hold, a usable group the sampler did not choose is gone. With
`SAPOConfig.swarm_hold` = N, the intake keeps N of them, senders taking turns, the newest first, and offers them beside
the next round's fetched groups, until one is taken, turns older than `max_group_age` (the sampler sets it aside as
stale) or its sender is benched (the intake sets it aside). A held group is judged for plausibility under the policy of
the round that takes it. The hold lives in memory only: a restarted node starts with none.
"""

from __future__ import annotations

from collections import Counter

from sapo.sampling import SWARM, Candidate


class SwarmHold:
    """The newest usable received groups left unchosen, at most ``size`` of them, for the next round's sampler.

    Each round that reads the swarm calls :meth:`offer` (which empties the hold into that round's candidates) and then
    :meth:`keep` with the usable groups it left unchosen; a round that does not read the swarm calls neither, and the
    hold stays as it was.

    Args:
        size: how many groups it keeps (`SAPOConfig.swarm_hold`); 0 keeps none.
    """

    def __init__(self, size: int):
        if size < 0:
            raise ValueError(f"size must be at least 0, got {size}")
        self.size = size
        self.groups: list[Candidate] = []
        self._offered: set[int] | None = None  # ids of the groups handed to this round; None: not offered this round

    def __len__(self) -> int:
        return len(self.groups)

    def new_round(self) -> None:
        """Forget which groups the last round was offered (a round that does not read the swarm keeps the hold)."""
        self._offered = None

    def offer(self) -> list[Candidate]:
        """Every held group, handed to this round's candidates; the hold is empty until :meth:`keep` refills it."""
        offered, self.groups = self.groups, []
        self._offered = {id(c) for c in offered}
        return offered

    def was_offered(self, candidate: Candidate) -> bool:
        """Whether ``candidate`` came to this round from the hold."""
        return self._offered is not None and id(candidate) in self._offered

    def keep(self, left: list[Candidate], now: float) -> list[Candidate]:
        """Keep `size` received groups of ``left`` (a round's usable unchosen candidates), senders taking turns (each
        sender's newest, then each one's second newest, ...; within a turn the newest first); returns them. One sender
        thus holds at most its turn's share while others have groups left: the newest alone went to whoever dated its
        groups latest, so that one sender filled the hold and took its slots beside its share of each fetch. In a round
        that was not offered the hold (it did not read the swarm) the hold stays as it was and none is kept. A creation
        time ahead of ``now`` (this peer's clock) counts as ``now``: it buys no precedence."""
        if self._offered is None:
            return []
        received = sorted(
            (c for c in left if c.origin == SWARM), key=lambda c: min(c.group.created_at, now), reverse=True
        )
        turns: Counter[str] = Counter()
        ranked = []
        for candidate in received:  # newest first: a sender's n-th newest has turn n
            ranked.append((turns[candidate.sender], candidate))
            turns[candidate.sender] += 1
        # a stable sort by turn keeps each turn newest first
        self.groups = [candidate for _, candidate in sorted(ranked, key=lambda r: r[0])][: self.size]
        return self.groups
