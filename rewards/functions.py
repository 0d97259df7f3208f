"""Reward functions with TRL's signature: ``fn(prompts, completions, **columns) -> list[float | None]``.

Each function gets the batch's prompts and completions plus every dataset column except ``prompt`` as a
keyword argument holding one value per completion, and returns one reward per completion (``None``
where the function does not apply to a row; TRL then ignores it for that row). They run unchanged in a
plain ``trl.GRPOTrainer`` as ``reward_funcs=[reasoning_gym_reward, format_reward]``.

In a swarm, completions come from other peers, so everything here treats completion text as hostile:
reasoning-gym scorers that would ``eval`` it are neutralised (see :func:`harden_reasoning_gym`).
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import json
import logging
import re
import sys
import threading
import time
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rewards.extract import completion_text, extract_answer, final_answer
from rewards.scoring_bounds import SAFE_FUNCTIONS, ScoringTimeout, exact_arithmetic_bounded, scoring_deadline

__all__ = [
    "format_reward",
    "get_reasoning_gym_scorer",
    "harden_reasoning_gym",
    "math_answers_match",
    "math_reward",
    "reasoning_gym_reward",
    "score_reasoning_gym_answer",
]

# reasoning-gym scorers that call the builtin eval() on the answer text when it is not an exact match
# (to accept a Python list). Their module-level name ``eval`` is rebound to ast.literal_eval, which
# accepts the same lists and nothing executable. tests/test_rewards.py fails if a new version adds one.
_EVAL_SCORER_MODULES = {
    "binary_matrix": "reasoning_gym.algorithmic.binary_matrix",
    "spiral_matrix": "reasoning_gym.algorithmic.spiral_matrix",
    "string_insertion": "reasoning_gym.algorithmic.string_insertion",
    "n_queens": "reasoning_gym.games.n_queens",
    # evals the entry's answer (ours, regenerated), guarded as well so a stored entry cannot run code
    "number_sorting": "reasoning_gym.algorithmic.number_sorting",
}
# Scorers that pass the answer to sympy's parse_expr, which evaluates Python; their answers must be
# plain math: numbers, operators, brackets and a few function names, and numbers sympy computes in bounded time
# (rewards.scoring_bounds).
_SYMPY_SCORER_DATASETS = {
    "simple_integration",
    "intermediate_integration",
    "polynomial_multiplication",
    "puzzle24",
    "countdown",
}
_SHARED_KINDS = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType)
_SAFE_MATH_NAMES = SAFE_FUNCTIONS | {"pi", "E", "I", "C", "oo"}
_SAFE_MATH_CHARS = re.compile(r"^[0-9A-Za-z\s+\-*/^().,=]*$")
_MAX_SYMPY_ANSWER_CHARS = 500
SCORER_SECONDS = 1.0
"""Wall seconds the scoring of one question's answers may take in one call of :func:`reasoning_gym_reward` or
:func:`math_reward`, all of them together (on the main thread; :func:`rewards.scoring_bounds.scoring_deadline`): an
answer still being scored when they are spent scores 0.0, and so do that question's answers after it, unscored. A
received group is one question, so it costs at most this; honest answers score in milliseconds."""

_hardened = False
_harden_lock = threading.Lock()


def harden_reasoning_gym() -> None:
    """Stop reasoning-gym scorers from executing answer text (idempotent, process-wide).

    A few reasoning-gym 0.1.x scorers call ``eval(answer)``; in a swarm the answer is text another peer
    wrote, so that is remote code execution. Rebinding the name ``eval`` in those modules to
    ``ast.literal_eval`` keeps their scoring of Python-list answers and removes the hole.
    """
    global _hardened
    with _harden_lock:
        if _hardened:
            return
        for module_name in _EVAL_SCORER_MODULES.values():
            try:
                module = importlib.import_module(module_name)
            except ImportError:  # dataset absent from this reasoning-gym version
                continue
            module.eval = _literal_eval  # shadows the builtin for code in that module only
        _hardened = True


def _literal_eval(source: Any, *_: Any) -> Any:
    if not isinstance(source, str) or len(source) > 100_000:
        raise ValueError("refusing to evaluate")
    return ast.literal_eval(source)


def _is_plain_math(answer: str) -> bool:
    if len(answer) > _MAX_SYMPY_ANSWER_CHARS or "__" in answer or not _SAFE_MATH_CHARS.match(answer):
        return False
    names = re.findall(r"[A-Za-z_][A-Za-z0-9_]*", answer)
    return all(len(n) == 1 or n in _SAFE_MATH_NAMES for n in names)


def _config_key(config: Mapping[str, Any]) -> str:
    return json.dumps(config, sort_keys=True, default=list)


SCORERS_KEPT = 256
"""Scorers kept built (one per dataset and config): a group's answers, and the next groups of the config, reuse one."""
SCORER_KEPT_MAX_BYTES = 32_000_000
"""A scorer whose dataset holds more than this (:func:`_held_bytes`) is used and not kept: its config is a sender's
choice (a foreign config: `count_primes` up to ten million builds a sieve of 80 MB), and 256 of them kept held tens
of GB in the training process. The largest of reasoning-gym's own datasets at their defaults holds 16 MB
(`arc_agi`); counting one takes up to about 0.1 s, once."""
SCORERS_KEPT_BYTES = 256_000_000
"""What the kept scorers' datasets may hold together; past it the least recently used go."""

