"""The SAPO round as a value: the rows of one TRL generation batch, which of them are external, and what they carry.

A round is built before TRL runs (:func:`build_round`) from the rows TRL drew and the intake's outcome: this process's
external groups replace the questions of the last group slots; every other slot keeps its own question (a fill-in
when the swarm gave fewer groups than slots). Each external row carries its completion already tokenized under this
peer's tokenizer, its rewards under this peer's reward functions and its token weights, so TRL's hooks only splice
them in (:func:`splice_generation`, :func:`splice_rewards`) and nothing is tokenized or scored twice.

What TRL produces for the round (the completions generated here and every row's reward) is collected in a
:class:`RoundOutcome`, read after TRL has scored the batch: what is published and logged.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, NamedTuple

import torch

from sapo.sampling import SWARM, Candidate

EXTERNAL_COLUMN = "sapo_is_external"
"""The column of TRL's training batch that marks external rows (a bool tensor): how the loss pass tells the node's own
completions from received ones after TRL has shuffled and split the batch."""


@dataclass(frozen=True)
class ExternalRow:
    """One row of a received group, as this peer trains on it.

    Parameters:
        sender (`str`): the peer that published the group.
        group_id (`str`): the group's id.
        index (`int`): the completion's position in its group.
        text (`str`): the completion as scored and trained on (cut to `max_completion_length` when longer).
        ids (`tuple[int, ...]`): its tokens under this peer's tokenizer (cut to `max_completion_length`, EOS appended
            when it fits).
        token_weights (`tuple[int, ...]`): per token, 1 to train on it, 0 to leave it out of the loss.
    """

    sender: str
    group_id: str
    index: int
    text: str
    ids: tuple[int, ...]
    token_weights: tuple[int, ...]


@dataclass(frozen=True)
class Round:
    """One process's share of a SAPO round.

    Parameters:
        rows (`tuple[dict, ...]`): the batch rows TRL trains on: own rows as drawn, external rows with the prompt this
            peer wrote around the question it re-derived, and the columns it re-derived.
        external (`Mapping[int, ExternalRow]`): row index -> the external completion of that row.
        chosen (`tuple[Candidate, ...]`): the external groups of every process (one common selection, each process
            taking an equal share), with this peer's rewards.
        share (`tuple[Candidate, ...]`): this process's part of `chosen`, in slot order.
        first_slot (`int`): the group slot the external groups start at (the same on every process).
        num_generations (`int`): rows per group.
    """

    rows: tuple[dict[str, Any], ...]
    external: MappingProxyType[int, ExternalRow]
    chosen: tuple[Candidate, ...]
    share: tuple[Candidate, ...]
    first_slot: int
    num_generations: int

    @property
    def own_rows(self) -> list[int]:
        """Indices of the rows generated here."""
        return [i for i in range(len(self.rows)) if i not in self.external]

    @property
    def is_external(self) -> list[bool]:
        """Per row, whether it holds a received completion."""
        return [i in self.external for i in range(len(self.rows))]

    @property
    def own_group_starts(self) -> list[int]:
        """The first row of each group generated here."""
        return [s for s in range(0, len(self.rows), self.num_generations) if s not in self.external]


@dataclass
class RoundOutcome:
    """What TRL produced for a round: the completions generated here and every row's reward.

    Parameters:
        own_completions (`dict[int, Any]`): row index -> the completion generated here (TRL's form: text, or chat
            messages).
        own_completion_ids (`dict[int, list[int]]`): row index -> the tokens sampled for it.
        rewards_per_func (`torch.Tensor` or `None`): each row of this process x each reward function, once TRL scored
            them.
        rewards (`torch.Tensor` or `None`): the weighted reward of each row of this process, once TRL scored them.
    """

    own_completions: dict[int, Any] = field(default_factory=dict)
    own_completion_ids: dict[int, list[int]] = field(default_factory=dict)
    rewards_per_func: torch.Tensor | None = None
    rewards: torch.Tensor | None = None


def build_round(
    inputs: Sequence[dict[str, Any]],
    chosen: Sequence[Candidate],
    share: Sequence[Candidate],
    first_slot: int,
    num_generations: int,
) -> Round:
    """The round of one process: ``share`` (this process's part of the common selection ``chosen``) in the group
    slots from ``first_slot`` on; every other row as TRL drew it. External rows keep the columns of the drawn rows
    (TRL's batch needs the same keys in every row), filled from what this peer re-derived for the group."""
    rows = [dict(row) for row in inputs]
    keys = list(inputs[0].keys())
    external: dict[int, ExternalRow] = {}
    for slot, candidate in enumerate(share, start=first_slot):
        for k, tokens in enumerate(candidate.tokenized):
            i = slot * num_generations + k
            rows[i] = {**{key: candidate.columns.get(key) for key in keys}, "prompt": candidate.group.prompt}
            weights = candidate.token_weights[k] if candidate.token_weights is not None else [1] * len(tokens.ids)
            # the text scored and trained on (cut to max_completion_length), not the sender's whole text
            sent_by = (candidate.sender, candidate.group.group_id)
            external[i] = ExternalRow(*sent_by, k, tokens.text, tokens.ids, tuple(weights))
    return Round(tuple(rows), MappingProxyType(external), tuple(chosen), tuple(share), first_slot, num_generations)


class Generation(NamedTuple):
    """What TRL's generation step returns for a batch's rows, one list entry per row, in TRL's order.

    Parameters:
        prompt_ids (`list[list[int]]`): each row's prompt tokens.
        completion_ids (`list[list[int]]`): each row's completion tokens.
        token_mask (`list[list[int]]` or `None`): per row, 1 for each completion token in the loss and 0 for each
            left out (TRL's `tool_mask`); None: every token.
        completions (`list[Any]`): each row's completion (text or chat messages).
        logprobs (`list[list[float]]` or `None`): each completion token's sampling log-probability; None: not kept.
    """

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    token_mask: list[list[int]] | None
    completions: list[Any]
    logprobs: list[list[float]] | None


def splice_generation(round_: Round, own: Generation, external_prompt_ids: list[list[int]]) -> Generation:
    """Every row of the round for TRL: own rows from ``own`` (the rows generated here, in order), external rows from
    the round (their prompt ids from ``external_prompt_ids``, in row order). External rows have no sampling
    log-probabilities: NaN, which TRL's importance-sampling correction reads as "no correction"."""
    own_prompt_ids, own_completion_ids, own_mask, own_completions, own_logprobs = own
    size = len(round_.rows)
    prompt_ids: list[list[int]] = [[] for _ in range(size)]
    completion_ids: list[list[int]] = [[] for _ in range(size)]
    completions: list[Any] = [None] * size
    logprobs: list[list[float]] | None = None if own_logprobs is None else [[] for _ in range(size)]
    for j, i in enumerate(round_.own_rows):
        prompt_ids[i], completion_ids[i], completions[i] = own_prompt_ids[j], own_completion_ids[j], own_completions[j]
        if logprobs is not None:
            logprobs[i] = own_logprobs[j]
    for ids, (i, row) in zip(external_prompt_ids, sorted(round_.external.items()), strict=True):
        prompt_ids[i], completion_ids[i] = list(ids), list(row.ids)
        completions[i] = [{"role": "assistant", "content": row.text}]
        if logprobs is not None:
            logprobs[i] = [float("nan")] * len(row.ids)
    token_mask = None  # TRL's per-token loss mask (its `tool_mask`): 0 for tokens left out of the loss
    if own_mask is not None or any(0 in row.token_weights for row in round_.external.values()):
        own_mask = own_mask or [[1] * len(completion_ids[i]) for i in round_.own_rows]
        own_weights = dict(zip(round_.own_rows, own_mask, strict=True))
        token_mask = [list(round_.external[i].token_weights) if i in round_.external else own_weights[i]
                      for i in range(size)]  # fmt: skip
    return Generation(prompt_ids, completion_ids, token_mask, completions, logprobs)


def splice_rewards(round_: Round, own_scored: torch.Tensor, processes: int, num_reward_funcs: int) -> torch.Tensor:
    """The rewards (rows of every process x reward functions) as TRL's reward step gathers them: own rows from
    ``own_scored`` (gathered, process by process, each process holding the same number of own rows), external rows
    as the intake scored them. Every process placed its share of the common selection from the same slot on, so each
    knows where every process's external rows are."""
    rows, size, own = len(round_.rows), round_.num_generations, round_.own_rows
    share = len(round_.chosen) // processes
    rewards = torch.empty(processes * rows, num_reward_funcs, device=own_scored.device)
    for p in range(processes):
        if own:
            rewards[[p * rows + i for i in own]] = own_scored[p * len(own) : (p + 1) * len(own)]
        for slot, candidate in enumerate(round_.chosen[p * share : (p + 1) * share], start=round_.first_slot):
            first = p * rows + slot * size
            rewards[first : first + size] = torch.tensor(candidate.rewards_per_func, device=rewards.device)
    return rewards


def weighted_rewards(rewards_per_func: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The reward of each row (on the CPU): the weighted sum over reward functions, as TRL totals them; NaN (not
    applicable) terms are left out, and a row no function applies to stays NaN."""
    rewards_per_func = rewards_per_func.detach().float().cpu()
    weighted = (rewards_per_func * weights.detach().float().cpu().unsqueeze(0)).nansum(dim=1)
    weighted[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
    return weighted


def round_figures(
    round_: Round, outcome: RoundOutcome, slots: int, scored: int, zero_advantage: int, step: int
) -> dict[str, float]:
    """One process's figures of a round (`sapo/<name>`): swarm groups taken, own groups replayed, fill-ins, distinct
    senders, the share of scored candidates with zero advantage, the mean age and median step lag of what was taken
    (swarm and replayed alike), and the mean reward of own rows, external rows, and own rows of groups with reward
    spread (the ones the paper's sampler would have kept: like with like against the external groups, which it chose
    that way)."""
    external = round_.share
    received = [c for c in external if c.origin == SWARM]
    figures = {
        "sapo/external_groups": float(len(received)),
        "sapo/replay_groups": float(len(external) - len(received)),
        "sapo/fill_ins": float(slots - len(external)),
        "sapo/distinct_senders": float(len({c.sender for c in received})),
    }
    if scored:
        figures["sapo/zero_advantage_fraction"] = zero_advantage / scored
    if external:  # staleness of what is trained on: seconds since the sender made it, and its policy's lag
        now = time.time()
        figures["sapo/external_age_seconds"] = sum(now - c.group.created_at for c in external) / len(external)
        # a median: the step is the sender's word, and one sender's 2**63 - 1 would make the mean of every round it
        # takes part in unreadable (its group log line still says what it claimed)
        figures["sapo/external_step_lag"] = float(statistics.median(step - c.group.step for c in external))
    rewards = outcome.rewards
    if rewards is None:
        return figures
    is_external = torch.tensor(round_.is_external, dtype=torch.bool)
    groups = rewards.view(-1, round_.num_generations).nan_to_num(0.0)
    spread = (groups.amax(dim=1) > groups.amin(dim=1)).repeat_interleave(round_.num_generations)
    masks = {
        "sapo/local_reward": ~is_external,
        "sapo/external_reward": is_external,
        "sapo/local_reward_with_spread": ~is_external & spread,
    }
    for name, mask in masks.items():
        values = rewards[mask]
        values = values[~torch.isnan(values)]
        if values.numel():
            figures[name] = values.mean().item()
    return figures
