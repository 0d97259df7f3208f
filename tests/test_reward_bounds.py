"""What scoring one hostile answer may cost (rewards.scoring_bounds): numbers too large to compute are refused before
sympy parses them, a scorer past its deadline scores 0.0, and honest answers score as before."""

from __future__ import annotations

import gc
import json
import math
import os
import signal
import sys
import threading
import time

import pytest
import reasoning_gym

from rewards import functions, reasoning_gym_reward
from rewards.functions import _is_plain_math, score_reasoning_gym_answer
from rewards.scoring_bounds import ScoringTimeout, exact_arithmetic_bounded, scoring_deadline
from sapo.reasoning_gym import reasoning_gym_entry

SYMPY_TASKS = ["countdown", "puzzle24", "polynomial_multiplication", "simple_integration", "intermediate_integration"]


def _entry(name: str, index: int = 0) -> dict:
    return reasoning_gym_entry(reasoning_gym.create_dataset(name, seed=7, size=index + 1)[index])


def test_numbers_too_large_to_compute_never_reach_the_scorer(monkeypatch):
    """``9**9**9`` is seven characters and an integer of about 370 million digits, computed by sympy's parser in one C
    call that nothing interrupts: it used to stall the node's training step for good."""
    entry = _entry("countdown")
    seen = []

    def recording_scorer(name, config=None):
        def score(answer, entry):
            seen.append(answer)
            return 1.0 if answer == entry["answer"] else 0.05  # never computes what it is given

        return score

    monkeypatch.setattr(functions, "get_reasoning_gym_scorer", recording_scorer)
    bombs = ["9**9**9", "9^9^9", "9**8000000", "(10**999)**999", "2**(100000000/7)", "N(pi, 10**7)", "1e99999999"]
    completions = [f"<answer>{a}</answer>" for a in [*bombs, entry["answer"], "(1+2)*3"]]
    rewards = reasoning_gym_reward(["q"] * len(completions), completions, entry=[json.dumps(entry)] * len(completions))
    assert rewards == [0.0] * len(bombs) + [1.0, 0.05]
    assert seen == [entry["answer"], "(1+2)*3"]


@pytest.mark.parametrize("name", SYMPY_TASKS)
def test_every_gold_answer_sympy_could_parse_before_still_scores(name):
    entries = [reasoning_gym_entry(e) for e in reasoning_gym.create_dataset(name, seed=11, size=60)]
    plain = [e for e in entries if _is_plain_math(e["answer"])]  # intermediate_integration's Integral(...) never was
    assert len(plain) >= 40
    assert all(exact_arithmetic_bounded(e["answer"]) for e in plain)
    if name != "intermediate_integration":  # its scorer's simplify refuses a few of its own gold answers
        assert all(score_reasoning_gym_answer(e["answer"], e) == 1.0 for e in plain)


@pytest.mark.parametrize(
    "answer",
    ["75*3 - 8/2", "6*x**5 - 3*x**3 + 2", "x**(1/2) + C", "E**(2*x)/2", "exp(-x)*sin(x)", "log(x, 2)", "2^10",
     "9**1000", "(1/10)**(-999)", "2**(x**2)", "1.5e3*x"],
)  # fmt: skip
def test_what_honest_math_looks_like_is_bounded(answer):
    assert exact_arithmetic_bounded(answer)


@pytest.mark.parametrize(
    "answer",
    ["9**(99*99*99)", "2**(1/0.0000001)", "2**(x*0 + 99999999)", "2**exp(20)", "2**(1/x)", "(1/10)**(-100000)",
     "9**(x**-1)", "S(2)", "x.real", "x = 2", "Integral(x, x)", "((9**1000)**1000)**1000"],
)  # fmt: skip
def test_powers_and_calls_it_cannot_bound_are_refused(answer):
    assert not exact_arithmetic_bounded(answer)


def _alarm_state():
    left, interval = signal.getitimer(signal.ITIMER_REAL)
    return signal.getsignal(signal.SIGALRM), left > 0, interval


def test_a_scorer_past_its_deadline_scores_zero_even_if_it_catches_exceptions(monkeypatch):
    """The deadline raises a BaseException, again every 50 ms: reasoning-gym's scorers turn every ``Exception`` into a
    low score and would carry on."""
    before = _alarm_state()

    def stubborn_scorer(name, config=None):
        def score(answer, entry):
            while True:
                try:
                    sum(range(10_000))
                except Exception:
                    continue

        return score

    monkeypatch.setattr(functions, "SCORER_SECONDS", 0.2)
    monkeypatch.setattr(functions, "get_reasoning_gym_scorer", stubborn_scorer)
    assert score_reasoning_gym_answer("1 + 2", _entry("countdown")) == 0.0
    assert _alarm_state() == before  # the handler restored, no timer left running