_Scorer = Callable[[str | None, dict[str, Any]], float]
_kept_scorers: dict[tuple[str, str], tuple[_Scorer, int]] = {}  # least recently used first
_kept_scorers_lock = threading.Lock()


def _held_bytes(root: object, limit: int, max_objects: int = 1_000_000) -> int:
    """What ``root`` holds in containers and instance attributes, by ``sys.getsizeof``, counted until past ``limit``
    (then a figure past it is returned at once) or ``max_objects`` objects (then ``limit + 1``: too many to count is
    as good as too large). Modules, classes and functions are shared, not held, and are not counted."""
    seen: set[int] = set()
    stack, total = [root], 0
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, _SHARED_KINDS):
            continue
        seen.add(id(obj))
        if len(seen) > max_objects:
            return limit + 1
        total += sys.getsizeof(obj, 0)
        if total > limit:
            return total
        if isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, list | tuple | set | frozenset):
            stack.extend(obj)
        elif hasattr(obj, "__dict__"):
            stack.append(vars(obj))
    return total


def _scorer(name: str, config_key: str) -> _Scorer:
    key = (name, config_key)
    with _kept_scorers_lock:
        kept = _kept_scorers.pop(key, None)
        if kept is not None:
            _kept_scorers[key] = kept  # now the most recently used
            return kept[0]
    import reasoning_gym

    harden_reasoning_gym()
    config = json.loads(config_key)
    config.pop("seed", None)
    config.pop("size", None)
    # Some scorers read their dataset's config (decimal_arithmetic's tolerance), so the scorer is built
    # from the same config as the entry; seed and size do not matter to scoring.
    dataset = reasoning_gym.create_dataset(name, seed=0, size=1, **config)
    scorer, held = dataset.score_answer, _held_bytes(dataset, SCORER_KEPT_MAX_BYTES)
    if held <= SCORER_KEPT_MAX_BYTES:
        with _kept_scorers_lock:
            _kept_scorers[key] = (scorer, held)
            while len(_kept_scorers) > SCORERS_KEPT or sum(b for _, b in _kept_scorers.values()) > SCORERS_KEPT_BYTES:
                del _kept_scorers[next(iter(_kept_scorers))]
    return scorer


