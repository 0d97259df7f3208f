"""Trainers of one process taking turns step by step (so load from other processes spreads over all of them), and
plain ``trl.GRPOTrainer`` with SAPOTrainer's phase timers around generation and scoring."""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any


class Aborted(Exception):
    """Another trainer failed: this one stops at its next step."""


class Baton:
    """Whose turn it is among trainers running in threads; one trainer computes at a time."""

    def __init__(self, order: Sequence[str]):
        self._cond = threading.Condition()
        self._active = list(order)
        self.turn: str | None = self._active[0] if self._active else None
        self.aborted = False
        self.history: list[str] = []  # names in the order their steps ran

    def wait(self, name: str, timeout: float = 7200) -> None:
        """Block until it is ``name``'s turn; raises :class:`Aborted` once another trainer failed."""
        with self._cond:
            if not self._cond.wait_for(lambda: self.aborted or self.turn == name, timeout):
                raise TimeoutError(f"{name} waited {timeout:.0f} s for its turn")
            if self.aborted:
                raise Aborted(name)
            self.history.append(name)

    def pass_on(self, name: str) -> None:
        """Give the turn to the next active trainer (if ``name`` holds it)."""
        with self._cond:
            if self.turn == name and self._active:
                i = self._active.index(name)
                self.turn = self._active[(i + 1) % len(self._active)]
                self._cond.notify_all()

    def finish(self, name: str) -> None:
        """``name`` is done: pass the turn on and leave the rotation."""
        with self._cond:
            if name in self._active:
                if self.turn == name:
                    i = self._active.index(name)
                    rest = self._active[i + 1 :] + self._active[:i]
                    self.turn = rest[0] if rest else None
                self._active.remove(name)
            self._cond.notify_all()

    def abort(self) -> None:
        """Stop every trainer at its next step."""
        with self._cond:
            self.aborted = True
            self._cond.notify_all()


def make_turn_callback(name: str, baton: Baton, steps_per_turn: int, on_step: Callable[[str], None]) -> Any:
    """A TrainerCallback that waits for ``name``'s turn before a step, passes it on after
    ``steps_per_turn`` steps, and records each step's wall time (step begin to step end)."""
    from transformers import TrainerCallback

    class TakeTurns(TrainerCallback):
        def __init__(self) -> None:
            self.in_turn = 0
            self.started = 0.0
            self.wall: dict[int, float] = {}

        def on_step_begin(self, args, state, control, **kwargs):
            if self.in_turn >= steps_per_turn:
                baton.pass_on(name)
                self.in_turn = 0
            baton.wait(name)
            self.started = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.wall[state.global_step] = time.perf_counter() - self.started
            self.in_turn += 1
            on_step(name)

    return TakeTurns()


def train_in_turns(trainers: dict[str, Any], baton: Baton, threads: list[threading.Thread]) -> None:
    """Train each trainer in a thread of its own, the baton passing turns between them, until all have finished.

    The threads are appended to ``threads`` (so that a caller's cleanup can join them after an abort). The first
    trainer to fail aborts the others, and its error is raised here, naming the trainer."""
    errors: dict[str, BaseException] = {}

    def train(name: str) -> None:
        try:
            trainers[name].train()
        except Aborted:
            pass
        except BaseException as e:  # noqa: BLE001 - raised by the main thread below
            errors[name] = e
            baton.abort()
        finally:
            baton.finish(name)

    for name in trainers:
        threads.append(threading.Thread(target=train, args=(name,), name=f"bench-{name}", daemon=True))
        threads[-1].start()
    for thread in threads:
        thread.join()
    if errors:
        name, error = next(iter(errors.items()))
        raise RuntimeError(f"trainer {name!r} failed: {type(error).__name__}: {error}") from error


def timed_grpo_trainer_class() -> type:
    """``trl.GRPOTrainer``'s own round, with the same phase timers as SAPOTrainer around generation and scoring: the
    TRL bridge with its default round (TRL's, unchanged) and its `timed` hook measuring."""
    from sapo.trl_bridge import Phase, TRLBridge

    class TimedGRPOTrainer(TRLBridge):
        def sapo_round(self, inputs):
            self._bench_seconds = Counter()
            output = super().sapo_round(inputs)
            for phase, seconds in self._bench_seconds.items():
                self.record_metric(f"sapo/time/{phase}", seconds)
            return output

        @contextlib.contextmanager
        def timed(self, phase):
            start = time.perf_counter()
            try:
                yield
            finally:
                if self.phase is Phase.ROUND:  # not TRL's evaluation
                    self._bench_seconds[phase] += time.perf_counter() - start

    return TimedGRPOTrainer
