"""reasoning-gym as a question source: task specs, training and held-out rows, and the verification of received
questions by regenerating them (a foreign config in a child process, under a time limit).

reasoning-gym generates entry ``i`` of a dataset from ``(name, config, seed, i)``, so a shared group's provenance is
enough to regenerate its question and answer: a receiver never trusts the sender's. The public API:

- :class:`TaskSpec`, :data:`DEFAULT_TASKS`, :data:`PAPER_TASKS`, :func:`validate_task_names`: what to draw from;
- :func:`build_reasoning_gym_dataset` (training rows), :func:`build_held_out_dataset` (questions training never
  draws), :func:`reasoning_gym_tasks_of` (the tasks of a dataset);
- :func:`regenerate_entry`: one entry, in this process or, for a config this node does not run itself, in a child
  process with a time limit and a memory cap (a hostile peer can name a config that runs for minutes);
- :class:`ReasoningGymVerifier`: a received question in, the question, answer and entry of this node's own row out,
  or :class:`sapo.questions.GroupDropped` with the reason (the only error it raises). Foreign configs also spend a
  budget of seconds per round, and one past a limit is remembered and refused without running it again.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import datetime
import difflib
import enum
import functools
import json
import os
import random
import select
import signal
import subprocess
import sys
import threading
import time
import zlib
from collections import Counter, OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sapo.questions import DEFAULT_SYSTEM_PROMPT, GroupDropped, question_row
from swarm.records import Provenance, provenance_from_wire

if TYPE_CHECKING:
    from datasets import Dataset

__all__ = [
    "DEFAULT_TASKS",
    "HELD_OUT_SEED_BASE",
    "LIMIT_MEMORY_SECONDS",
    "MAX_INDEX",
    "PAPER_TASKS",
    "REASONING_GYM_SOURCE",
    "REMEMBERED_LIMITS",
    "ReasoningGymVerifier",
    "TaskSpec",
    "build_held_out_dataset",
    "build_reasoning_gym_dataset",
    "held_out_seed",
    "reasoning_gym_entry",
    "reasoning_gym_tasks_of",
    "reasoning_gym_version",
    "regenerate_entry",
    "validate_task_names",
]

REASONING_GYM_SOURCE = "reasoning_gym"
"""The provenance source of reasoning-gym questions."""

MAX_INDEX = 2**31 - 1
"""reasoning-gym datasets are virtual (entry i is generated from (seed, i) on demand): generators are built with
this size, so any index an honest peer can produce is in range."""

_RESERVED_CONFIG_KEYS = ("seed", "size")

# ----------------------------------------------------------------------------------------------
# tasks


@dataclass
class TaskSpec:
    """One reasoning-gym task in a question mix.

    Parameters:
        name (`str`):
            The task's name: a reasoning-gym dataset, e.g. `"basic_arithmetic"` (see `reasoning_gym.factory.DATASETS`);
            rows carry it in their `task` column and provenance (`Provenance.task`).
        config (`dict[str, Any]`, defaults to `{}`):
            Keyword arguments of the dataset's config class (e.g. `{"max_terms": 2}`); `seed` and `size`
            are set by the dataset builder and are not allowed here. Values must be JSON-like scalars or
            flat lists of them, since the config travels in every shared group's provenance; tuples are
            stored as lists.
        weight (`float`, defaults to `1.0`):
            Relative share of this task's questions in the mix.
    """

    name: str
    config: dict[str, Any] = field(default_factory=dict)
    weight: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"TaskSpec.name must be a non-empty string, got {self.name!r}")
        if not (isinstance(self.weight, int | float) and self.weight > 0):
            raise ValueError(f"TaskSpec {self.name!r}: weight must be a positive number, got {self.weight!r}")
        self.config = _normalize_config(self.name, self.config)

    @property
    def config_key(self) -> str:
        """The config as canonical JSON (a hashable identity for caches)."""
        return json.dumps(self.config, sort_keys=True)


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, str | int | float | bool)


def _normalize_config(name: str, config: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in dict(config).items():
        if key in _RESERVED_CONFIG_KEYS:
            raise ValueError(f"TaskSpec {name!r}: config key {key!r} is set by the dataset builder, remove it")
        if isinstance(value, tuple | list):
            if not all(_is_scalar(v) for v in value):
                raise ValueError(f"TaskSpec {name!r}: config[{key!r}] must be a flat list of scalars")
            value = list(value)
        elif not _is_scalar(value):
            raise ValueError(
                f"TaskSpec {name!r}: config[{key!r}]={value!r} is not a JSON scalar or flat list; "
                "it must travel in provenance"
            )
        out[str(key)] = value
    return out


_EASY_BASIC_ARITHMETIC = {
    "min_terms": 2,
    "max_terms": 2,
    "min_digits": 1,
    "max_digits": 1,
    "operators": ["+", "-"],
    "allow_parentheses": False,
    "allow_negation": False,
}
_EASY_BASE_CONVERSION = {"min_base": 2, "max_base": 10, "min_value": 0, "max_value": 16}
_EASY_FRACTIONS = {"min_value": 1, "max_value": 20, "min_factor": 2, "max_factor": 5, "styles": ["plain"]}
_EASY_CALENDAR = {"tasks": ["weekday_of_date", "is_leap_year"]}

PAPER_TASKS: tuple[TaskSpec, ...] = (
    TaskSpec("base_conversion", _EASY_BASE_CONVERSION),
    TaskSpec("basic_arithmetic", _EASY_BASIC_ARITHMETIC),
    TaskSpec("arc_1d", {"min_size": 10, "max_size": 10}),
    TaskSpec("bf", {"difficulty": 1}),
    TaskSpec(
        "propositional_logic",
        {"min_vars": 2, "max_vars": 2, "min_statements": 2, "max_statements": 2, "max_complexity": 1},
    ),
    TaskSpec("fraction_simplification", _EASY_FRACTIONS),
    TaskSpec("decimal_arithmetic", {"max_num_decimal_places": 1, "min_num_decimal_places": 1, "max_terms": 2}),
    TaskSpec("calendar_arithmetic", _EASY_CALENDAR),
    TaskSpec("binary_matrix", {"min_n": 2, "max_n": 3, "p_zero": 0.5}),
)
"""The nine reasoning-gym tasks of the SAPO paper, at the easiest settings their configs allow; for models
larger than the default (most score zero with a 135M model, see :data:`DEFAULT_TASKS`)."""

# The default keeps the tasks on which the embedded model writes some correct answers (GRPO learns only from groups
# whose rewards differ); the rates per task are in benchmarks/README.md.
DEFAULT_TASKS: tuple[TaskSpec, ...] = (
    TaskSpec("basic_arithmetic", _EASY_BASIC_ARITHMETIC),
    TaskSpec("base_conversion", _EASY_BASE_CONVERSION),
    TaskSpec("fraction_simplification", _EASY_FRACTIONS),
    TaskSpec("calendar_arithmetic", _EASY_CALENDAR),
)
"""The default question mix: the SAPO paper's reasoning-gym tasks, at easy settings, on which
SmolLM2-135M-Instruct gets some answers right (measurement in the comment above)."""


def _task_names() -> frozenset[str]:
    from reasoning_gym.factory import DATASETS  # read each time: a user may register a dataset of their own

    return frozenset(DATASETS)


def validate_task_names(tasks: Sequence[TaskSpec | str]) -> None:
    """Raise ``ValueError`` naming the first unknown reasoning-gym task and its close matches."""
    names = _task_names()
    for task in tasks:
        name = task.name if isinstance(task, TaskSpec) else task
        if name not in names:
            known = sorted(names)
            close = difflib.get_close_matches(name, known, n=5, cutoff=0.5)
            hint = f"close matches: {', '.join(close)}" if close else "no close match"
            raise ValueError(
                f"unknown reasoning-gym task {name!r} ({hint}); reasoning-gym has {len(known)} tasks, "
                "listed in reasoning_gym.factory.DATASETS"
            )


# ----------------------------------------------------------------------------------------------
# entries and rows


def _json_safe(value: Any) -> Any:
    """A JSON-serializable copy of an entry value (metadata may hold tuples, sets, enums, dates, numpy)."""
    if _is_scalar(value):
        if isinstance(value, float) and value != value:  # NaN is not JSON
            return None
        return value
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    if isinstance(value, set | frozenset):
        return sorted((_json_safe(v) for v in value), key=repr)
    if isinstance(value, enum.Enum):
        return _json_safe(value.value)
    if isinstance(value, datetime.date | datetime.datetime | datetime.time):
        return value.isoformat()
    if hasattr(value, "tolist"):  # numpy arrays and scalars
        return _json_safe(value.tolist())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _json_safe(dataclasses.asdict(value))
    return str(value)


def reasoning_gym_entry(entry: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON-safe form of a reasoning-gym entry: ``question``, ``answer``, ``metadata``."""
    return {
        "question": entry["question"],
        "answer": entry.get("answer"),
        "metadata": _json_safe(entry.get("metadata") or {}),
    }