def _two_questions_scored(monkeypatch, deadline: float, busy: float) -> tuple[list, list, list[str]]:
    """``reasoning_gym_reward`` of five answers, four to one question and one to another, under a ``deadline`` of
    ``SCORER_SECONDS``, by a scorer that busies itself ``busy`` seconds of wall time (``math.inf``: for ever, catching
    nothing) and then scores 1.0: the rewards, the questions the scorer was called on, and the two questions."""
    calls = []

    def busy_scorer(name, config=None):
        def score(answer, entry):
            calls.append(entry["question"])
            until = time.monotonic() + busy  # wall time, as the deadline counts it
            while time.monotonic() < until:
                sum(range(1_000))
            return 1.0

        return score

    monkeypatch.setattr(functions, "SCORER_SECONDS", deadline)
    monkeypatch.setattr(functions, "get_reasoning_gym_scorer", busy_scorer)
    first, second = _entry("countdown", 0), _entry("countdown", 1)
    completions = [f"<answer>{k} + 1</answer>" for k in range(5)]
    rewards = reasoning_gym_reward(["q"] * 5, completions, entry=[json.dumps(first)] * 4 + [json.dumps(second)])
    return rewards, calls, [first["question"], second["question"]]


def test_a_group_of_slow_answers_costs_one_deadline_not_one_each(monkeypatch):
    """A received group is one call of one question: after its first answer runs past the deadline, the others score
    0.0 unscored, while another question in the same call is still scored."""
    rewards, calls, (first, second) = _two_questions_scored(monkeypatch, deadline=0.1, busy=math.inf)
    assert rewards == [0.0] * 5
    assert calls == [first, second]


def test_a_questions_answers_share_one_deadline(monkeypatch):
    """Answers that each take just under a deadline of their own cost a group num_generations deadlines: a question's
    answers in one call share it, the answer that runs past what is left scores 0.0 and the rest go unscored, while
    another question in the same call gets a deadline of its own."""
    rewards, calls, (first, second) = _two_questions_scored(monkeypatch, deadline=0.5, busy=0.3)
    assert rewards == [1.0, 0.0, 0.0, 0.0, 1.0]  # 0.3 s scored, then 0.2 s left ran out; the other question scored
    assert calls == [first] * 2 + [second]


def test_sympys_slow_symbolic_work_is_ended_by_the_deadline(monkeypatch):
    """``simplify`` of this answer's derivative runs for seconds on a real scorer; the deadline ends it."""
    monkeypatch.setattr(functions, "SCORER_SECONDS", 0.3)
    entry = _entry("simple_integration")
    assert exact_arithmetic_bounded("(x+y+z+w+v)**20")  # small numbers: it is the symbolic work that is long
    assert score_reasoning_gym_answer("(x+y+z+w+v)**20", entry) == 0.0
    assert score_reasoning_gym_answer(entry["answer"], entry) == 1.0


def test_math_rewards_answers_to_one_question_share_one_deadline(monkeypatch):
    """`math_reward` hands answers to math-verify, whose own alarm gave each parse 5 s: eight answers `9**9**9` to one
    question (a received group) kept the node scoring 40 s. They share `SCORER_SECONDS` now: the first is parsed until
    it is spent, the others score 0.0 unparsed, except an answer equal to the gold one as text (no parse); another
    question in the same call has a deadline of its own, and no timer is left running."""
    import math_verify

    before = _alarm_state()
    parsed = []
    parse = math_verify.parse
    monkeypatch.setattr(math_verify, "parse", lambda text, **kw: parsed.append(text) or parse(text, **kw))
    monkeypatch.setattr(functions, "SCORER_SECONDS", 0.3)
    completions = ["<answer>9**9**9</answer>"] * 8 + ["<answer>3</answer>", "<answer>2/4</answer>"]
    rewards = functions.math_reward(["q"] * 9 + ["r"], completions, answer=["3"] * 9 + ["0.5"])
    assert rewards == [0.0] * 8 + [1.0, 1.0]
    assert sum(text.strip("$") == "9**9**9" for text in parsed) == 1
    assert _alarm_state() == before


