"""Regenerating received reasoning-gym questions: a foreign config in a child process under a time limit and a memory
cap, and the verifier that spends a budget of seconds per round and remembers the configs past a limit.

- :func:`regenerate_entry`: one entry, in this process or, for a config this node does not run itself, in a child
  process with a time limit and a memory cap (a hostile peer can name a config that runs for minutes);
- :class:`ReasoningGymVerifier`: a received question in, the question, answer and entry of this node's own row out,
  or :class:`sapo.questions.GroupDropped` with the reason (the only error it raises).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Sequence
from typing import Any

from sapo.questions import GroupDropped
from sapo.reasoning_gym import (
    EAGER_TASKS,
    MAX_INDEX,
    TaskSpec,
    answer_and_entry,
    cached_generator,
    reasoning_gym_entry,
    reasoning_gym_version,
    task_names,
    validate_task_names,
)
from swarm.records import Provenance

__all__ = ["LIMIT_MEMORY_SECONDS", "MAX_BUILD_BYTES", "REMEMBERED_LIMITS", "ReasoningGymVerifier", "regenerate_entry"]


# ----------------------------------------------------------------------------------------------
# the child process
#
# A hostile peer can name a config that is expensive to run (a Rubik's cube scrambled millions of times, a spiral
# matrix of millions of cells): run in the training process, it would stall the node for minutes or exhaust its
# memory. Configs the node does not use itself therefore run in one child process per training process, with a time
# limit per entry and a cap on its address space; a child past its limit is killed (by its PID) and replaced on the
# next request.


MAX_ENTRY_CHARS = 1_048_576
"""The largest regenerated entry (its JSON reply) a child sends the training process; a larger one is past a limit
(``regeneration_limit``, its config remembered). An honest entry takes a few kilobytes; a peer's config of a
Tower of Hanoi of 23 disks made one of about 277 MB, which the training process parsed and held whole."""


MAX_BUILD_BYTES = 128_000_000
"""The most memory a foreign config's generator may take to build (the peak resident memory its build added in the
child); a config past it is past a limit (``regeneration_limit``, remembered). The node builds the config's dataset
again in the training process to score the group's answers (:func:`rewards.get_reasoning_gym_scorer`), where one
allocation is not bounded by the scoring deadline: `count_primes` up to twenty million builds a sieve of 160 MB. The
largest of reasoning-gym's own tasks at their defaults takes about 29 MB (`arc_agi`)."""

MEASURED_BUILDS = 4096
"""Generators whose build the child remembers measuring; past it the child forgets them and the generators it keeps
together, so that none is kept unmeasured."""


