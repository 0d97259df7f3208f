"""Self-replay: this peer's own earlier groups with reward spread, kept a few steps and offered to its external slots.

Each round, the groups generated here whose rewards differ are remembered as ready-to-train candidates (origin
`"replay"`): the prompt this peer trained them under, the tokens it sampled, the rewards it gave them. The intake offers
them to the slots the swarm does not fill (`SAPOConfig.replay="fill"`) or to every external slot instead of the swarm
(`"only"`, the control a swarm is measured against); the sampler and the plausibility check judge them as they judge a
received group, and the round trains on them as external rows (no sampling log-probabilities, no importance-sampling
correction: off-policy rows are handled as the swarm's are). A group is offered for `replay_max_age` steps after the
step that generated it and trained on again at most `replay_max_uses` times.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sapo.publication import group_id, row_provenance
from sapo.sampling import REPLAY, Candidate, TokenizedCompletion
from swarm.records import Group


@dataclass
class _Entry:
    candidate: Candidate
    step: int
    uses: int = 0


class ReplayBuffer:
    """This peer's own groups with reward spread, offered again for a bounded number of steps and uses.

    Args:
        max_age: steps after the generating step during which a group is offered (`SAPOConfig.replay_max_age`).
        max_uses: times a group may be trained on again (`SAPOConfig.replay_max_uses`).
    """

    def __init__(self, max_age: int, max_uses: int):
        if max_age < 1 or max_uses < 1:
            raise ValueError(f"max_age and max_uses must be at least 1, got {max_age} and {max_uses}")
        self.max_age, self.max_uses = max_age, max_uses
        self._entries: dict[str, _Entry] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, candidates: Sequence[Candidate], step: int) -> int:
        """Remember the groups of ``candidates`` generated at ``step`` whose rewards differ; returns how many."""
        kept = [c for c in candidates if not c.has_zero_advantage]
        for candidate in kept:
            self._entries[candidate.group.group_id] = _Entry(candidate, step)
        return len(kept)

    def offer(self, step: int) -> list[Candidate]:
        """The groups that may be replayed at ``step``: generated at most `max_age` steps before it (and before it:
        never the step's own); older ones are forgotten. A group used `max_uses` times is not held any more
        (:meth:`taken` forgets it)."""
        self._entries = {k: e for k, e in self._entries.items() if step - e.step <= self.max_age}
        return [e.candidate for e in self._entries.values() if e.step < step]

    def taken(self, candidates: Sequence[Candidate]) -> None:
        """Count one use of each replayed group of ``candidates`` (a round trained on them); a group used
        `max_uses` times is forgotten."""
        for candidate in candidates:
            entry = self._entries.get(candidate.group.group_id)
            if candidate.origin != REPLAY or entry is None:
                continue
            entry.uses += 1
            if entry.uses >= self.max_uses:
                del self._entries[candidate.group.group_id]

    def state(self) -> dict[str, Any]:
        """How many groups are held and their steps (for logs and tests)."""
        return {"groups": len(self._entries), "steps": sorted({e.step for e in self._entries.values()})}


def own_candidates(
    rows: Sequence[dict[str, Any]],
    group_starts: Sequence[int],
    completion_ids: dict[int, Sequence[int]],
    completion_texts: dict[int, str],
    rewards_per_func: Sequence[Sequence[float]],
    rewards: Sequence[float],
    num_generations: int,
    step: int,
    process: int,
    sender: str,
    model: str,
    created_at: float,
) -> list[Candidate]:
    """The groups generated here in a round as replay candidates: for each group (its first row in ``group_starts``),
    the prompt and columns of its row, the tokens sampled for its rows (``completion_ids``: row -> ids, as trained on),
    their texts, and each row's rewards per function and weighted total (``rewards_per_func``, ``rewards``, indexed
    by row, as TRL scored them). Nothing is cut: the tokens are the ones sampled, within `max_completion_length`."""
    candidates = []
    for index, start in enumerate(group_starts):
        row = rows[start]
        members = range(start, start + num_generations)
        per_func = [[float(v) for v in rewards_per_func[i]] for i in members]
        tokenized = [TokenizedCompletion(tuple(int(t) for t in completion_ids[i]), False, completion_texts[i])
                     for i in members]  # fmt: skip
        group = Group(
            group_id=group_id(step, process, index),
            prompt=row["prompt"],  # the prompt it was trained under, system messages included (never published)
            completions=[t.text for t in tokenized],
            provenance=row_provenance(row),
            metadata={},
            model=model,
            step=step,
            created_at=created_at,
        )
        columns = {k: v for k, v in row.items() if k != "prompt"}
        group_rewards = [float(rewards[i]) for i in members]
        candidates.append(Candidate(sender, group, group_rewards, columns, per_func, tokenized, origin=REPLAY))
    return candidates