def test_the_deadline_keeps_another_timer_and_leaves_other_threads_alone():
    fired = []
    previous = signal.signal(signal.SIGALRM, lambda *_: fired.append(True))
    try:
        signal.setitimer(signal.ITIMER_REAL, 60)
        with pytest.raises(ScoringTimeout):  # due before the other timer: the deadline holds
            with scoring_deadline(0.05):
                threading.Event().wait(5)
        assert 50 < signal.getitimer(signal.ITIMER_REAL)[0] < 60 and not fired  # the other timer goes on, less the wait
        signal.setitimer(signal.ITIMER_REAL, 0.1)
        with scoring_deadline(10):  # the other timer is due first: it fires with its own handler
            threading.Event().wait(0.5)
        assert fired
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)

    outcome = []

    def off_the_main_thread():
        try:
            with scoring_deadline(0.01):  # signals reach the main thread only: it runs without one
                threading.Event().wait(0.05)
            outcome.append("done")
        except (ScoringTimeout, ValueError) as e:
            outcome.append(repr(e))

    worker = threading.Thread(target=off_the_main_thread)
    worker.start()
    worker.join()
    assert outcome == ["done"]


def test_the_deadline_is_never_raised_inside_a_garbage_collection():
    """A signal's handler runs wherever the main thread is, a garbage collection's callbacks included (hypothesis
    installs one), where an exception is lost to ``sys.unraisablehook``: the deadline waits for the collection to end
    (its timer fires again every 50 ms) and interrupts the scorer's own code."""
    lost = []

    def busy(seconds: float) -> None:
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            pass

    def slow_callback(phase, info):  # half the loop's time is spent in collections
        busy(0.005)

    gc.callbacks.append(slow_callback)
    previous_hook, sys.unraisablehook = sys.unraisablehook, lambda unraisable: lost.append(unraisable.exc_value)
    try:
        with pytest.raises(ScoringTimeout), scoring_deadline(0.1):
            while True:
                busy(0.01)
                gc.collect(0)
    finally:
        gc.callbacks.remove(slow_callback)
        sys.unraisablehook = previous_hook
    assert lost == []


def test_a_sender_configs_scorer_that_takes_memory_is_used_and_not_kept():
    """The scorer of a received group is built from its sender's config: 256 of them were kept, each of a config of
    the sender's choice (`count_primes` up to five million builds a sieve of 40 MB), so that a peer naming a new one
    in every group made the training process hold gigabytes. One whose dataset holds more than
    `SCORER_KEPT_MAX_BYTES` is used, not kept: five such groups leave none kept, and the process's memory where a
    transient build leaves it (the allocator may keep one build's pages). A small config's scorer is kept and
    reused."""
    small = {"min_n": 1, "max_n": 1000}
    assert functions.get_reasoning_gym_scorer("count_primes", small) is functions.get_reasoning_gym_scorer(
        "count_primes", small
    )
    gc.collect()
    before = _resident_bytes()
    configs = [{"min_n": 1, "max_n": 5_000_000 + n} for n in range(5)]  # a new config in every group
    for config in configs:
        entry = reasoning_gym_entry(reasoning_gym.create_dataset("count_primes", seed=1, size=1, **config)[0])
        provenance = json.dumps({"source": "reasoning_gym", "task": "count_primes", "config": config})
        rewards = reasoning_gym_reward(
            [None] * 2, ["<answer>7</answer>"] * 2, entry=[json.dumps(entry)] * 2, provenance=[provenance] * 2
        )
        assert rewards == [0.0, 0.0]
    gc.collect()
    kept = {key for key in functions._kept_scorers if key[0] == "count_primes"}
    assert kept == {("count_primes", functions._config_key(small))}
    grown = _resident_bytes() - before
    assert grown < 3 * functions.SCORER_KEPT_MAX_BYTES, f"{grown / 1e6:.0f} MB more after five large scorers"


def _resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_a_scorer_whose_dataset_builds_past_the_deadline_is_ended_by_it():
    """The scorer's dataset is built from the sender's config before its answer is scored; the build ran before the
    deadline started, however long it took. `count_primes` up to a hundred million would build a sieve of 800 MB for
    seconds: the deadline ends it, and the answer is scored as past the deadline (the memory of one allocation is not
    bounded by it: see docs/trust.md)."""
    entry = reasoning_gym_entry(reasoning_gym.create_dataset("count_primes", seed=1, size=1, min_n=1, max_n=1000)[0])
    config = {"min_n": 1, "max_n": 100_000_000}
    assert functions._score_in_time("7", entry, config, functions.SCORER_SECONDS) is None
    assert not any(key[1] == functions._config_key(config) for key in functions._kept_scorers)