def get_reasoning_gym_scorer(
    name: str, config: Mapping[str, Any] | None = None
) -> Callable[[str | None, dict[str, Any]], float]:
    """The ``score_answer`` of reasoning-gym dataset ``name`` built with ``config``: kept per pair unless its build took
    more than :data:`SCORER_KEPT_MAX_BYTES` of memory, at most :data:`SCORERS_KEPT` kept and :data:`SCORERS_KEPT_BYTES`
    together.

    Raises ``ValueError`` for an unknown dataset or a config reasoning-gym rejects.
    """
    try:
        return _scorer(name, _config_key(dict(config or {})))
    except (TypeError, AssertionError) as e:  # config dataclass rejects a key, or its validate() fails
        raise ValueError(f"reasoning-gym rejected dataset {name!r} with config {dict(config or {})}: {e}") from e


def score_reasoning_gym_answer(
    answer: str | None, entry: Mapping[str, Any], config: Mapping[str, Any] | None = None
) -> float:
    """Score an extracted answer against a reasoning-gym entry with the dataset's own scorer.

    Returns 0.0 for a missing answer, for an answer a guarded scorer must not see (for sympy's scorers, numbers
    too large to compute in bounded time, :func:`rewards.scoring_bounds.exact_arithmetic_bounded`), when the scorer
    itself raises (scorers are third-party code fed hostile text; a crash must not stop training), and when it runs
    past :data:`SCORER_SECONDS`.
    """
    score = _score_in_time(answer, entry, config, SCORER_SECONDS)
    return 0.0 if score is None else score


def _score_in_time(
    answer: str | None, entry: Mapping[str, Any], config: Mapping[str, Any] | None, seconds: float
) -> float | None:
    """:func:`score_reasoning_gym_answer`'s score, or None when the scorer ran past ``seconds``."""
    if answer is None:
        return 0.0
    entry = dict(entry)
    name = (entry.get("metadata") or {}).get("source_dataset")
    if not isinstance(name, str):
        raise ValueError("reasoning-gym entry has no metadata.source_dataset; cannot pick its scorer")
    if name in _SYMPY_SCORER_DATASETS and not (_is_plain_math(answer) and exact_arithmetic_bounded(answer)):
        return 0.0
    import reasoning_gym  # noqa: F401  (outside the deadline: a first import takes seconds)

    harden_reasoning_gym()
    try:
        with scoring_deadline(seconds):
            # The scorer's dataset is built within the deadline too: its config is the sender's, and one may build
            # for seconds (a sieve of millions), allocating all the while.
            scorer = get_reasoning_gym_scorer(name, config)  # ValueError: a config reasoning-gym rejects
            try:
                return float(scorer(answer, entry))
            except Exception:
                return 0.0
    except ScoringTimeout:
        return None


def _as_mapping(value: Any) -> dict[str, Any] | None:
    if value is None or value == "":
        return None
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, str):
        return json.loads(value)
    raise TypeError(f"expected a JSON string or a mapping, got {type(value).__name__}")


def _column(columns: Mapping[str, Any], name: str, n: int) -> Sequence[Any]:
    values = columns.get(name)
    if values is None:
        return [None] * n
    if len(values) != n:
        raise ValueError(f"column {name!r} has {len(values)} values for {n} completions")
    return values


class _SharedDeadline:
    """What is left of :data:`SCORER_SECONDS` for each question's answers in one reward call: a group whose every
    answer took just under a deadline of its own cost ``num_generations`` deadlines; sharing one, a received group
    (one question, one call) costs at most one."""

    def __init__(self) -> None:
        self._left: dict[str, float] = {}

    def score(self, question: str, score_within: Callable[[float], float | None]) -> float:
        """``score_within(seconds left)``, or 0.0 when the question's seconds are spent (before or during it: it
        returns None past them)."""
        left = self._left.get(question, SCORER_SECONDS)
        if left <= 0:
            return 0.0
        started = time.monotonic()
        score = score_within(left)
        self._left[question] = 0.0 if score is None else left - (time.monotonic() - started)
        return 0.0 if score is None else score