def _resident_bytes(field: str) -> int | None:
    """A field of ``/proc/self/status`` in bytes (``VmRSS``, ``VmHWM``), None where there is none."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(f"{field}:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _measured_generator(
    name: str, config_key: str, seed: int, measured: dict[tuple[str, str, int], int]
) -> tuple[Any, int]:
    """The child's generator of a config and seed, and the memory its first build took here: the peak resident memory
    over what was resident before (Linux resets the peak through ``/proc/self/clear_refs``; where it cannot, the
    resident memory the build left; 0 where neither can be read)."""
    key = (name, config_key, seed)
    if key not in measured:
        if len(measured) >= MEASURED_BUILDS:
            measured.clear()
            cached_generator.cache_clear()
        before = _resident_bytes("VmRSS")
        try:
            with open("/proc/self/clear_refs", "w") as clear_refs:
                clear_refs.write("5")  # the peak resident memory (VmHWM) starts again from what is resident now
            peak_field = "VmHWM"
        except OSError:
            peak_field = "VmRSS"
        cached_generator(name, config_key, seed)
        after = _resident_bytes(peak_field)
        measured[key] = 0 if before is None or after is None else max(0, after - before)
    return cached_generator(name, config_key, seed), measured[key]


def _serve(memory_mb: int | None) -> None:
    """The child's loop over stdin/stdout, one JSON line each way: [name, config_key, seed, index] in,
    ["ok", entry, build bytes] (what the generator took to build, :func:`_measured_generator`), ["failed", message]
    or ["too_large", characters] (over :data:`MAX_ENTRY_CHARS`) out. Ends when the parent closes the pipe."""
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
    measured: dict[tuple[str, str, int], int] = {}
    for line in sys.stdin:
        name, config_key, seed, index = json.loads(line)
        try:
            generator, build_bytes = _measured_generator(name, config_key, seed, measured)
            reply = json.dumps(["ok", reasoning_gym_entry(generator[index]), build_bytes])
        except Exception as e:  # noqa: BLE001 - every failure of foreign input is an answer, not a crash
            reply = json.dumps(["failed", f"{type(e).__name__}: {e}"])
        if len(reply) > MAX_ENTRY_CHARS:  # told, not sent: the parent would hold it whole
            reply = json.dumps(["too_large", len(reply)])
        replies.write(reply + "\n")
        replies.flush()


_STARTUP_TIMEOUT = 120.0  # seconds a fresh child may take to import reasoning-gym (slow on a loaded machine)


class _OverLimit(GroupDropped):
    """``regeneration_limit`` caused by the item itself (past its time limit, or the child died running it, most
    likely of the memory cap), as opposed to a child that did not start: only the former says the config is costly,
    so only it is remembered (:class:`ReasoningGymVerifier`). ``timed_out``: the time limit, not a death."""

    def __init__(self, detail: str, timed_out: bool = False):
        super().__init__("regeneration_limit", detail)
        self.timed_out = timed_out


class _Worker:
    """One child process and the pipes to it; started on first use, killed (by PID) and replaced past a limit.

    The time limit of a request covers the regeneration only: a fresh child first imports reasoning-gym and says
    "ready", which on a busy machine can take longer than an entry's whole limit. That start is bounded by
    ``_STARTUP_TIMEOUT``. The first start comes with the first request; a child killed past a limit is started again
    at once, within the request that was past it, so that its restart is that request's cost (and its sender's,
    :mod:`sapo.rederivation`), not the next request's, which may be another sender's. :class:`ReasoningGymVerifier`
    counts either into the round's budget.
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
            with contextlib.suppress(GroupDropped):  # one that does not start is started again at the next request
                self._start()
            if line is None:
                raise _OverLimit(f"no entry within {timeout:g} s", timed_out=True)
            raise _OverLimit("the regeneration process died or answered out of step (out of memory?)")

    def _start(self) -> None:
        # A fresh interpreter (not fork: no copy of the trainer's memory and threads; not multiprocessing's
        # spawn: it would re-run the user's script).
        command = [sys.executable, "-m", "sapo.regeneration", str(self.memory_mb or 0)]
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
    :class:`GroupDropped`: ``regeneration_limit`` past a limit (in the child: also an entry over
    :data:`MAX_ENTRY_CHARS` or a generator that took more than :data:`MAX_BUILD_BYTES` to build), ``unknown_task``
    when reasoning-gym rejects the config or fails on it.
    """
    if timeout is None:
        try:
            return reasoning_gym_entry(cached_generator(task.name, task.config_key, seed)[index])
        except Exception as e:  # a config reasoning-gym rejects, or accepts but cannot generate from
            raise GroupDropped(
                "unknown_task", f"{task.name} with config {task.config}: {type(e).__name__}: {e}"
            ) from None
    status, value, *build_bytes = _worker.request([task.name, task.config_key, seed, index], timeout)
    if status == "too_large":
        raise _OverLimit(f"its entry is {value:,} characters of JSON, over {MAX_ENTRY_CHARS:,}")
    if status != "ok":
        raise GroupDropped("unknown_task", f"reasoning-gym rejected {task.name!r} with config {task.config}: {value}")
    if build_bytes[0] > MAX_BUILD_BYTES:
        raise _OverLimit(
            f"its generator took {build_bytes[0] / 1e6:,.0f} MB to build, over {MAX_BUILD_BYTES / 1e6:,.0f} MB "
            "(its answers' scorer would build it again in this process)"
        )
    return value


# ----------------------------------------------------------------------------------------------
# verification of received questions

REMEMBERED_LIMITS = 256
"""Foreign configs a verifier remembers as past a limit (least recently refused forgotten first): enough for the
configs one round's pool can name, bounded against a peer that names a new one in every group."""

MIN_BUDGET_LEFT = 1.0
"""Seconds of a round's budget below which a foreign entry is refused unrun (``regeneration_budget``) rather than run
and cut: an honest entry takes milliseconds, so a cut kills (and restarts) a child only for an entry that is slow."""

REMEMBERED_ENTRIES = 256
"""Foreign entries a verifier keeps once regenerated (least recently used forgotten first), each of at most
:data:`REMEMBERED_ENTRY_BYTES` as JSON: an item sent again, in one round or the next, costs no second run."""

