"""Reward functions that fail on a row without stopping training: the row is scored as failed, logged and counted.

TRL calls each reward function once per batch; one raising on any row stops the run. :class:`RewardGuard` wraps each
function so that a batch that raises is scored again row by row: the rows that still raise get ``None`` (TRL's "not
applicable", a NaN reward that weighs nothing), each is logged with the row's item key and the exception, and the
guard counts them. Past ``max_errors_in_a_row`` failed rows of one function in a row (a reward broken outright rather
than on some rows), or once more than ``max_error_rate`` of one function's last ``window`` own rows failed (a reward
that always fails on one kind of item, however they interleave), it raises :class:`RewardErrorLimit`, which stops
training with that reason.

Received groups are scored by the intake, which drops a group whose reward raises (``reward_error``): the guard lets
those errors through unchanged, so a foreign completion never counts against this peer's own rewards.

Example::

    guard = RewardGuard(max_errors_in_a_row=64, max_error_rate=0.5)
    trainer = SAPOTrainer(model, guard.wrap_all([my_reward, format_reward]), config, rows, ...)
    ...
    guard.errors  # own rows a reward function failed on
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import json
import logging
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["RewardErrorLimit", "RewardGuard", "check_reward_columns", "letting_errors_through", "reward_columns_read"]

TRL_REWARD_ARGUMENTS = frozenset(
    {"prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric", "environments"}
)
"""Arguments TRL passes every reward function besides the dataset's columns."""

_LET_THROUGH: contextvars.ContextVar[bool] = contextvars.ContextVar("sapo_reward_guard_let_through", default=False)


class RewardErrorLimit(RuntimeError):
    """A reward function failed on more of this peer's own rows than its guard allows (in a row, or as a share of
    its last rows): training stops. ``limit`` names the guard's argument that was reached."""

    def __init__(self, message: str, limit: str = "max_errors_in_a_row"):
        super().__init__(message)
        self.limit = limit


@contextlib.contextmanager
def letting_errors_through() -> Iterator[None]:
    """Within this context guarded reward functions raise as unguarded ones do (for callers that handle a reward's
    error themselves, such as the scoring of received groups)."""
    token = _LET_THROUGH.set(True)
    try:
        yield
    finally:
        _LET_THROUGH.reset(token)


def row_label(columns: dict[str, Any], row: int) -> str:
    """The item a batch row holds, for a log line: its provenance's key (or task, seed and index), else its
    position in the batch."""
    provenances = columns.get("provenance")
    raw = provenances[row] if isinstance(provenances, list) and row < len(provenances) else None
    try:
        wire = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        wire = None
    if isinstance(wire, dict):
        task = wire.get("task") or wire.get("dataset") or wire.get("source")
        if wire.get("key"):
            return f"{task} item {wire['key']}"
        if wire.get("seed") is not None:
            return f"{task}[{wire.get('seed')}, {wire.get('index')}]"
    return f"batch row {row}"