def reasoning_gym_reward(
    prompts: Sequence[Any], completions: Sequence[Any], entry: Sequence[Any] | None = None, **columns: Any
) -> list[float | None]:
    """Score each completion with its reasoning-gym dataset's own ``score_answer``.

    Columns: ``entry`` (required) is the reasoning-gym entry as a JSON string or dict (``question``,
    ``answer``, ``metadata`` with ``source_dataset``); ``provenance`` (optional, JSON) supplies the
    generator config, which some scorers depend on. A row whose ``entry`` is empty gets ``None`` (not a
    reasoning-gym row, e.g. in a mixed dataset). A completion with no extractable answer scores 0.0. The answers to
    one question in this call share :data:`SCORER_SECONDS` of scoring: one still being scored when it is spent scores
    0.0, and so do the question's answers after it, unscored (a received group is one question: it costs at most that,
    however many answers each take just under it).
    """
    if entry is None:
        raise ValueError("reasoning_gym_reward needs an 'entry' column (see sapo.tasks.build_reasoning_gym_dataset)")
    n = len(completions)
    entries = _column({"entry": entry}, "entry", n)
    provenances = _column(columns, "provenance", n)
    rewards: list[float | None] = []
    deadline = _SharedDeadline()
    for completion, raw_entry, raw_provenance in zip(completions, entries, provenances, strict=True):
        item = _as_mapping(raw_entry)
        if item is None:
            rewards.append(None)
            continue
        provenance = _as_mapping(raw_provenance) or {}
        config = provenance.get("config") if provenance.get("source") == "reasoning_gym" else None
        answer = extract_answer(completion_text(completion))
        score_within = functools.partial(_score_in_time, answer, item, config)
        rewards.append(deadline.score(str(item.get("question")), score_within))
    return rewards


def _normalize(text: str) -> str:
    text = text.strip().lower().replace(" ", "").replace(",", "")
    return text.rstrip(".")


MATH_VERIFY_SECONDS = 5
"""Seconds math-verify's own alarm gives each parse and comparison in :func:`math_answers_match` (main thread)."""


def _parse(text: str, timeout: int | None) -> list[Any]:
    from math_verify import parse

    parsed = parse(text, parsing_timeout=timeout)
    if not parsed and not text.startswith("$"):
        parsed = parse(f"${text}$", parsing_timeout=timeout)
    return parsed


def math_answers_match(predicted: str | None, gold: str) -> bool:
    """True when ``predicted`` equals ``gold`` mathematically (math-verify) or as normalized strings; math-verify's
    parses and comparison each bounded by :data:`MATH_VERIFY_SECONDS` on the main thread (its alarm needs it)."""
    timeout = MATH_VERIFY_SECONDS if threading.current_thread() is threading.main_thread() else None
    return _answers_match(predicted, gold, timeout)


def _answers_match(predicted: str | None, gold: str, timeout: int | None) -> bool:
    """:func:`math_answers_match` with math-verify's own alarm at ``timeout`` seconds (None: none, for a caller that
    bounds it with :func:`rewards.scoring_bounds.scoring_deadline`, which math-verify's alarm would cancel)."""
    if predicted is None:
        return False
    if _normalize(predicted) == _normalize(gold):
        return True
    try:
        from math_verify import verify

        gold_parsed, predicted_parsed = _parse(gold, timeout), _parse(predicted, timeout)
        if not gold_parsed or not predicted_parsed:
            return False
        return bool(verify(gold_parsed, predicted_parsed, timeout_seconds=timeout))
    except Exception:  # sympy can fail in many ways on odd text; that is a non-match, not a crash
        return False


def _quiet_math_verify_without_alarm(record: logging.LogRecord) -> bool:
    """math-verify warns once that its alarm is off and asks for a bound of one's own: :func:`_match_in_time` is one."""
    return not record.getMessage().startswith("Timeout is disabled")


@functools.cache
def _quiet_math_verify() -> None:
    """Filter that warning out of math-verify's loggers (once per process)."""
    for name in ("math_verify.parser", "math_verify.grader"):
        logging.getLogger(name).addFilter(_quiet_math_verify_without_alarm)


