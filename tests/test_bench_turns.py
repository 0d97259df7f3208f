"""benchmarks/turns.py: trainers in threads take turns step by step, one that finishes early leaves the rotation, and a
failure stops the others and is raised naming its trainer."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from benchmarks import turns


def test_trainers_take_turns_and_one_that_finishes_leaves_the_rotation():
    names = ("a", "b", "c")
    baton = turns.Baton(names)
    steps_of = {"a": 3, "b": 2, "c": 3}  # b finishes early: the others go on without it
    done: list[str] = []
    callbacks = {name: turns.make_turn_callback(name, baton, 1, done.append) for name in names}

    def trainer(name):
        callback = callbacks[name]
        try:
            for step in range(1, steps_of[name] + 1):
                state = SimpleNamespace(global_step=step)
                callback.on_step_begin(None, state, None)
                callback.on_step_end(None, state, None)
        finally:
            baton.finish(name)

    threads = [threading.Thread(target=trainer, args=(n,), daemon=True) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert baton.history == ["a", "b", "c", "a", "b", "c", "a", "c"]
    assert done == baton.history
    assert sorted(callbacks["a"].wall) == [1, 2, 3]  # each step's wall time, by global step


def test_an_aborted_baton_stops_whoever_waits():
    baton = turns.Baton(("a", "b"))
    baton.abort()
    with pytest.raises(turns.Aborted):
        baton.wait("a", timeout=1)


def test_a_failing_trainer_stops_the_others_and_is_named():
    names = ("good", "bad")
    baton = turns.Baton(names)
    callbacks = {name: turns.make_turn_callback(name, baton, 1, lambda name: None) for name in names}

    class Trainer:
        def __init__(self, name: str, fail_at: int | None):
            self.name, self.fail_at, self.steps = name, fail_at, 0

        def train(self) -> None:
            for step in range(1, 100):
                callbacks[self.name].on_step_begin(None, SimpleNamespace(global_step=step), None)
                if step == self.fail_at:
                    raise ValueError("out of memory")
                self.steps = step
                callbacks[self.name].on_step_end(None, SimpleNamespace(global_step=step), None)

    trainers = {"good": Trainer("good", None), "bad": Trainer("bad", fail_at=2)}
    threads: list[threading.Thread] = []
    with pytest.raises(RuntimeError, match=r"trainer 'bad' failed: ValueError: out of memory"):
        turns.train_in_turns(trainers, baton, threads)
    assert trainers["good"].steps == 2 and trainers["bad"].steps == 1  # good stopped at its next turn
    assert not any(t.is_alive() for t in threads)