@functools.lru_cache(maxsize=64)
def _cached_generator(name: str, config_key: str, seed: int) -> Any:
    """The reasoning-gym dataset ``name`` for a config (canonical JSON) and seed, built once per process."""
    import reasoning_gym

    return reasoning_gym.create_dataset(name, seed=seed, size=MAX_INDEX, **json.loads(config_key))


def _own_entry(task: TaskSpec, seed: int, index: int) -> dict[str, Any]:
    """The JSON-safe entry ``index`` of ``task`` with ``seed``, generated here; ValueError when reasoning-gym
    rejects the config."""
    try:
        generator = _cached_generator(task.name, task.config_key, seed)
    except ValueError:
        raise
    except (TypeError, AssertionError, KeyError) as e:
        raise ValueError(f"reasoning-gym rejected {task.name!r} with config {task.config}: {e}") from e
    return reasoning_gym_entry(generator[index])


def _answer_and_entry(entry: Mapping[str, Any]) -> tuple[str, str]:
    """The ``answer`` and ``entry`` columns of a JSON-safe entry."""
    answer = entry["answer"]
    if answer is None:
        # Some tasks (propositional_logic) have no single oracle answer: their scorer checks the metadata,
        # and the column holds one valid answer when the generator offers one.
        answer = entry["metadata"].get("example_answer") or ""
    return str(answer), json.dumps(entry, sort_keys=True)


