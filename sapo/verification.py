"""Verification of the questions in groups received from the swarm: their reward columns are re-derived here,
never taken from the sender.

reasoning-gym groups are regenerated from their provenance and must carry the same question text; groups of
other sources follow an explicit policy (:data:`SOURCE_POLICIES`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from datasets import Dataset

from sapo.regeneration import MAX_INDEX, RegenerationFailed, RegenerationLimit, regenerate_entry
from sapo.tasks import (
    REASONING_GYM_SOURCE,
    TaskSpec,
    _config_key,
    _make_generator,
    _normalize_config,
    _row,
    _task_names,
    provenance_to_json,
    validate_task_names,
)
from swarm.records import Group, Provenance, RecordRejected, provenance_from_wire

__all__ = [
    "GROUP_DROP_REASONS",
    "SOURCE_POLICIES",
    "GroupDropped",
    "QuestionVerifier",
    "describe_source_policies",
    "published_prompt",
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


GROUP_DROP_REASONS = (
    "unknown_task",  # dataset unknown to reasoning-gym, a config it rejects, or no local copy to check against
    "question_mismatch",  # the group's question is not the one its provenance regenerates
    "bad_provenance",  # provenance lacks what its source needs (seed, index) or is malformed
    "untrusted_source",  # a non-procedural source under the "drop" policy
    "index_out_of_range",  # the index is negative or beyond the local copy
    "no_answer",  # "trust" policy, but the sender attached no answer
    "regeneration_limit",  # regenerating a foreign reasoning-gym config took too long or too much memory
    "untrusted_prompt",  # "trust" policy, but the prompt is more than one user message (a system or assistant turn)
)


def published_prompt(prompt: Any) -> Any:
    """The prompt a peer publishes with a group: its question alone, as one user message.

    Receivers write their own prompt around the question they verify, so a system prompt or earlier turns would be
    dead weight on the wire, and a receiver under the ``"trust"`` policy accepts a lone user message only. A plain
    string prompt (not conversational) is published as it is.
    """
    if isinstance(prompt, str):
        return prompt
    users = [m for m in prompt if m.get("role") == "user"]
    return [{"role": "user", "content": users[-1]["content"]}] if users else list(prompt)


class GroupDropped(Exception):
    """A received group whose ground truth cannot be re-derived; ``reason`` is one of :data:`GROUP_DROP_REASONS`."""

    def __init__(self, reason: str, detail: str):
        if reason not in GROUP_DROP_REASONS:
            raise ValueError(f"unknown drop reason {reason!r}; expected one of {GROUP_DROP_REASONS}")
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class QuestionVerifier:
    """Re-derives the reward columns of received groups instead of trusting the sender.

    reasoning-gym groups are always regenerated from their provenance (dataset name, config, seed,
    index); the group is kept only if the regenerated question equals its user message (after stripping
    whitespace), and the returned columns are the regenerated ones. Other sources follow ``policy``, a name of
    :data:`SOURCE_POLICIES` (which says what each one does; a local copy is registered under the provenance's
    dataset name, and ``"trust"`` reads the sender's ``metadata["answer"]``). With ``policy=None`` a group is
    verified when a local copy of its dataset is registered and dropped otherwise.

    Args:
        policy: a key of :data:`SOURCE_POLICIES`, or None (see above).
        local_datasets: local copies by dataset name (e.g. ``{"gsm8k": load_jsonl_dataset(...)}``), rows as
            made by :func:`load_jsonl_dataset`.
        allowed_tasks: when given, only these reasoning-gym tasks are regenerated: a name allows any config
            of that dataset, a :class:`TaskSpec` allows exactly its config. None allows every reasoning-gym
            task and config.
        regeneration_timeout: seconds one foreign reasoning-gym entry may take to regenerate. Regeneration
            runs the sender's config, which a hostile peer can make expensive, so configs this node does not
            generate itself (see :meth:`register_tasks`) run in a child process with this time limit and a
            4 GB memory cap (:mod:`sapo.regeneration`); past either, the group is dropped as
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
        self._own_configs: set[tuple[str, str]] = set()  # (dataset, config key) regenerated in this process
        self._local: dict[str, Dataset] = dict(local_datasets or {})
        self._allowed: dict[str, set[str] | None] | None = None
        if allowed_tasks is not None:
            validate_task_names(allowed_tasks)
            self._allowed = {}
            for task in allowed_tasks:
                if isinstance(task, str):
                    self._allowed[task] = None  # any config
                elif self._allowed.get(task.name, set()) is not None:
                    self._allowed.setdefault(task.name, set()).add(task.config_key)

    def register(self, name: str, dataset: Dataset) -> None:
        """Register a local copy of dataset ``name`` to verify received questions against."""
        self._local[name] = dataset

    def register_tasks(self, tasks: Sequence[TaskSpec]) -> None:
        """Reasoning-gym configs this node generates itself: trusted to be cheap, regenerated in this process."""
        self._own_configs.update((task.name, task.config_key) for task in tasks)

    def columns_for(self, group: Group) -> dict[str, str]:
        """The reward columns (``answer``, ``task``, ``entry``, ``provenance``) for a received group, and the
        ``question`` this node vouches for: the one it regenerated or looked up (for ``"trust"``, the sender's
        single user message). The receiver builds its training prompt around that question; nothing else of the
        sender's prompt is trained on.

        Raises :class:`GroupDropped` when the group's question cannot be verified.
        """
        provenance = group.provenance
        if not isinstance(provenance, Provenance):
            try:
                provenance = provenance_from_wire(provenance)
            except RecordRejected as e:
                raise GroupDropped("bad_provenance", str(e)) from None
        question = _user_question(group)
        if provenance.source == REASONING_GYM_SOURCE:
            return self._reasoning_gym_columns(provenance, question)
        policy = self.policy or ("verify" if provenance.dataset in self._local else "drop")
        if policy == "drop":
            raise GroupDropped("untrusted_source", f"source {provenance.source!r} is not verified under policy 'drop'")
        if policy == "trust":
            answer = group.metadata.get("answer")
            if answer is None:
                raise GroupDropped("no_answer", "policy 'trust' but the group's metadata has no 'answer'")
            roles = [message.get("role") for message in group.prompt]
            if roles != ["user"]:
                # Unverifiable text is accepted only as a plain question: a sender's system or assistant turns
                # would condition the completions this node trains on.
                raise GroupDropped("untrusted_prompt", f"policy 'trust' takes one user message, got roles {roles}")
            return {
                "answer": str(answer),
                "task": provenance.dataset,
                "entry": "",
                "provenance": provenance_to_json(provenance),
                "question": question,
            }
        return self._local_columns(provenance, question)

    def _reasoning_gym_columns(self, provenance: Provenance, question: str) -> dict[str, str]:
        if provenance.seed is None or provenance.index is None:
            raise GroupDropped("bad_provenance", "reasoning-gym provenance needs a seed and an index")
        if not 0 <= provenance.index < MAX_INDEX or not 0 <= provenance.seed < 2**32:
            raise GroupDropped("index_out_of_range", f"seed {provenance.seed}, index {provenance.index}")
        if provenance.dataset not in _task_names():
            raise GroupDropped("unknown_task", f"reasoning-gym has no dataset {provenance.dataset!r}")
        try:
            config = _normalize_config(provenance.dataset, provenance.config)
            if self._allowed is not None:
                configs = self._allowed.get(provenance.dataset, set())
                if configs is not None and _config_key(config) not in configs:
                    raise ValueError(
                        f"{provenance.dataset} with config {config} is not among this node's allowed tasks"
                    )
            entry = self._regenerate(provenance.dataset, config, provenance.seed, provenance.index)
        except RegenerationLimit as e:
            raise GroupDropped("regeneration_limit", f"{provenance.dataset} with config {config}: {e}") from None
        except ValueError as e:
            raise GroupDropped("unknown_task", str(e)) from None
        except Exception as e:  # a config reasoning-gym accepts but cannot generate from
            raise GroupDropped("unknown_task", f"{provenance.dataset}: {type(e).__name__}: {e}") from None
        if entry["question"].strip() != question:
            raise GroupDropped(
                "question_mismatch", f"{provenance.dataset}[{provenance.index}] regenerates a different question"
            )
        clean = Provenance(REASONING_GYM_SOURCE, provenance.dataset, config, provenance.seed, provenance.index)
        row = _row(entry, clean, system_prompt=None)
        own_question = row["prompt"][-1]["content"]  # the regenerated text, formatted as this node's own rows
        return {**{key: row[key] for key in ("answer", "task", "entry", "provenance")}, "question": own_question}

    def _regenerate(self, name: str, config: dict[str, Any], seed: int, index: int) -> dict[str, Any]:
        """Entry ``index`` of (name, config, seed): here for this node's own configs, else in the child process."""
        key = _config_key(config)
        if self.regeneration_timeout is None or (name, key) in self._own_configs:
            return _make_generator(name, config, seed)[index]  # made JSON-safe once, by _row
        try:
            return regenerate_entry(name, key, seed, index, timeout=self.regeneration_timeout)
        except RegenerationFailed as e:
            raise ValueError(f"reasoning-gym rejected {name!r} with config {config}: {e}") from None

    def _local_columns(self, provenance: Provenance, question: str) -> dict[str, str]:
        local = self._local.get(provenance.dataset)
        if local is None:
            raise GroupDropped("unknown_task", f"no local copy of dataset {provenance.dataset!r} is registered")
        if provenance.index is None:
            raise GroupDropped("bad_provenance", "a dataset provenance needs an index")
        if not 0 <= provenance.index < len(local):
            raise GroupDropped(
                "index_out_of_range", f"index {provenance.index} outside {provenance.dataset!r} ({len(local)} rows)"
            )
        row = local[provenance.index]
        if _user_text(row["prompt"]) != question:
            raise GroupDropped(
                "question_mismatch", f"{provenance.dataset}[{provenance.index}] holds a different question"
            )
        return {
            "answer": row["answer"],
            "task": row["task"],
            "entry": row["entry"],
            "provenance": row["provenance"],
            "question": [m for m in row["prompt"] if m.get("role") == "user"][-1]["content"],  # the local text
        }


def _user_text(messages: Sequence[Mapping[str, str]]) -> str:
    users = [m["content"] for m in messages if m.get("role") == "user"]
    return users[-1].strip() if users else ""


def _user_question(group: Group) -> str:
    question = _user_text(group.prompt)
    if not question:
        raise GroupDropped("question_mismatch", "the group's prompt has no user message")
    return question