class RewardGuard:
    """Wraps reward functions (TRL's signature: ``prompts, completions, **columns``) so that one failing on a row
    scores that row as failed and training goes on (see the module docstring).

    Args:
        max_errors_in_a_row: how many of this peer's own rows in a row one reward function may fail on before
            :class:`RewardErrorLimit` stops training (None: never).
        max_error_rate: the share of one reward function's last ``window`` own rows that may fail (judged once it
            has scored ``window`` rows); more stops training (None: never).
        window: how many of a function's last own rows ``max_error_rate`` is judged on.

    Attributes:
        errors (`int`): own rows a guarded function failed on, over every function.
        last_error (`str | None`): the last failure's row and exception.
    """

    def __init__(self, max_errors_in_a_row: int | None = 64, max_error_rate: float | None = 0.5, window: int = 256):
        if max_errors_in_a_row is not None and max_errors_in_a_row < 1:
            raise ValueError(f"max_errors_in_a_row must be at least 1 or None, got {max_errors_in_a_row}")
        if max_error_rate is not None and not 0.0 <= max_error_rate < 1.0:
            raise ValueError(f"max_error_rate must be in [0, 1) or None, got {max_error_rate}")
        if window < 1:
            raise ValueError(f"window must be at least 1, got {window}")
        self.max_errors_in_a_row, self.max_error_rate, self.window = max_errors_in_a_row, max_error_rate, window
        self.errors = 0
        self.last_error: str | None = None
        self._in_a_row: dict[str, int] = {}
        self._recent: dict[str, deque[bool]] = {}  # per function: whether each of its last `window` own rows failed
        self._lock = threading.Lock()

    def wrap_all(self, funcs: Sequence[Any]) -> list[Any]:
        """Each of ``funcs`` guarded (reward models and names of models are passed through unchanged)."""
        return [self.wrap(f) for f in funcs]

    def wrap(self, func: Any) -> Any:
        """``func`` guarded: same name (TRL names its metrics by it) and signature. A reward model (a
        `torch.nn.Module`), a model name, an async function or a function already guarded is returned as is."""
        if not callable(func) or hasattr(func, "__sapo_reward_guard__") or _is_module(func):
            return func
        if inspect.iscoroutinefunction(func):
            return func
        name = getattr(func, "__name__", type(func).__name__)

        @functools.wraps(func)
        def guarded(prompts: list[Any], completions: list[Any], **columns: Any) -> list[float | None]:
            try:
                scores = list(func(prompts=prompts, completions=completions, **columns))
            except Exception as e:
                if _LET_THROUGH.get():  # the caller handles it (the intake drops a received group as reward_error)
                    raise
                scores = self._row_by_row(func, name, prompts, completions, columns, e)
            else:
                self._succeeded(name, len(prompts))
            log_metric = columns.get("log_metric")
            if callable(log_metric):
                log_metric("sapo/total/reward_errors", float(self.errors))
            return scores

        guarded.__sapo_reward_guard__ = self  # type: ignore[attr-defined]
        return guarded

    def _row_by_row(
        self, func: Callable[..., Any], name: str, prompts: list[Any], completions: list[Any],
        columns: dict[str, Any], batch_error: Exception,
    ) -> list[float | None]:  # fmt: skip
        n = len(prompts)
        scores: list[float | None] = []
        for row in range(n):
            sliced = {k: [v[row]] if isinstance(v, list) and len(v) == n else v for k, v in columns.items()}
            try:
                out = list(func(prompts=[prompts[row]], completions=[completions[row]], **sliced))
                if len(out) != 1:
                    raise ValueError(f"returned {len(out)} rewards for one completion")
            except Exception as e:
                self._failed(name, row_label(columns, row), e)
                scores.append(None)
            else:
                self._succeeded(name)
                scores.append(out[0])
        if all(s is not None for s in scores):  # the batch failed as a whole, no single row does
            self._failed(name, f"a batch of {n} rows (each scores alone)", batch_error, count=False)
        return scores

    def _succeeded(self, name: str, rows: int = 1) -> None:
        with self._lock:
            self._in_a_row[name] = 0
            self._recent.setdefault(name, deque(maxlen=self.window)).extend([False] * rows)

    def _failed(self, name: str, row: str, error: Exception, count: bool = True) -> None:
        with self._lock:
            recent = self._recent.setdefault(name, deque(maxlen=self.window))
            if count:
                self.errors += 1
                self._in_a_row[name] = self._in_a_row.get(name, 0) + 1
                recent.append(True)
            in_a_row = self._in_a_row.get(name, 0)
            failed_recently = sum(recent) if len(recent) == self.window else 0
            self.last_error = f"{name} on {row}: {type(error).__name__}: {error}"
        logger.error(
            "reward %s raised on %s, scored as failed (%d reward error(s) so far): %s: %s",
            name, row, self.errors, type(error).__name__, error,
        )  # fmt: skip
        last = f"last, on {row}: {type(error).__name__}: {error}"
        if self.max_errors_in_a_row is not None and in_a_row >= self.max_errors_in_a_row:
            raise RewardErrorLimit(
                f"reward {name} failed on {in_a_row} own rows in a row (limit {self.max_errors_in_a_row}); {last}"
            ) from error
        if self.max_error_rate is not None and failed_recently > self.max_error_rate * self.window:
            raise RewardErrorLimit(
                f"reward {name} failed on {failed_recently} of its last {self.window} own rows (limit "
                f"{self.max_error_rate:g} of them); {last}",
                limit="max_error_rate",
            ) from error


def reward_guards(funcs: Sequence[Any]) -> list[RewardGuard]:
    """The `RewardGuard`s wrapping ``funcs`` (a trainer's reward functions), each once."""
    guards = (getattr(f, "__sapo_reward_guard__", None) for f in funcs)
    return list({id(g): g for g in guards if g is not None}.values())


def _is_module(func: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(func, torch.nn.Module)


def reward_columns_read(func: Any) -> list[str]:
    """The dataset columns ``func`` requires by its signature: named parameters without a default, other than the
    arguments TRL passes itself (:data:`TRL_REWARD_ARGUMENTS`). Empty when the signature cannot be read."""
    try:
        parameters = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):
        return []
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [
        p.name
        for p in parameters
        if p.kind in kinds and p.default is inspect.Parameter.empty and p.name not in TRL_REWARD_ARGUMENTS
    ]


def check_reward_columns(funcs: Sequence[Any], columns: Sequence[str]) -> None:
    """Raise ``ValueError`` naming the first reward function that requires a column ``columns`` lacks, with the
    columns present (before any step, rather than a ``TypeError`` in the first one)."""
    present = set(columns)
    for func in funcs:
        missing = [c for c in reward_columns_read(func) if c not in present]
        if missing:
            name = getattr(func, "__name__", type(func).__name__)
            raise ValueError(
                f"reward {name} reads column(s) {', '.join(missing)} that the training rows lack; columns present: "
                f"{', '.join(sorted(present))} (rename the reward's parameters, or the data's columns)"
            )