REMEMBERED_ENTRY_BYTES = 65_536
"""The largest entry (its JSON) a verifier keeps: an honest question and answer take a few kilobytes."""

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
            may spend, the child's start or restart included; once spent (less than :data:`MIN_BUDGET_LEFT` left),
            the round's other foreign entries are refused as ``regeneration_budget``. An entry runs under its own
            limit or what is left of the budget, whichever is less, and one cut by the budget is refused as
            ``regeneration_budget`` (its config not remembered: it was not past its own limit), so a round spends
            at most the budget and one restart of the child. None: no budget.

    A foreign config past the time or memory limit (or with an entry over :data:`MAX_ENTRY_CHARS` or a generator over
    :data:`MAX_BUILD_BYTES`) is remembered (:data:`REMEMBERED_LIMITS` of them, for
    :data:`LIMIT_MEMORY_SECONDS`): its later entries are refused as ``regeneration_limit`` at once, without the child.
    A foreign entry regenerated is kept (:data:`REMEMBERED_ENTRIES`, each at most :data:`REMEMBERED_ENTRY_BYTES`): the
    same item sent again costs no second run. ``counts`` says what foreign entries met: ``child_runs``,
    ``over_budget``, ``remembered_limit`` and ``remembered_entry``.
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
        self._entries: OrderedDict[tuple[str, str, int, int], dict[str, Any]] = OrderedDict()  # foreign, regenerated
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

    def is_foreign(self, provenance: Provenance) -> bool:
        """Whether ``provenance`` names a config that would be regenerated in the child (a valid task's config this
        node does not run itself, with a ``timeout``); what is refused before regenerating is not."""
        if provenance.task not in task_names():
            return False
        try:
            task = TaskSpec(provenance.task, provenance.config)
        except ValueError:
            return False
        return not self._in_process(task)

    def _in_process(self, task: TaskSpec) -> bool:
        """Whether ``task``'s entries are regenerated in this process: configs it runs itself, or every config
        without a ``timeout``."""
        return self.timeout is None or (task.name, task.config_key) in self._own_configs

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
        if name not in task_names():
            known = "builds all of its entries up front; not regenerated" if name in EAGER_TASKS else "is not known"
            raise GroupDropped("unknown_task", f"reasoning-gym task {name!r} {known}")
        try:
            task = TaskSpec(name, provenance.config)
        except ValueError as e:
            raise GroupDropped("unknown_task", str(e)) from None
        configs = None if self._allowed is None else self._allowed.get(name, set())
        if configs is not None and task.config_key not in configs:
            raise GroupDropped(
                "unknown_task", f"{name} with config {task.config} is not among this node's allowed tasks"
            )
        if self._in_process(task):
            entry = regenerate_entry(task, seed, index, timeout=None)
        else:
            entry = self._foreign_entry(task, seed, index)
        if entry["question"].strip() != question:
            local = reasoning_gym_version()
            if provenance.version is not None and provenance.version != local:
                skew = f"the sender has reasoning-gym {provenance.version}, this peer {local}"
                raise GroupDropped("version_skew", f"{name}[{index}]: {skew}")
            raise GroupDropped("question_mismatch", f"{name}[{index}] regenerates a different question")
        return (entry["question"], *answer_and_entry(entry))

    def _foreign_entry(self, task: TaskSpec, seed: int, index: int) -> dict[str, Any]:
        """An entry of a config this node does not run itself: refused when the config was past a limit before,
        the one kept when it was regenerated lately, refused when the round's budget is spent, else regenerated in
        the child within its limit or the budget's rest, whichever is less, its wall time (a restart included)
        spent."""
        key = (task.name, task.config_key)
        before = self._remembered_limit(key)
        if before is not None:
            self.counts["remembered_limit"] += 1
            raise GroupDropped(
                "regeneration_limit", f"{task.name} with config {task.config} was past a limit before ({before})"
            )
        item = (*key, seed, index)
        entry = self._entries.get(item)
        if entry is not None:
            self.counts["remembered_entry"] += 1
            self._entries.move_to_end(item)
            return entry
        if self.round_budget is not None and self.round_budget - self.round_seconds < MIN_BUDGET_LEFT:
            self.counts["over_budget"] += 1
            raise GroupDropped(
                "regeneration_budget",
                f"this round spent {self.round_seconds:.1f} s of its {self.round_budget:g} s on configs of other peers",
            )
        self.counts["child_runs"] += 1
        limit = self.timeout
        if self.round_budget is not None:
            limit = min(limit, self.round_budget - self.round_seconds)
        started = time.monotonic()
        try:
            entry = regenerate_entry(task, seed, index, timeout=limit)
        except _OverLimit as e:
            if e.timed_out and limit < self.timeout:  # cut by the budget, not by its own limit: not remembered
                self.counts["over_budget"] += 1
                raise GroupDropped(
                    "regeneration_budget", f"cut after the {limit:.1f} s left of this round's {self.round_budget:g} s"
                ) from None
            self._over_limit[key] = (time.monotonic(), e.detail)
            self._over_limit.move_to_end(key)
            while len(self._over_limit) > REMEMBERED_LIMITS:
                self._over_limit.popitem(last=False)
            raise
        finally:
            self.round_seconds += time.monotonic() - started
        if len(json.dumps(entry)) <= REMEMBERED_ENTRY_BYTES:
            self._entries[item] = entry
            while len(self._entries) > REMEMBERED_ENTRIES:
                self._entries.popitem(last=False)
        return entry

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
