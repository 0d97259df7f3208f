"""Regeneration of reasoning-gym entries for configs sent by other peers, in a child process with a time limit.

A received group names the reasoning-gym config its question came from, and the receiver regenerates the
question to check it. A hostile peer can name a config that is expensive to run (a Rubik's cube scrambled
millions of times, a spiral matrix of millions of cells): run in the training process, it would stall the node
for minutes or exhaust its memory. Configs the node does not use itself therefore run here: in one child
process per training process, with a time limit per entry and a cap on its address space; a child past its
limit is killed (by its PID) and replaced on the next request.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import datetime
import enum
import functools
import json
import os
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping
from typing import Any

__all__ = ["RegenerationFailed", "RegenerationLimit", "reasoning_gym_entry", "regenerate_entry"]

MAX_INDEX = 2**31 - 1
"""reasoning-gym datasets are virtual (entry i is generated from (seed, i) on demand): generators are built with
this size, so any index an honest peer can produce is in range."""


def is_scalar(value: Any) -> bool:
    """True for JSON scalars (None, str, int, float, bool)."""
    return value is None or isinstance(value, str | int | float | bool)


def _json_safe(value: Any) -> Any:
    """A JSON-serializable copy of an entry value (metadata may hold tuples, sets, enums, dates, numpy)."""
    if is_scalar(value):
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


class RegenerationLimit(Exception):
    """The entry took longer than the time limit, or its child process ran out of memory and died."""


class RegenerationFailed(Exception):
    """reasoning-gym rejected the config or failed to generate from it."""


@functools.lru_cache(maxsize=64)
def cached_generator(name: str, config_key: str, seed: int) -> Any:
    """The reasoning-gym dataset ``name`` for a config (canonical JSON) and seed, built once per process."""
    import reasoning_gym

    return reasoning_gym.create_dataset(name, seed=seed, size=MAX_INDEX, **json.loads(config_key))


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
            reply = ["ok", reasoning_gym_entry(cached_generator(name, config_key, seed)[index])]
        except Exception as e:  # noqa: BLE001 - every failure of foreign input is an answer, not a crash
            reply = ["failed", f"{type(e).__name__}: {e}"]
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


_STARTUP_TIMEOUT = 120.0  # seconds a fresh child may take to import reasoning-gym (slow on a loaded machine)


class _Worker:
    """One child process and the pipes to it; started on first use, killed (by PID) and replaced past a limit.

    The time limit of a request covers the regeneration only: a fresh child first imports reasoning-gym and says
    "ready", which on a busy machine can take longer than an entry's whole budget.
    """

    def __init__(self, memory_mb: int | None):
        self.memory_mb = memory_mb
        self.process: subprocess.Popen | None = None
        self.lock = threading.Lock()

    def request(self, message: list, timeout: float) -> list:
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
                raise RegenerationLimit(f"no entry within {timeout:g} s")
            raise RegenerationLimit("the regeneration process died or answered out of step (out of memory?)")

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
            raise RegenerationLimit(f"the regeneration process did not start within {_STARTUP_TIMEOUT:g} s")

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


def regenerate_entry(name: str, config_key: str, seed: int, index: int, timeout: float) -> dict[str, Any]:
    """The JSON-safe entry ``index`` of reasoning-gym dataset ``name`` (config as canonical JSON, ``seed``),
    generated in the child process.

    Raises :class:`RegenerationLimit` past ``timeout`` seconds or 4 GB of address space (the child is then
    replaced), :class:`RegenerationFailed` when reasoning-gym rejects the config or fails on it.
    """
    status, value = _worker.request([name, config_key, seed, index], timeout)
    if status != "ok":
        raise RegenerationFailed(value)
    return value


if __name__ == "__main__":
    _serve(int(sys.argv[1]) or None)
