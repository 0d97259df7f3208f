"""A verifiers taskset as a task source: items named by task key, scored offline with the task's own reward hooks.

A `verifiers.v1.Taskset` yields `Task`s, each with a durable key (unique in its taskset). A row's provenance names
the taskset (its class, or its configured id), its package version, a hash of its configuration and the task's key;
a receiver holding the same taskset finds its own copy of the task by that key, rebuilds the question from it, and
scores the received completions with the task's `@reward` hooks (`Task.score` without a runtime: no model, container
or network call). Tasks that need a container, tools, several turns, a judge or a runtime to score are not shared:
their rows are left out and a received group naming one is dropped as `unsupported_task`, with the reason.

`verifiers` is an optional extra (``pip install 'sapo-swarm[verifiers]'``); it is imported only when a
:class:`VerifiersSource` is built.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import importlib.metadata
import json
import logging
import time
from collections import Counter
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from rewards.functions import SCORER_SECONDS
from rewards.scoring_bounds import ScoringTimeout, scoring_deadline
from sapo.questions import GroupDropped, question_of, reward_columns
from sapo.sources.base import Rederived, TaskSource, row_provenances
from swarm.records import Provenance

logger = logging.getLogger(__name__)

__all__ = ["VERIFIERS_SOURCE", "VerifiersSource", "require_verifiers"]

VERIFIERS_SOURCE = "verifiers"
"""The provenance source of verifiers tasks."""

_INSTALL_HINT = "pip install 'sapo-swarm[verifiers]'"


def require_verifiers() -> Any:
    """The `verifiers.v1` module, or an ImportError whose one line says how to install it."""
    try:
        import verifiers.v1 as vf
    except ImportError as e:
        raise ImportError(f"a verifiers taskset needs the verifiers package: {_INSTALL_HINT}") from e
    return vf


@dataclass(frozen=True)
class _Item:
    task: Any  # a verifiers.v1.Task
    prompt: list[dict[str, str]]
    question: str
    answer: str
    unsupported: str | None  # why the task cannot be shared, or None


class VerifiersSource(TaskSource):
    """A verifiers taskset as a task source (see the module docstring).

    Args:
        taskset: a `verifiers.v1.Taskset` (or a view of one, such as ``taskset.take(1000)``); it must be bounded
            (a finite `load()`, or a view that caps it): its tasks are indexed by key once, here.
        version: the taskset's version as its peers declare it; None (default): the version of the installed package
            its class comes from, if any, with the verifiers version (e.g. ``"mytasks==1.2;verifiers==0.4.0"``).
        eval_fraction: the share of tasks held out for evaluation, chosen by key (the same tasks on every peer; never
            in the training rows). Default 0.
        scoring_seconds: the wall seconds the reward hooks may spend on one task's completions in one reward call (a
            received group is one task), shared by them: a completion still being scored when they are spent scores
            0.0, and so do the ones not begun (a sender's text must not keep the node scoring). Default
            `rewards.functions.SCORER_SECONDS` (1 s), as the reasoning-gym reward; None: no limit. A hook that
            computes without awaiting is interrupted on the main thread only.

    A task's key is its `Task.key` where its class defines one; where the class keeps verifiers' default (the hash
    of the task's data, position included) it is the hash of the data without the position, so that peers holding
    the taskset in different orders name a task alike. Tasks that repeat (one key, the same data) are one item
    (:attr:`merged` counts the repeats, logged); two tasks of one key with different data are refused. Use
    :attr:`reward` as a reward function (TRL's signature): it scores each completion of this source's rows with the
    task's own reward hooks, on this peer's copy.
    """

    name = VERIFIERS_SOURCE

    def __init__(
        self,
        taskset: Any,
        version: str | None = None,
        eval_fraction: float = 0.0,
        scoring_seconds: float | None = SCORER_SECONDS,
    ):
        vf = require_verifiers()
        if not isinstance(taskset, vf.Taskset):
            raise TypeError(f"a VerifiersSource takes a verifiers.v1.Taskset, got {type(taskset).__name__}")
        if not taskset.bounded:
            raise ValueError(
                f"{type(taskset).__name__} is infinite: bound it first (taskset.take(n), or include(idx=['0:n']))"
            )
        if not 0.0 <= eval_fraction < 1.0:
            raise ValueError(f"eval_fraction must be in [0, 1), got {eval_fraction}")
        if scoring_seconds is not None and not scoring_seconds > 0:
            raise ValueError(f"scoring_seconds must be positive or None (no limit), got {scoring_seconds}")
        self.taskset, self.eval_fraction, self.scoring_seconds = taskset, eval_fraction, scoring_seconds
        cls = type(taskset)
        self.taskset_name = taskset.config.id or f"{cls.__module__}.{cls.__qualname__}"
        self.config_hash = hashlib.sha256(
            json.dumps(taskset.config.model_dump(mode="json"), sort_keys=True).encode()
        ).hexdigest()[:16]
        self.version = version if version is not None else _package_version(cls)
        self.toolsets = len(cls.toolsets(taskset.config))
        self._items: dict[str, _Item] = {}
        self._order: list[str] = []
        self._held_out: list[str] = []
        self.refused: Counter[str] = Counter()  # tasks left out of the rows, by reason
        self.merged = 0  # tasks that repeat another one (same key, same data): one item
        for task in taskset:
            key = _durable_key(task)
            if key in self._items:
                if _truth(self._items[key].task) != _truth(task):
                    raise ValueError(
                        f"{self.taskset_name}: two tasks have the key {key} with different data (prompt, answer or "
                        "other fields); a task's key must name one task: fix the taskset's `key`"
                    )
                self.merged += 1
                continue
            item = self._item(task)
            self._items[key] = item
            if item.unsupported is not None:
                self.refused[item.unsupported.split(":")[0]] += 1
            elif eval_fraction > 0 and int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) / 2**32 < eval_fraction:
                self._held_out.append(key)
            else:
                self._order.append(key)
        if self.merged:
            logger.info(
                "%s: %d repeated task(s) merged into the task they repeat (same key, same data): %d distinct task(s)",
                self.taskset_name, self.merged, len(self._items),
            )  # fmt: skip
        if self.refused:
            logger.warning(
                "%s: %d task(s) left out, not scorable offline in a swarm (%s)", self.taskset_name,
                sum(self.refused.values()), ", ".join(f"{why}: {n}" for why, n in sorted(self.refused.items())),
            )  # fmt: skip
        if not self._order and not self._held_out:
            raise ValueError(f"{self.taskset_name}: no task can be shared ({dict(self.refused) or 'no tasks'})")

    # ------------------------------------------------------------------------------------------------
    # items

    def _item(self, task: Any) -> _Item:
        data = task.data
        prompt = _prompt_messages(data)
        question = question_of(prompt) if prompt is not None else ""
        answer = getattr(data, "answer", "")
        answer_text = answer if isinstance(answer, str) else json.dumps(answer, sort_keys=True, default=str)
        return _Item(task, prompt or [], question, answer_text, self._unsupported(task, prompt, question))

    def _unsupported(self, task: Any, prompt: list[dict[str, str]] | None, question: str) -> str | None:
        """Why ``task`` cannot be scored offline from a single completion, or None."""
        cls = type(task)
        if cls.NEEDS_CONTAINER:
            return "needs a container: its class sets NEEDS_CONTAINER"
        if self.toolsets or cls.toolsets(task.config):
            return "needs tools: the taskset or task declares toolsets"
        if task.hooks("stop"):
            return "several turns: the task declares stop conditions"
        if prompt is None or not question:
            return "several turns: the task's prompt has no user message (a simulated user opens the conversation)"
        if task.config.judges:
            return "needs a judge: a model call scores it"
        rewards = task.hooks("reward")
        if not rewards or all(_needs_runtime(fn) for fn in rewards):
            return "needs a runtime: no reward hook scores it without one"
        return None

    def provenance(self, key: str) -> Provenance:
        """The provenance of the task ``key``."""
        return Provenance(
            VERIFIERS_SOURCE, self.taskset_name, {"config": self.config_hash}, version=self.version, key=key
        )

    def _columns(self, key: str) -> dict[str, Any]:
        return reward_columns(self._items[key].answer, self.provenance(key))

    def _row(self, key: str) -> dict[str, Any]:
        return {"prompt": self._items[key].prompt, **self._columns(key)}

    def __len__(self) -> int:
        return len(self._order)

    def rows(self) -> Any:
        """The training rows (a `datasets.Dataset`): the task's chat ``prompt`` (its system prompt and question),
        ``answer`` (the task data's `answer` field, if any, as text), ``task``, ``entry`` and ``provenance``; tasks
        that cannot be shared (:attr:`refused`) and held-out tasks left out."""
        from datasets import Dataset

        return Dataset.from_list([self._row(key) for key in self._order])

    def held_out(self, size: int | None = None) -> Any:
        """Up to ``size`` held-out rows (all when None), the first by task key, in the form of :meth:`rows`."""
        from datasets import Dataset

        keys = sorted(self._held_out)
        return Dataset.from_list([self._row(key) for key in (keys if size is None else keys[:size])])

    # ------------------------------------------------------------------------------------------------
    # the protocol

    def holds(self, provenance: Provenance) -> bool:
        """A verifiers provenance naming this taskset under this configuration."""
        return (
            provenance.source == VERIFIERS_SOURCE
            and provenance.task == self.taskset_name
            and provenance.config.get("config") == self.config_hash
        )

    def rederive(self, provenance: Provenance, question: str) -> Rederived:
        """This peer's question and columns for the task the key names (found in its own copy of the taskset)."""
        if provenance.version not in (None, self.version):
            raise GroupDropped(
                "version_skew", f"{self.taskset_name} version {provenance.version} from the sender, {self.version} here"
            )
        item = self._items.get(provenance.key or "")
        if item is None:
            raise GroupDropped("item_not_held", f"{self.taskset_name}: this peer's copy has no task {provenance.key}")
        if item.unsupported is not None:
            raise GroupDropped("unsupported_task", f"{self.taskset_name} task {provenance.key}: {item.unsupported}")
        if item.question != question.strip():
            raise GroupDropped(
                "question_mismatch", f"{self.taskset_name}: task {provenance.key} holds another question"
            )
        return Rederived(item.question, self._columns(provenance.key))

    def describe(self) -> str:
        return f"verifiers taskset {self.taskset_name} {self.version} ({len(self._items)} tasks)"

    # ------------------------------------------------------------------------------------------------
    # scoring

    @property
    def reward(self) -> _TaskReward:
        """A reward function with TRL's signature, ``(prompts, completions, **columns) -> list[float | None]``: each
        completion of a row of this source scored with its task's reward hooks (their weighted sum), on this peer's
        copy of the task, offline, a task's completions within `scoring_seconds` (:meth:`score_all`); None for rows of
        other sources."""
        return _TaskReward(self)

    def score(self, key: str, completion: str) -> float:
        """The weighted sum of the task ``key``'s reward hooks for ``completion`` (one assistant reply), or 0.0 past
        `scoring_seconds`."""
        return self.score_all([(key, completion)])[0]

    def score_all(self, pairs: Sequence[tuple[str, str]]) -> list[float]:
        """:meth:`score` of each ``(key, completion)``, one after another: each task's completions share
        `scoring_seconds` (the one still being scored when they are spent scores 0.0, and the ones after it)."""
        scores = [0.0] * len(pairs)
        by_key: dict[str, list[int]] = {}
        for i, (key, _) in enumerate(pairs):
            by_key.setdefault(key, []).append(i)
        for key, indices in by_key.items():
            self._score_task(key, {i: pairs[i][1] for i in indices}, scores)
        return scores

    def _score_task(self, key: str, completions: dict[int, str], scores: list[float]) -> None:
        """Score the task ``key``'s ``completions`` (index -> text) into ``scores``, within `scoring_seconds`: a hook
        awaiting past them is cancelled, one computing past them is interrupted (:func:`scoring_deadline`)."""
        seconds = self.scoring_seconds
        began = time.monotonic()

        def left() -> float | None:
            return None if seconds is None else seconds - (time.monotonic() - began)

        async def score_them() -> None:
            for i, text in completions.items():
                if left() is not None and left() <= 0:
                    return
                try:
                    score = await asyncio.wait_for(self._score_one(key, text), left())
                except TimeoutError:
                    return
                if left() is None or left() > 0:  # a score that came in after the deadline does not count
                    scores[i] = score

        if seconds is None or _event_loop_running():  # then the hooks run in a thread of their own, uninterrupted
            _run(score_them())
            return
        try:
            with scoring_deadline(seconds):
                _run(score_them())
        except ScoringTimeout:
            pass  # what was scored by then stands; the rest keep 0.0

    async def _score_one(self, key: str, completion: str) -> float:
        vf = require_verifiers()
        item = self._items.get(key)
        if item is None:
            raise KeyError(f"{self.taskset_name}: no task {key} here")
        if item.unsupported is not None:
            raise ValueError(f"{self.taskset_name} task {key}: {item.unsupported}")
        task = item.task
        nodes: list[Any] = []
        for message in [*item.prompt, {"role": "assistant", "content": completion}]:
            kind = {"system": vf.SystemMessage, "user": vf.UserMessage, "assistant": vf.AssistantMessage}
            node = vf.MessageNode(
                message=kind[message["role"]](content=message["content"]),
                parent=len(nodes) - 1 if nodes else None,
                sampled=len(nodes) == len(item.prompt),
            )
            nodes.append(node)
        trace = vf.Trace(
            task=vf.TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
            agent=vf.AgentInfo(config=vf.AgentConfig(), name="sapo"),
            nodes=nodes,
            is_completed=True,
            ok=True,
        )
        await task.score(trace)
        return float(trace.reward)


class _TaskReward:
    """:attr:`VerifiersSource.reward`: the task's own reward hooks as a TRL reward function."""

    def __init__(self, source: VerifiersSource):
        self.source = source
        self.__name__ = f"verifiers_{source.taskset_name.rsplit('.', 1)[-1]}"

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **columns: Any) -> list[float | None]:
        provenances = row_provenances([{"provenance": p} for p in columns.get("provenance") or [None] * len(prompts)])
        pairs, rows = [], []
        for i, (provenance, completion) in enumerate(zip(provenances, completions, strict=True)):
            if provenance is not None and self.source.holds(provenance) and provenance.key is not None:
                text = completion[-1]["content"] if isinstance(completion, list) else completion
                pairs.append((provenance.key, text))
                rows.append(i)
        out: list[float | None] = [None] * len(completions)
        for i, score in zip(rows, self.source.score_all(pairs) if pairs else [], strict=True):
            out[i] = score
        return out


def _durable_key(task: Any) -> str:
    """The task's `key` where its class defines one; else the hash of its data without its position."""
    from verifiers.v1.task import Task, task_key

    if type(task).key is not Task.key:
        return str(task.key)
    return task_key(task.data.model_dump(mode="json", exclude_none=True, exclude={"idx"}))


def _truth(task: Any) -> str:
    """Everything of a task but its position, as one comparable text: two tasks under one key must agree on it."""
    return json.dumps(task.data.model_dump(mode="json", exclude={"idx"}), sort_keys=True, default=str)


def _prompt_messages(data: Any) -> list[dict[str, str]] | None:
    """The task's prompt as chat messages of text (its system prompt first), or None when it has no prompt or one
    this source cannot share (images, tool messages)."""
    from verifiers.v1.types import content_text

    if data.prompt is None:
        return None
    messages = [{"role": "system", "content": data.system_prompt}] if data.system_prompt else []
    if isinstance(data.prompt, str):
        return [*messages, {"role": "user", "content": data.prompt}]
    for message in data.prompt:
        if message.role not in ("system", "user", "assistant") or not isinstance(message.content, str):
            return None
        messages.append({"role": message.role, "content": content_text(message.content)})
    return messages


def _needs_runtime(fn: Any) -> bool:
    """Whether a scoring hook needs a runtime (it takes `runtime` without a default), as `Task.score` decides."""
    import inspect

    param = inspect.signature(fn).parameters.get("runtime")
    return param is not None and param.default is inspect.Parameter.empty


def _package_version(cls: type) -> str:
    """The version of the installed package ``cls`` comes from (if any) and of verifiers, as one string."""
    from verifiers import __version__ as verifiers_version

    parts = []
    top = cls.__module__.split(".")[0]
    for dist in importlib.metadata.packages_distributions().get(top, []):
        if dist != "verifiers":
            parts.append(f"{dist}=={importlib.metadata.version(dist)}")
    return ";".join([*parts, f"verifiers=={verifiers_version}"])


def _event_loop_running() -> bool:
    """Whether this thread runs an event loop now."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _run(coroutine: Coroutine[Any, Any, Any]) -> Any:
    """Run ``coroutine`` to completion, in a thread of its own when this thread already runs an event loop."""
    if not _event_loop_running():
        return asyncio.run(coroutine)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine).result()