def _row(entry: Mapping[str, Any], provenance: Provenance, system_prompt: str | None) -> dict[str, Any]:
    """The row of a JSON-safe entry."""
    answer, entry_json = _answer_and_entry(entry)
    return question_row(entry["question"], answer, provenance, entry_json, system_prompt)


MAX_TRAINING_QUESTIONS = 2**30
"""Most questions :func:`build_reasoning_gym_dataset` draws per call (keeps training seeds below the held-out band)."""

HELD_OUT_SEED_BASE = 3 * 2**30
"""reasoning-gym generates entry ``i`` of a dataset with seed ``s`` from ``Random(s + i)``. Training draws task seeds
below ``2**31`` and indices below :data:`MAX_TRAINING_QUESTIONS`, so its generator seeds stay below ``3 * 2**30``;
held-out questions use task seeds from here up, so no held-out question shares a generator seed with training."""

MAX_HELD_OUT_QUESTIONS = 2**20
_HELD_OUT_SEED_SPAN = 2**28  # held-out seeds + indices stay below 2**32 (numpy's seed limit)


@functools.cache
def reasoning_gym_version() -> str:
    """The installed reasoning-gym release (the `version` of the provenance of its rows)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("reasoning-gym")
    except PackageNotFoundError:  # a source checkout without package metadata
        return "unknown"


def _task_seed(seed: int, task: TaskSpec) -> int:
    # Derived from the task's identity, not its position, so adding a task leaves the others' questions alone.
    return zlib.crc32(f"{seed}:{task.name}:{task.config_key}".encode()) & 0x7FFFFFFF


def build_reasoning_gym_dataset(
    tasks: Sequence[TaskSpec | str] = DEFAULT_TASKS,
    size: int = 1000,
    seed: int = 0,
    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
) -> Dataset:
    """A ``datasets.Dataset`` of ``size`` reasoning-gym questions mixed by task weight.

    Columns: ``prompt`` (system + user chat messages), ``answer`` (the oracle answer, or an example answer for tasks
    without a single one), ``task`` (the task's name), ``entry`` (the reasoning-gym entry as JSON) and ``provenance``
    (JSON of :class:`swarm.records.Provenance` with source ``"reasoning_gym"``, the task's config, the
    task's own seed and the entry's index). Each task draws entries 0, 1, 2, ... from its own generator;
    the task of each row is drawn by weight. The same arguments give the same rows.
    """
    specs = _specs(tasks)
    if not 0 < size <= MAX_TRAINING_QUESTIONS:
        raise ValueError(f"size must be between 1 and {MAX_TRAINING_QUESTIONS}, got {size}")
    picks = random.Random(seed).choices(range(len(specs)), weights=[t.weight for t in specs], k=size)
    return _rows(specs, picks, [_task_seed(seed, task) for task in specs], system_prompt)


def build_held_out_dataset(
    tasks: Sequence[TaskSpec | str] = DEFAULT_TASKS,
    size: int = 32,
    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
) -> Dataset:
    """``size`` held-out reasoning-gym questions of ``tasks``: questions :func:`build_reasoning_gym_dataset`
    never draws, whatever its seed and size, for measuring what a policy learned.

    The tasks, sorted by name and config, take turns (question ``k`` belongs to the ``k % len(tasks)``-th; weights are
    ignored), so every task has its share and the per-task figures have known sizes. The set depends only on the
    set of tasks, their configs and ``size`` (a larger set extends a smaller one), not on their order: every peer
    of a swarm, and ``sapo-node eval``, measure on the same questions. Disjointness is by generator seed (see
    :data:`HELD_OUT_SEED_BASE`); a task whose question space is small (two one-digit numbers) still repeats
    question *texts* that training also draws.
    Columns are those of :func:`build_reasoning_gym_dataset`.
    """
    specs = sorted(_specs(tasks), key=lambda task: (task.name, task.config_key))
    if not 0 < size <= MAX_HELD_OUT_QUESTIONS:
        raise ValueError(f"held-out size must be between 1 and {MAX_HELD_OUT_QUESTIONS}, got {size}")
    picks = [k % len(specs) for k in range(size)]
    return _rows(specs, picks, [held_out_seed(task) for task in specs], system_prompt)


def held_out_seed(task: TaskSpec) -> int:
    """The generator seed of ``task``'s held-out questions (in the band training never reaches)."""
    return HELD_OUT_SEED_BASE + zlib.crc32(f"held-out:{task.name}:{task.config_key}".encode()) % _HELD_OUT_SEED_SPAN


def reasoning_gym_tasks_of(dataset: Dataset) -> list[TaskSpec]:
    """The distinct reasoning-gym tasks (name and config) a dataset's ``provenance`` column names, in order of first
    appearance; empty for a dataset of other sources or without that column."""
    if "provenance" not in dataset.column_names:
        return []
    tasks: dict[tuple[str, str], TaskSpec] = {}
    for raw in dataset["provenance"]:
        provenance = provenance_from_wire(json.loads(raw) if isinstance(raw, str) else raw)
        if provenance.source == REASONING_GYM_SOURCE:
            task = TaskSpec(provenance.task, provenance.config)
            tasks.setdefault((task.name, task.config_key), task)
    return list(tasks.values())


def _specs(tasks: Sequence[TaskSpec | str]) -> list[TaskSpec]:
    specs = [t if isinstance(t, TaskSpec) else TaskSpec(t) for t in tasks]
    if not specs:
        raise ValueError("a question set needs at least one task")
    validate_task_names(specs)
    return specs


def _rows(specs: list[TaskSpec], picks: Sequence[int], task_seeds: list[int], system_prompt: str | None) -> Dataset:
    """Rows for the task sequence ``picks``: each task draws entries 0, 1, 2, ... of its generator."""
    from datasets import Dataset  # here: the regeneration child imports this module and needs no datasets

    next_index = [0] * len(specs)
    rows = []
    for k in picks:
        task, index = specs[k], next_index[k]
        next_index[k] += 1
        provenance = Provenance(
            REASONING_GYM_SOURCE, task.name, dict(task.config), task_seeds[k], index, version=reasoning_gym_version()
        )
        rows.append(_row(_own_entry(task, task_seeds[k], index), provenance, system_prompt))
    return Dataset.from_list(rows)


# ----------------------------------------------------------------------------------------------
# regeneration of foreign entries, in a child process with a time limit
#
# A hostile peer can name a config that is expensive to run (a Rubik's cube scrambled millions of times, a spiral
# matrix of millions of cells): run in the training process, it would stall the node for minutes or exhaust its
# memory. Configs the node does not use itself therefore run in one child process per training process, with a time
# limit per entry and a cap on its address space; a child past its limit is killed (by its PID) and replaced on the
# next request.


def _serve(memory_mb: int | None) -> None:
    """The child's loop over stdin/stdout, one JSON line each way: [name, config_key, seed, index] in,
    ["ok", entry] or ["failed", message] out. Ends when the parent closes the pipe."""
    if memory_mb:
        import resource

        limit = memory_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    # Replies get the real stdout to themselves: some generators print, and anything they print (from Python
    # or C) goes to stderr instead of into the protocol.
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    import reasoning_gym  # noqa: F401  (before "ready": the import is start-up, not the entry's regeneration time)

    replies.write(json.dumps(["ready"]) + "\n")
    replies.flush()
    for line in sys.stdin:
        name, config_key, seed, index = json.loads(line)
        try:
            reply = ["ok", reasoning_gym_entry(_cached_generator(name, config_key, seed)[index])]
        except Exception as e:  # noqa: BLE001 - every failure of foreign input is an answer, not a crash
            reply = ["failed", f"{type(e).__name__}: {e}"]
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


_STARTUP_TIMEOUT = 120.0  # seconds a fresh child may take to import reasoning-gym (slow on a loaded machine)


class _OverLimit(GroupDropped):
    """``regeneration_limit`` caused by the item itself (past its time limit, or the child died running it, most
    likely of the memory cap), as opposed to a child that did not start: only the former says the config is costly,
    so only it is remembered (:class:`ReasoningGymVerifier`)."""

    def __init__(self, detail: str):
        super().__init__("regeneration_limit", detail)


class _Worker:
    """One child process and the pipes to it; started on first use, killed (by PID) and replaced past a limit.

    The time limit of a request covers the regeneration only: a fresh child first imports reasoning-gym and says
    "ready", which on a busy machine can take longer than an entry's whole limit. That start (the first, and the
    restart on the next request after a kill) is bounded by ``_STARTUP_TIMEOUT`` and, since a hostile peer can force a
    restart in every round, :class:`ReasoningGymVerifier` counts it into the round's budget with the request it
    delays.
    """

    def __init__(self, memory_mb: int | None):
        self.memory_mb = memory_mb
        self.process: subprocess.Popen | None = None
        self.lock = threading.Lock()

    def request(self, message: list, timeout: float) -> list:
        """The child's reply to ``message``; GroupDropped("regeneration_limit") past ``timeout`` or its death."""
        with self.lock:
            if self.process is None or self.process.poll() is not None:
                self._start()
            try:
                self.process.stdin.write(json.dumps(message) + "\n")
                self.process.stdin.flush()
                ready, _, _ = select.select([self.process.stdout], [], [], timeout)
                line = self.process.stdout.readline() if ready else None
            except (BrokenPipeError, OSError):
                line = ""
            if line:
                with contextlib.suppress(ValueError):
                    return json.loads(line)
                line = ""  # not a reply: the pipe is out of step, start afresh
            self._stop()
            if line is None:
                raise _OverLimit(f"no entry within {timeout:g} s")
            raise _OverLimit("the regeneration process died or answered out of step (out of memory?)")

    def _start(self) -> None:
        # A fresh interpreter (not fork: no copy of the trainer's memory and threads; not multiprocessing's
        # spawn: it would re-run the user's script).
        command = [sys.executable, "-m", "sapo.reasoning_gym", str(self.memory_mb or 0)]
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        ready, _, _ = select.select([self.process.stdout], [], [], _STARTUP_TIMEOUT)
        line = self.process.stdout.readline() if ready else ""
        if line.strip() != json.dumps(["ready"]):
            self._stop()
            raise GroupDropped(
                "regeneration_limit", f"the regeneration process did not start within {_STARTUP_TIMEOUT:g} s"
            )

    def _stop(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
        if process is not None:
            process.wait(timeout=10)
            process.stdin.close()
            process.stdout.close()


_worker = _Worker(memory_mb=4096)
atexit.register(_worker._stop)  # the child dies with this process (it also ends on its own when the pipe closes)


def regenerate_entry(task: TaskSpec, seed: int, index: int, timeout: float | None) -> dict[str, Any]:
    """The JSON-safe entry ``index`` of ``task`` with generator ``seed``: ``question``, ``answer``, ``metadata``.

    With ``timeout=None`` it is generated in this process (for configs this node runs itself); otherwise in the
    child process, which is killed and replaced past ``timeout`` seconds or 4 GB of address space. Raises
    :class:`GroupDropped`: ``regeneration_limit`` past a limit, ``unknown_task`` when reasoning-gym rejects the
    config or fails on it.
    """
    if timeout is None:
        try:
            return reasoning_gym_entry(_cached_generator(task.name, task.config_key, seed)[index])
        except Exception as e:  # a config reasoning-gym rejects, or accepts but cannot generate from
            raise GroupDropped(
                "unknown_task", f"{task.name} with config {task.config}: {type(e).__name__}: {e}"
            ) from None
    status, value = _worker.request([task.name, task.config_key, seed, index], timeout)
    if status != "ok":
        raise GroupDropped("unknown_task", f"reasoning-gym rejected {task.name!r} with config {task.config}: {value}")
    return value


# ----------------------------------------------------------------------------------------------
# verification of received questions

REMEMBERED_LIMITS = 256
"""Foreign configs a verifier remembers as past a limit (least recently refused forgotten first): enough for the
configs one round's pool can name, bounded against a peer that names a new one in every group."""

LIMIT_MEMORY_SECONDS = 3600.0
"""How long a config past a limit is refused without running it: the time limit is wall time, so a loaded machine can
push an honest config past it, which is then tried again after this; a hostile one costs one limit per hour."""


class ReasoningGymVerifier:
    """Verifies received reasoning-gym questions by regenerating them from their provenance.

    A question is kept only if the regenerated one equals it (after stripping whitespace); the question, answer and
    entry returned are those of this node's own row for the regenerated entry.

    Args:
        allowed_tasks: when given, only these tasks are regenerated: a name allows any config of that task, a
            :class:`TaskSpec` allows exactly its config. None allows every reasoning-gym task and config.
        timeout: seconds one foreign entry may take to regenerate (see :func:`regenerate_entry`); configs
            registered with :meth:`register_tasks` are regenerated in this process. None regenerates everything in
            this process, without a limit (and without the budget and memory below).
        round_budget: seconds of wall time the foreign entries of one round (from one :meth:`new_round` to the next)
            may spend, the child's start or restart included; once spent, the round's other foreign entries are
            refused as ``regeneration_budget``. An entry started within the budget runs under its own limit, so a
            round spends at most the budget plus one entry's limit and one restart. None: no budget.

    A foreign config past the time or memory limit is remembered (:data:`REMEMBERED_LIMITS` of them, for
    :data:`LIMIT_MEMORY_SECONDS`): its later entries are refused as ``regeneration_limit`` at once, without the child.
    ``counts`` says what foreign entries met: ``child_runs``, ``over_budget`` and ``remembered_limit``.
    """

    def __init__(
        self,
        allowed_tasks: Sequence[TaskSpec | str] | None = None,
        timeout: float | None = 10.0,
        round_budget: float | None = 30.0,
    ):
        if timeout is not None and timeout <= 0:
            raise ValueError(f"regeneration timeout must be positive or None, got {timeout}")
        if round_budget is not None and not round_budget > 0:
            raise ValueError(f"regeneration budget must be positive or None, got {round_budget}")
        self.timeout = timeout
        self.round_budget = round_budget
        self.round_seconds = 0.0  # wall time foreign entries spent since the round began
        self.counts: Counter[str] = Counter()
        self._over_limit: OrderedDict[tuple[str, str], tuple[float, str]] = OrderedDict()  # -> (when, why)
        self._own_configs: set[tuple[str, str]] = set()  # (task, config key) regenerated in this process
        self._allowed: dict[str, set[str] | None] | None = None
        if allowed_tasks is not None:
            validate_task_names(allowed_tasks)
            self._allowed = {}
            for task in allowed_tasks:
                if isinstance(task, str):
                    self._allowed[task] = None  # any config
                elif self._allowed.get(task.name, set()) is not None:
                    self._allowed.setdefault(task.name, set()).add(task.config_key)

    def register_tasks(self, tasks: Sequence[TaskSpec]) -> None:
        """Configs this node generates itself: trusted to be cheap, regenerated in this process."""
        self._own_configs.update((task.name, task.config_key) for task in tasks)

    def new_round(self) -> None:
        """Begin a round: its foreign entries have the whole ``round_budget`` again."""
        self.round_seconds = 0.0

    def verify(self, provenance: Provenance, question: str) -> tuple[str, str, str]:
        """The entry ``provenance`` names, if its question is ``question`` (stripped): ``(question, answer, entry)``,
        the question as this node's own rows hold it and the ``answer`` and ``entry`` columns of its row (whose
        ``task`` and ``provenance`` columns are ``provenance``'s: see :func:`sapo.questions.reward_columns`).

        Raises :class:`GroupDropped` (``bad_provenance``, ``index_out_of_range``, ``unknown_task``,
        ``regeneration_limit``, ``regeneration_budget``, ``version_skew`` or ``question_mismatch``).
        """
        name, seed, index = provenance.task, provenance.seed, provenance.index
        if seed is None or index is None:
            raise GroupDropped("bad_provenance", "reasoning-gym provenance needs a seed and an index")
        if not 0 <= index < MAX_INDEX or not 0 <= seed < 2**32:
            raise GroupDropped("index_out_of_range", f"seed {seed}, index {index}")
        if name not in _task_names():
            raise GroupDropped("unknown_task", f"reasoning-gym has no task {name!r}")
        try:
            task = TaskSpec(name, provenance.config)
        except ValueError as e:
            raise GroupDropped("unknown_task", str(e)) from None
        configs = None if self._allowed is None else self._allowed.get(name, set())
        if configs is not None and task.config_key not in configs:
            raise GroupDropped(
                "unknown_task", f"{name} with config {task.config} is not among this node's allowed tasks"
            )
        if self.timeout is None or (name, task.config_key) in self._own_configs:
            entry = regenerate_entry(task, seed, index, timeout=None)
        else:
            entry = self._foreign_entry(task, seed, index)
        if entry["question"].strip() != question:
            local = reasoning_gym_version()
            if provenance.version is not None and provenance.version != local:
                skew = f"the sender has reasoning-gym {provenance.version}, this peer {local}"
                raise GroupDropped("version_skew", f"{name}[{index}]: {skew}")
            raise GroupDropped("question_mismatch", f"{name}[{index}] regenerates a different question")
        return (entry["question"], *_answer_and_entry(entry))

    def _foreign_entry(self, task: TaskSpec, seed: int, index: int) -> dict[str, Any]:
        """An entry of a config this node does not run itself: refused when the config was past a limit before or
        the round's budget is spent, else regenerated in the child, its wall time (a restart included) spent."""
        key = (task.name, task.config_key)
        before = self._remembered_limit(key)
        if before is not None:
            self.counts["remembered_limit"] += 1
            raise GroupDropped(
                "regeneration_limit", f"{task.name} with config {task.config} was past a limit before ({before})"
            )
        if self.round_budget is not None and self.round_seconds >= self.round_budget:
            self.counts["over_budget"] += 1
            raise GroupDropped(
                "regeneration_budget",
                f"this round spent {self.round_seconds:.1f} s of its {self.round_budget:g} s on configs of other peers",
            )
        self.counts["child_runs"] += 1
        started = time.monotonic()
        try:
            return regenerate_entry(task, seed, index, timeout=self.timeout)
        except _OverLimit as e:
            self._over_limit[key] = (time.monotonic(), e.detail)
            self._over_limit.move_to_end(key)
            while len(self._over_limit) > REMEMBERED_LIMITS:
                self._over_limit.popitem(last=False)
            raise
        finally:
            self.round_seconds += time.monotonic() - started

    def _remembered_limit(self, key: tuple[str, str]) -> str | None:
        """Why the config ``key`` was past a limit, if that is remembered and recent; a hit keeps it longest."""
        found = self._over_limit.get(key)
        if found is None:
            return None
        when, why = found
        if time.monotonic() - when > LIMIT_MEMORY_SECONDS:
            del self._over_limit[key]
            return None
        self._over_limit.move_to_end(key)
        return why


if __name__ == "__main__":
    _serve(int(sys.argv[1]) or None)
