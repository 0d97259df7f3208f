"""How a peer chooses the external groups it trains on among the candidates the swarm delivered."""

from __future__ import annotations

import random
import time
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from swarm.records import Group


@dataclass
class Candidate:
    """An external group, verified and scored with this peer's own reward functions.

    Parameters:
        sender (`str`): verified identity of the peer that published the group.
        group (`swarm.records.Group`): the group as received.
        rewards (`list[float]`): this peer's reward of each completion (NaN where no reward function applied).
        columns (`dict[str, Any]`): reward columns re-derived by this peer (answer, entry, ...).
    """

    sender: str
    group: Group
    rewards: list[float]
    columns: dict[str, Any] = field(default_factory=dict)

    @property
    def has_zero_advantage(self) -> bool:
        """True when every completion got the same reward: such a group gives GRPO no learning signal."""
        finite = [r for r in self.rewards if r == r]
        return len(set(finite)) <= 1


@dataclass
class Selection:
    """The groups chosen for one round, and how many candidates were set aside and why."""

    chosen: list[Candidate]
    dropped: Counter[str] = field(default_factory=Counter)


class ExternalSampler(ABC):
    """Chooses up to ``k`` candidates; subclasses decide which are eligible and how to draw among them.

    The base class applies the rules every strategy shares: never take one's own groups back, respect the
    staleness bound, and cap the groups of any one sender.

    Parameters:
        max_groups_per_peer (`int` or `None`): most groups of one sender per round; `None` for no cap.
        max_group_age (`float` or `None`): seconds after which a group is stale; `None` for no bound.
        self_id (`str` or `None`): this peer's identity; its own groups are never chosen.
    """

    def __init__(
        self,
        max_groups_per_peer: int | None = None,
        max_group_age: float | None = None,
        self_id: str | None = None,
    ):
        self.max_groups_per_peer = max_groups_per_peer
        self.max_group_age = max_group_age
        self.self_id = self_id

    def select(
        self, candidates: Sequence[Candidate], k: int, rng: random.Random, now: float | None = None
    ) -> Selection:
        """Choose up to ``k`` of ``candidates``; return them with the count of set-aside ones by reason."""
        now = time.time() if now is None else now
        dropped: Counter[str] = Counter()
        eligible = []
        for candidate in candidates:
            reason = self._reject_reason(candidate, now)
            if reason is None:
                eligible.append(candidate)
            else:
                dropped[reason] += 1
        chosen, per_peer = [], Counter()
        for candidate in self.order(eligible, rng):
            if len(chosen) == k:
                break
            if self.max_groups_per_peer is not None and per_peer[candidate.sender] >= self.max_groups_per_peer:
                dropped["peer_cap"] += 1
                continue
            per_peer[candidate.sender] += 1
            chosen.append(candidate)
        return Selection(chosen=chosen, dropped=dropped)

    def _reject_reason(self, candidate: Candidate, now: float) -> str | None:
        if self.self_id is not None and candidate.sender == self.self_id:
            return "own_group"
        if self.max_group_age is not None and now - candidate.group.created_at > self.max_group_age:
            return "stale"
        return self.reject_reason(candidate)

    def reject_reason(self, candidate: Candidate) -> str | None:
        """Strategy-specific eligibility: a short reason to set ``candidate`` aside, or None to keep it."""
        return None

    @abstractmethod
    def order(self, eligible: list[Candidate], rng: random.Random) -> list[Candidate]:
        """The eligible candidates in the order they should be taken."""


class UniformSampler(ExternalSampler):
    """Uniform sampling among eligible candidates."""

    def order(self, eligible: list[Candidate], rng: random.Random) -> list[Candidate]:
        return rng.sample(eligible, len(eligible))


class PaperSampler(UniformSampler):
    """The SAPO paper's rule: drop groups whose local rewards are all equal, then sample uniformly."""

    def reject_reason(self, candidate: Candidate) -> str | None:
        return "zero_advantage" if candidate.has_zero_advantage else None


SAMPLERS: dict[str, type[ExternalSampler]] = {"paper": PaperSampler, "uniform": UniformSampler}


def make_sampler(
    name: str, max_groups_per_peer: int | None = None, max_group_age: float | None = None, self_id: str | None = None
) -> ExternalSampler:
    """Build the sampler registered under ``name`` (``"paper"`` or ``"uniform"``)."""
    if name not in SAMPLERS:
        raise ValueError(f"sampling_strategy={name!r} is unknown; choose one of {sorted(SAMPLERS)}")
    return SAMPLERS[name](max_groups_per_peer=max_groups_per_peer, max_group_age=max_group_age, self_id=self_id)
