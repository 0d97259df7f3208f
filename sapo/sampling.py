"""How a peer chooses the external groups it trains on among the candidates the swarm delivered."""

from __future__ import annotations

import random
import time
from abc import ABC, abstractmethod
from collections import Counter, deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from swarm.records import Group

SWARM = "swarm"
"""The `origin` of a candidate received from another peer."""

REPLAY = "replay"
"""The `origin` of a candidate that is one of this peer's own earlier groups, offered again (`sapo.replay`)."""


@dataclass(frozen=True)
class TokenizedCompletion:
    """A received completion under this peer's tokenizer, tokenized once for everything that reads it.

    Parameters:
        ids (`tuple[int, ...]`): the tokens trained on: the text's tokens, cut to `max_completion_length`, with EOS
            appended when it fits.
        truncated (`bool`): whether text was cut off to fit.
        text (`str`): what is scored: the text as sent, or, when cut, the decoded tokens that are trained on.
        answer_tokens (`int` or `None`): the leading tokens that hold the text up to the end of its final answer
            (`SAPOConfig.external_answer_end`, as the reward reads it); the rest gets no weight in the loss. None: no
            answer end, all trained.
    """

    ids: tuple[int, ...]
    truncated: bool
    text: str
    answer_tokens: int | None = None


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
        tokenized (`list[TokenizedCompletion]`): each completion under this peer's tokenizer.
        token_weights (`list[list[int]]` or `None`): per completion, 1 for each token trained on and 0 for each token
            the plausibility pass found too unlike this policy (`SAPOConfig.external_token_floor`); None: every token.
        origin (`str`): `"swarm"` (received from `sender`) or `"replay"` (this peer's own earlier group, `sapo.replay`).
    """

    sender: str
    group: Group
    rewards: list[float]
    columns: dict[str, Any] = field(default_factory=dict)
    rewards_per_func: list[list[float]] = field(default_factory=list)
    tokenized: list[TokenizedCompletion] = field(default_factory=list)
    token_weights: list[list[int]] | None = None
    origin: str = SWARM

    @property
    def has_zero_advantage(self) -> bool:
        """True when every completion got the same reward: such a group gives GRPO no learning signal."""
        finite = [r for r in self.rewards if r == r]
        return len(set(finite)) <= 1


@dataclass
class Selection:
    """The groups chosen for one round, what was set aside and why, and what may still replace a chosen group.

    Parameters:
        chosen (`list[Candidate]`): up to ``k`` candidates, in the order they were drawn.
        dropped (`collections.Counter`): set-aside candidates by reason.
        set_aside (`list[tuple[Candidate, str]]`): each set-aside candidate with its reason.
        reserve (`list[Candidate]`): eligible candidates not chosen, in the order the strategy would take them next:
            what fills a slot when a chosen group is dropped later (e.g. by the plausibility check).
    """

    chosen: list[Candidate]
    dropped: Counter[str] = field(default_factory=Counter)
    set_aside: list[tuple[Candidate, str]] = field(default_factory=list)
    reserve: list[Candidate] = field(default_factory=list)

    def set_aside_as(self, candidate: Candidate, reason: str) -> None:
        """Record ``candidate`` as set aside for ``reason``."""
        self.dropped[reason] += 1
        self.set_aside.append((candidate, reason))

    def next_from_reserve(self, max_groups_per_peer: int | None) -> Candidate | None:
        """The next reserve candidate whose sender is still under ``max_groups_per_peer`` among the chosen, moved to
        `chosen`; None when none is left."""
        per_peer = Counter(c.sender for c in self.chosen)
        for i, candidate in enumerate(self.reserve):
            if candidate.origin != SWARM or not _at_cap(per_peer[candidate.sender], max_groups_per_peer):
                self.chosen.append(self.reserve.pop(i))
                return candidate
        return None


def _at_cap(taken: int, cap: int | None) -> bool:
    """Whether a sender with ``taken`` groups chosen this round has reached ``cap`` (None: no cap)."""
    return cap is not None and taken >= cap


class ExternalSampler(ABC):
    """Chooses up to ``k`` candidates; subclasses decide which are eligible and how to draw among them.

    The base class applies the rules every strategy shares: never take one's own groups back from the swarm, respect
    the staleness bound, and cap the groups of any one sender. Replayed candidates (origin `"replay"`, this peer's own
    by design) are bounded by `sapo.replay.ReplayBuffer` instead and pass those three rules.

    A strategy with options of its own declares them in `config_fields`: the `SAPOConfig` fields it takes as keyword
    arguments of the same name. :func:`make_sampler` (and so the trainer, for `SAPOConfig.sampling_strategy`) reads
    them from the configuration; a strategy registered by :func:`register_sampler` needs no other edit.

    Parameters:
        max_groups_per_peer (`int` or `None`): most groups of one sender per round; `None` for no cap.
        max_group_age (`float` or `None`): seconds after which a group is stale; `None` for no bound.
        self_id (`str` or `None`): this peer's identity; its own groups are never chosen.
    """

    config_fields: tuple[str, ...] = ()
    """The `SAPOConfig` fields this strategy takes, beyond the three every strategy takes."""

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
        selection = Selection(chosen=[])
        eligible = []
        for candidate in candidates:
            reason = self._reject_reason(candidate, now)
            if reason is None:
                eligible.append(candidate)
            else:
                selection.set_aside_as(candidate, reason)
        per_peer: Counter[str] = Counter()
        for candidate in self.order(eligible, rng):
            if len(selection.chosen) == k:
                selection.reserve.append(candidate)
            elif candidate.origin == SWARM and _at_cap(per_peer[candidate.sender], self.max_groups_per_peer):
                selection.set_aside_as(candidate, "peer_cap")
            else:
                per_peer[candidate.sender] += 1
                selection.chosen.append(candidate)
        return selection

    def is_stale(self, group: Group, now: float) -> bool:
        """True if ``group`` is older than ``max_group_age`` at ``now`` (the one staleness rule of a node)."""
        return self.max_group_age is not None and now - group.created_at > self.max_group_age

    def _reject_reason(self, candidate: Candidate, now: float) -> str | None:
        if candidate.origin == REPLAY:
            return self.reject_reason(candidate)
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

    def observe_own_groups(self, groups: Iterable[tuple[str, Sequence[float]]]) -> None:
        """Told once per round of this peer's own groups: ``(task, rewards of its completions)`` each. Strategies
        that weigh candidates by this peer's own recent results keep what they need; the others ignore it."""
        return None


class UniformSampler(ExternalSampler):
    """Samples uniformly among the eligible candidates."""

    def order(self, eligible: list[Candidate], rng: random.Random) -> list[Candidate]:
        return rng.sample(eligible, len(eligible))


class DropZeroAdvantageSampler(UniformSampler):
    """Drops groups whose local rewards are all equal (zero advantage: no GRPO signal), then samples uniformly: the
    SAPO paper's rule."""

    def reject_reason(self, candidate: Candidate) -> str | None:
        return "zero_advantage" if candidate.has_zero_advantage else None


SAMPLERS: dict[str, type[ExternalSampler]] = {
    "drop_zero_advantage": DropZeroAdvantageSampler,
    "uniform": UniformSampler,
}
"""Every sampling strategy by name: the one list that `SAPOConfig.sampling_strategy` accepts and documents (read when
a configuration is built, so a strategy registered before then is accepted)."""

SAMPLER_ALIASES: dict[str, str] = {"paper": "drop_zero_advantage"}
"""Other accepted names: `"paper"` is the SAPO paper's rule, `"drop_zero_advantage"`."""


def sampler_name(name: str) -> str:
    """The registered name of strategy ``name`` (an alias resolved); ValueError for an unknown name."""
    name = SAMPLER_ALIASES.get(name, name)
    if name not in SAMPLERS:
        raise ValueError(
            f"sampling_strategy={name!r} is unknown; choose one of {sampler_choices()}, register your own "
            "(sapo.sampling.register_sampler; sapo-node: --sampler FILE.py:Class) or pass a "
            "sapo.sampling.ExternalSampler to SAPOTrainer(sampler=...)."
        )
    return name


def sampler_choices() -> list[str]:
    """Every name `SAPOConfig.sampling_strategy` accepts now: the registered strategies (built-in ones and those of
    :func:`register_sampler`), then the aliases."""
    return [*SAMPLERS, *SAMPLER_ALIASES]


class RegisteredSamplers:
    """The names `SAPOConfig.sampling_strategy` accepts, read from the registry each time it is asked: argparse's
    `choices` for that option, so that a parser accepts and lists a strategy registered after `sapo.config` was
    imported."""

    def __contains__(self, name: object) -> bool:
        return name in sampler_choices()

    def __iter__(self) -> Iterator[str]:
        return iter(sampler_choices())

    def __len__(self) -> int:
        return len(sampler_choices())

    def __repr__(self) -> str:
        return repr(sampler_choices())


def describe_samplers() -> str:
    """One line per strategy name, from its class's own docstring (a class without one is named by its class name):
    the text `SAPOConfig.sampling_strategy` shows."""
    aliases = {target: alias for alias, target in SAMPLER_ALIASES.items()}
    parts = []
    for name, cls in SAMPLERS.items():
        summary = " ".join((cls.__dict__.get("__doc__") or "").split()).rstrip(".")
        summary = summary[:1].lower() + summary[1:] if summary else f"is `{cls.__name__}` (no docstring)"
        alias = f' (alias `"{aliases[name]}"`)' if name in aliases else ""
        parts.append(f'`"{name}"`{alias} {summary}')
    return "; ".join(parts)


def sampling_strategy_help() -> str:
    """The help of `SAPOConfig.sampling_strategy` for the strategies registered now."""
    return (
        f"How external groups are chosen among the candidates: {describe_samplers()}. Every strategy skips this "
        "peer's own groups and applies `max_groups_per_peer` and `max_group_age`. Register your own with "
        "`sapo.sampling.register_sampler` (sapo-node: `--sampler`), or pass a `sapo.sampling.ExternalSampler` to "
        "`SAPOTrainer(sampler=...)`."
    )


def register_sampler(name: str, sampler: type[ExternalSampler]) -> None:
    """Make ``sampler`` choosable by ``name`` (`SAPOConfig.sampling_strategy`, :func:`make_sampler`); its options are
    the `SAPOConfig` fields named by its `config_fields`. Register before the configuration is built."""
    if not (isinstance(sampler, type) and issubclass(sampler, ExternalSampler)):
        raise TypeError(f"register_sampler({name!r}, ...) needs an ExternalSampler subclass, got {sampler!r}")
    if name in SAMPLER_ALIASES or (name in SAMPLERS and SAMPLERS[name] is not sampler):
        raise ValueError(f"a sampling strategy named {name!r} is already registered")
    SAMPLERS[name] = sampler


def make_sampler(
    name: str,
    max_groups_per_peer: int | None = None,
    max_group_age: float | None = None,
    self_id: str | None = None,
    config: Any = None,
    **options: Any,
) -> ExternalSampler:
    """Build the sampler registered under ``name`` (a key of :data:`SAMPLERS` or :data:`SAMPLER_ALIASES`). Its own
    arguments are the fields of ``config`` (a `SAPOConfig`) it declares in `config_fields`, then ``options`` (e.g.
    ``success_threshold`` of ``"success_gated"``), which win."""
    sampler = SAMPLERS[sampler_name(name)]
    if config is not None:
        missing = [f for f in sampler.config_fields if not hasattr(config, f)]
        if missing:
            raise ValueError(f"sampling_strategy={name!r} declares config_fields the configuration lacks: {missing}")
        options = {**{f: getattr(config, f) for f in sampler.config_fields}, **options}
    try:
        return sampler(max_groups_per_peer=max_groups_per_peer, max_group_age=max_group_age, self_id=self_id, **options)
    except TypeError as e:
        raise ValueError(f"sampling_strategy={name!r} does not take the option(s) {sorted(options)}: {e}") from None


DEFAULT_SUCCESS_THRESHOLD = 1.0
"""A completion counts as a success when this peer's reward for it is at least this. The reward is the weighted sum
of the peer's reward functions (what :class:`Candidate` holds); with the node's default ``reasoning_gym`` + ``format``
rewards, the correctness reward gives 1.0 for a right answer and the format reward at most 0.2, so 1.0 means a
right answer (a partial correctness score of 0.8 or more with full format would also count)."""


class SuccessGatedSampler(DropZeroAdvantageSampler):
    """Takes only groups with reward spread that hold a completion this peer scores as a success (its reward at
    least `success_threshold`, default 1.0: with the default rewards, a right answer), then samples uniformly: a
    verified success beside failures on the same question, the kind of shared rollout that helps a weak peer."""

    config_fields = ("success_threshold",)

    def __init__(self, *args: Any, success_threshold: float = DEFAULT_SUCCESS_THRESHOLD, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.success_threshold = success_threshold

    def reject_reason(self, candidate: Candidate) -> str | None:
        reason = super().reject_reason(candidate)
        if reason is not None:
            return reason
        return None if has_success(candidate.rewards, self.success_threshold) else "no_success"


class WeakPromptFirstSampler(DropZeroAdvantageSampler):
    """Drops groups without reward spread, then takes first the groups of tasks on which this peer's own recent
    groups had no success (none of its last `success_window` groups of the task, default 8, held a completion
    rewarded at least `success_threshold`, default 1.0; a task it has not generated counts as weak), uniformly
    within each tier. Needs the trainer to report its own groups' rewards each round
    (`sampler.observe_own_groups`); without them every task counts as weak and the rule is the paper's."""

    config_fields = ("success_threshold", "success_window")

    def __init__(
        self,
        *args: Any,
        success_threshold: float = DEFAULT_SUCCESS_THRESHOLD,
        success_window: int = 8,
        **kwargs: Any,
    ):
        super().__init__(*args, **kwargs)
        self.success_threshold = success_threshold
        self.success_window = success_window
        self.own_success = OwnSuccess(success_threshold, success_window)

    def observe_own_groups(self, groups: Iterable[tuple[str, Sequence[float]]]) -> None:
        """Remember, per task, whether each of this peer's own groups held a success (the last `success_window`)."""
        self.own_success.observe(groups)

    def is_weak(self, task: str) -> bool:
        """True when none of this peer's recent own groups of ``task`` held a success (or it has none)."""
        return self.own_success.is_weak(task)

    def order(self, eligible: list[Candidate], rng: random.Random) -> list[Candidate]:
        shuffled = rng.sample(eligible, len(eligible))
        weak = [c for c in shuffled if self.is_weak(task_of(c))]
        return weak + [c for c in shuffled if not self.is_weak(task_of(c))]


def task_of(candidate: Candidate) -> str:
    """The task a candidate's question belongs to, as the trainer names its own groups' task: the task this peer's
    own source re-derived for it (a dataset item held here under another name counts under this peer's name), else
    the provenance's (a reasoning-gym task, or a question file's name)."""
    return str(candidate.columns.get("task") or candidate.group.provenance.task)


def has_success(rewards: Sequence[float], threshold: float) -> bool:
    """True when some completion's reward is at least ``threshold`` (NaN rewards never count)."""
    return any(r >= threshold for r in rewards if r == r)


class OwnSuccess:
    """Per task, whether each of this peer's last ``window`` own groups held a success (a reward at least
    ``threshold``): which tasks the peer is weak on, for the samplers that prefer those and for counting rescues."""

    def __init__(self, threshold: float = DEFAULT_SUCCESS_THRESHOLD, window: int = 8):
        if window < 1:
            raise ValueError(f"success_window must be at least 1 (own groups remembered per task), got {window}")
        self.threshold = threshold
        self._recent: dict[str, deque[bool]] = {}
        self.window = window

    def observe(self, groups: Iterable[tuple[str, Sequence[float]]]) -> None:
        """Note ``(task, rewards of its completions)`` for each own group of a round."""
        for task, rewards in groups:
            recent = self._recent.setdefault(task, deque(maxlen=self.window))
            recent.append(has_success(rewards, self.threshold))

    def is_weak(self, task: str) -> bool:
        """True when none of the recent own groups of ``task`` held a success (or there are none)."""
        return not any(self._recent.get(task, ()))


SAMPLERS["success_gated"] = SuccessGatedSampler
SAMPLERS["weak_prompt_first"] = WeakPromptFirstSampler
