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
        group (`swarm.records.Group`): the group as received, its prompt rewritten by this peer around the verified
            question (the sender's prompt is never trained on).
        rewards (`list[float]`): this peer's reward of each completion (NaN where no reward function applied).
        columns (`dict[str, Any]`): reward columns re-derived by this peer (answer, entry, ...).
        rewards_per_func (`list[list[float]]`): per completion, each reward function's value (NaN where it did not
            apply), of which `rewards` is the weighted sum: what the round trains with when the group is chosen.
    """

    sender: str
    group: Group
    rewards: list[float]
    columns: dict[str, Any] = field(default_factory=dict)
    rewards_per_func: list[list[float]] = field(default_factory=list)

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

    def is_stale(self, group: Group, now: float) -> bool:
        """True if ``group`` is older than ``max_group_age`` at ``now`` (the one staleness rule of a node)."""
        return self.max_group_age is not None and now - group.created_at > self.max_group_age

    def _reject_reason(self, candidate: Candidate, now: float) -> str | None:
        if self.self_id is not None and candidate.sender == self.self_id:
            return "own_group"
        if self.is_stale(candidate.group, now):
            return "stale"
        return self.reject_reason(candidate)

    def reject_reason(self, candidate: Candidate) -> str | None:
        """Strategy-specific eligibility: a short reason to set ``candidate`` aside, or None to keep it."""
        return None

    @abstractmethod
    def order(self, eligible: list[Candidate], rng: random.Random) -> list[Candidate]:
        """The eligible candidates in the order they should be taken."""


class UniformSampler(ExternalSampler):
    """Samples uniformly among the eligible candidates."""

    def order(self, eligible: list[Candidate], rng: random.Random) -> list[Candidate]:
        return rng.sample(eligible, len(eligible))


class DropZeroAdvantageSampler(UniformSampler):
    """Drops groups whose local rewards are all equal (zero advantage: no GRPO signal), then samples uniformly: the
    SAPO paper's rule."""

    def reject_reason(self, candidate: Candidate) -> str | None:
        return "zero_advantage" if candidate.has_zero_advantage else None


PaperSampler = DropZeroAdvantageSampler
"""The former name of :class:`DropZeroAdvantageSampler`, kept so that existing imports work."""

SAMPLERS: dict[str, type[ExternalSampler]] = {
    "drop_zero_advantage": DropZeroAdvantageSampler,
    "uniform": UniformSampler,
}
"""Every sampling strategy by name: the one list that `SAPOConfig.sampling_strategy` accepts and documents."""

SAMPLER_ALIASES: dict[str, str] = {"paper": "drop_zero_advantage"}
"""Other accepted names: `"paper"` was the name of `"drop_zero_advantage"` before names said what they do."""


def sampler_name(name: str) -> str:
    """The registered name of strategy ``name`` (an alias resolved); ValueError for an unknown name."""
    name = SAMPLER_ALIASES.get(name, name)
    if name not in SAMPLERS:
        raise ValueError(
            f"sampling_strategy={name!r} is unknown; choose one of {[*SAMPLERS, *SAMPLER_ALIASES]} "
            "or pass a sapo.sampling.ExternalSampler to SAPOTrainer(sampler=...)."
        )
    return name


def describe_samplers() -> str:
    """One line per strategy name, from its class docstring: the text `SAPOConfig.sampling_strategy` shows."""
    aliases = {target: alias for alias, target in SAMPLER_ALIASES.items()}
    parts = []
    for name, cls in SAMPLERS.items():
        summary = " ".join((cls.__doc__ or "").split())
        alias = f' (alias `"{aliases[name]}"`)' if name in aliases else ""
        parts.append(f'`"{name}"`{alias} {summary[0].lower()}{summary[1:].rstrip(".")}')
    return "; ".join(parts)


def make_sampler(
    name: str, max_groups_per_peer: int | None = None, max_group_age: float | None = None, self_id: str | None = None
) -> ExternalSampler:
    """Build the sampler registered under ``name`` (a key of :data:`SAMPLERS` or :data:`SAMPLER_ALIASES`)."""
    sampler = SAMPLERS[sampler_name(name)]
    return sampler(max_groups_per_peer=max_groups_per_peer, max_group_age=max_group_age, self_id=self_id)