def _match_in_time(predicted: str | None, gold: str, seconds: float) -> float | None:
    """1.0 or 0.0 as :func:`math_answers_match` says, or None past ``seconds`` of wall time (on the main thread)."""
    import math_verify  # noqa: F401  (outside the deadline: a first import takes a fraction of a second)

    _quiet_math_verify()
    try:
        with scoring_deadline(seconds):
            return 1.0 if _answers_match(predicted, gold, timeout=None) else 0.0
    except ScoringTimeout:
        return None


def math_reward(
    prompts: Sequence[Any], completions: Sequence[Any], answer: Sequence[Any] | None = None, **columns: Any
) -> list[float | None]:
    """1.0 when the extracted answer equals the ``answer`` column mathematically, else 0.0.

    Equivalence is math-verify's ``parse`` + ``verify`` ("1/2" matches "0.5" and "\\frac{1}{2}"), with
    normalized string equality as the fallback for non-math answers. A row whose ``answer`` is None
    gets None. The answers to one question in this call share :data:`SCORER_SECONDS` on the main thread, as in
    :func:`reasoning_gym_reward` (answers such as ``9**9**9`` kept math-verify busy for its 5 s alarm each).
    """
    if answer is None:
        raise ValueError("math_reward needs an 'answer' column")
    n = len(completions)
    answers = _column({"answer": answer}, "answer", n)
    rewards: list[float | None] = []
    deadline = _SharedDeadline()
    for prompt, completion, gold in zip(_column({"prompts": prompts}, "prompts", n), completions, answers, strict=True):
        if gold is None:
            rewards.append(None)
            continue
        predicted, gold = extract_answer(completion_text(completion)), str(gold)
        if predicted is not None and _normalize(predicted) == _normalize(gold):  # no parse: no deadline spent
            rewards.append(1.0)
            continue
        question = json.dumps([prompt, gold], default=str)  # a question's answers share one deadline
        rewards.append(deadline.score(question, functools.partial(_match_in_time, predicted, gold)))
    return rewards


_FULL_FORMAT = re.compile(r"^\s*<think>.*?</think>\s*<answer>.*?</answer>\s*$", re.DOTALL | re.IGNORECASE)
FORMAT_REWARD_FULL = 0.2
"""Reward for the exact ``<think>...</think><answer>...</answer>`` layout."""
FORMAT_REWARD_ANSWER_TAG = 0.1
"""Reward for an ``<answer>...</answer>`` somewhere in the completion."""


def format_reward(prompts: Sequence[Any], completions: Sequence[Any], **columns: Any) -> list[float | None]:
    """A small shaping reward for the answer format: 0.2 for exactly
    ``<think>...</think><answer>...</answer>``, 0.1 for an ``<answer>...</answer>`` anywhere, else 0.0. The answer is
    the one :func:`rewards.extract.final_answer` finds, so text after it (a stray ``</answer>`` included) is not the
    exact layout.

    Small on purpose: it helps a small model find the format without ever outweighing a correct
    answer (1.0 from the correctness rewards).
    """
    rewards: list[float | None] = []
    for completion in completions:
        text = completion_text(completion)
        answer = final_answer(text)
        if answer is not None and not text[answer.end() :].strip() and _FULL_FORMAT.match(text):
            rewards.append(FORMAT_REWARD_FULL)
        elif answer is not None:
            rewards.append(FORMAT_REWARD_ANSWER_TAG)
        else:
            rewards.append(0.0)
    return rewards


def _scorer_source_calls(dataset_cls: type) -> set[str]:
    """Which code-evaluating calls (``eval``, ``exec``, ``parse_expr``, ``sympify``) a scorer's source has.

    Used by the tests to catch a reasoning-gym upgrade that adds an unguarded one.
    """
    try:
        source = inspect.getsource(dataset_cls.score_answer)
    except (OSError, TypeError):
        return set()
    return {
        call
        for call in ("eval", "exec", "parse_expr", "sympify")
        if re.search(rf"(?<![\w.]){call}\(|\.{call}\(", source)
    }
