"""Verification of the questions in groups received from the swarm: their reward columns are re-derived here,
never taken from the sender.

reasoning-gym groups are regenerated from their provenance and must carry the same question text; groups of
other sources follow an explicit policy (:data:`SOURCE_POLICIES`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from datasets import Dataset

from sapo.questions import GROUP_DROP_REASONS, REWARD_COLUMNS, GroupDropped, reward_columns
from sapo.reasoning_gym import REASONING_GYM_SOURCE, ReasoningGymVerifier, TaskSpec
from swarm.records import Group, Provenance

__all__ = [
    "GROUP_DROP_REASONS",
    "SOURCE_POLICIES",
    "GroupDropped",
    "QuestionVerifier",
    "describe_source_policies",
    "question_of",
]

SOURCE_POLICIES: dict[str, str] = {
    "verify": "looks the question up in a local copy of the same dataset, at the provenance's index, and keeps the "
    "group only if the question text matches, scored with the local answer; without a local copy the group is dropped",
    "trust": "scores the group with the answer the sender put in its metadata, and accepts only a prompt of a single "
    "user message (anything else is dropped as untrusted_prompt)",
    "drop": "drops every such group",
}
"""What a verifier does with questions of non-procedural sources, by policy name: the one list of names that
:class:`QuestionVerifier` and `SAPOConfig.external_source_policy` accept, and the text both document."""


def describe_source_policies() -> str:
    """Each policy name with what it does, as `SAPOConfig.external_source_policy` documents it."""
    return "; ".join(f'`"{name}"` {what}' for name, what in SOURCE_POLICIES.items())


def question_of(prompt: Sequence[Mapping[str, str]]) -> str:
    """The question of a chat prompt: its last user message, stripped of surrounding whitespace ("" if none)."""
    users = [m["content"] for m in prompt if m.get("role") == "user"]
    return users[-1].strip() if users else ""


class QuestionVerifier:
    """Re-derives the reward columns of received groups instead of trusting the sender.

    reasoning-gym groups are always regenerated from their provenance (task, config, seed, index) by
    :class:`sapo.reasoning_gym.ReasoningGymVerifier`; the group is kept only if the regenerated question equals its
    user message (after stripping whitespace), and the returned columns are the regenerated ones. Other sources
    follow ``policy``, a name of :data:`SOURCE_POLICIES` (which says what each one does; a local copy is registered
    under the provenance's task name, and ``"trust"`` reads the sender's ``metadata["answer"]``). With
    ``policy=None`` a group is verified when a local copy of its dataset is registered and dropped otherwise.

    Args:
        policy: a key of :data:`SOURCE_POLICIES`, or None (see above).
        local_datasets: local copies by task name (e.g. ``{"gsm8k": load_jsonl_dataset(...)}``), rows as
            made by :func:`sapo.tasks.load_jsonl_dataset`.
        allowed_tasks: when given, only these reasoning-gym tasks are regenerated: a name allows any config
            of that task, a :class:`TaskSpec` allows exactly its config. None allows every reasoning-gym
            task and config.
        regeneration_timeout: seconds one foreign reasoning-gym entry may take to regenerate. Regeneration
            runs the sender's config, which a hostile peer can make expensive, so configs this node does not
            generate itself (see :meth:`register_tasks`) run in a child process with this time limit and a
            4 GB memory cap (:func:`sapo.reasoning_gym.regenerate_entry`); past either, the group is dropped as
            ``regeneration_limit``. None regenerates everything in this process, without a limit.
    """

    def __init__(
        self,
        policy: str | None = None,
        local_datasets: Mapping[str, Dataset] | None = None,
        allowed_tasks: Sequence[TaskSpec | str] | None = None,
        regeneration_timeout: float | None = 10.0,
    ):
        if policy is not None and policy not in SOURCE_POLICIES:
            raise ValueError(f"unknown verification policy {policy!r}; expected one of {list(SOURCE_POLICIES)}")
        if regeneration_timeout is not None and regeneration_timeout <= 0:
            raise ValueError(f"regeneration_timeout must be positive or None, got {regeneration_timeout}")
        self.policy = policy
        self.regeneration_timeout = regeneration_timeout
        self._local: dict[str, Dataset] = dict(local_datasets or {})
        self._reasoning_gym = ReasoningGymVerifier(allowed_tasks, timeout=regeneration_timeout)

    def register(self, name: str, dataset: Dataset) -> None:
        """Register a local copy of dataset ``name`` to verify received questions against."""
        self._local[name] = dataset

    def register_tasks(self, tasks: Sequence[TaskSpec]) -> None:
        """Reasoning-gym configs this node generates itself: trusted to be cheap, regenerated in this process."""
        self._reasoning_gym.register_tasks(tasks)

    def columns_for(self, group: Group) -> dict[str, str]:
        """The reward columns (``answer``, ``task``, ``entry``, ``provenance``) for a received group, and the
        ``question`` this node vouches for: the one it regenerated or looked up (for ``"trust"``, the sender's
        single user message). The receiver builds its training prompt around that question; nothing else of the
        sender's prompt is trained on.

        Raises :class:`GroupDropped` when the group's question cannot be verified.
        """
        provenance = group.provenance
        if not isinstance(provenance, Provenance):  # a transport parses it (swarm.records.group_from_wire)
            raise GroupDropped(
                "bad_provenance",
                f"the group's provenance is a {type(provenance).__name__}, not a swarm.records.Provenance "
                "(build it from the wire form with swarm.records.provenance_from_wire)",
            )
        question = question_of(group.prompt)
        if not question:
            raise GroupDropped("question_mismatch", "the group's prompt has no user message")
        if provenance.source != REASONING_GYM_SOURCE:  # not procedural: this node's policy decides
            policy = self.policy or ("verify" if provenance.task in self._local else "drop")
            if policy == "drop":
                raise GroupDropped(
                    "untrusted_source", f"source {provenance.source!r} is not verified under policy 'drop'"
                )
            if policy == "verify":
                return self._local_columns(provenance, question)
            answer, entry = _trusted_answer(group), ""
        else:
            question, answer, entry = self._reasoning_gym.verify(provenance, question)
        return {**reward_columns(answer, provenance, entry), "question": question}

    def _local_columns(self, provenance: Provenance, question: str) -> dict[str, str]:
        local = self._local.get(provenance.task)
        if local is None:
            raise GroupDropped("unknown_task", f"no local copy of dataset {provenance.task!r} is registered")
        if provenance.index is None:
            raise GroupDropped("bad_provenance", "a dataset provenance needs an index")
        if not 0 <= provenance.index < len(local):
            raise GroupDropped(
                "index_out_of_range", f"index {provenance.index} outside {provenance.task!r} ({len(local)} rows)"
            )
        row = local[provenance.index]
        if question_of(row["prompt"]) != question:
            raise GroupDropped("question_mismatch", f"{provenance.task}[{provenance.index}] holds a different question")
        local_question = [m for m in row["prompt"] if m.get("role") == "user"][-1]["content"]  # unstripped
        return {**{key: row[key] for key in REWARD_COLUMNS}, "question": local_question}


def _trusted_answer(group: Group) -> str:
    """The answer of a group under the ``"trust"`` policy: the sender's, for a prompt of a single user message."""
    answer = group.metadata.get("answer")
    if answer is None:
        raise GroupDropped("no_answer", "policy 'trust' but the group's metadata has no 'answer'")
    roles = [message.get("role") for message in group.prompt]
    if roles != ["user"]:
        # Unverifiable text is accepted only as a plain question: a sender's system or assistant turns
        # would condition the completions this node trains on.
        raise GroupDropped("untrusted_prompt", f"policy 'trust' takes one user message, got roles {roles}")
    return str(answer)
