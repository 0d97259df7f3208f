"""Held-out evaluation: greedy pass@1 of a policy on questions training never draws, per task, with standard errors.

Why greedy: one deterministic completion per question is the cheapest measurement on a CPU, and it has no
sampling noise, so the only noise left is which questions were drawn; two evaluations of the same questions
(before and after training) are then compared question by question (:func:`paired_difference`), which is far
tighter than comparing two means. A question counts as solved when this project's correctness reward gives it
full marks: the reasoning-gym dataset's own ``score_answer`` (after :func:`rewards.extract.extract_answer`) for
reasoning-gym rows, :func:`rewards.math_reward` against the ``answer`` column for other rows; or, with a scorer of
the user's own rewards (:func:`reward_scorer`), when their weighted sum reaches a success threshold.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from rewards import math_reward, reasoning_gym_reward

__all__ = [
    "HeldOutResult",
    "QuestionResult",
    "evaluate_policy",
    "generate_greedy",
    "held_out_questions",
    "is_question_set",
    "item_key_of",
    "paired_difference",
    "reward_scorer",
]

_FULL_MARKS = 1.0 - 1e-9


@dataclass
class QuestionResult:
    """One held-out question's outcome.

    Parameters:
        task (`str`): the question's task (reasoning-gym dataset name, or the question file's name).
        index (`int`): position of the question in the held-out set (pairs evaluations of the same set).
        score (`float`): the correctness reward of the completion (0 to 1).
        completion (`str`): the greedy completion.
        completion_tokens (`int`): its length in tokens.
        passed (`bool` or `None`): whether a scorer of the user's rewards counted it a success; None: full marks
            from the correctness reward decide.
        key (`str` or `None`): the item's durable key (:func:`item_key_of`), the same on every peer holding the item
            whatever its row order: it pairs outcomes across peers and runs. None: the row had no provenance.
    """

    task: str
    index: int
    score: float
    completion: str
    completion_tokens: int
    passed: bool | None = None
    key: str | None = None

    @property
    def correct(self) -> bool:
        """Solved: the scorer's verdict, else full marks from the correctness reward."""
        return self.passed if self.passed is not None else self.score >= _FULL_MARKS


@dataclass
class HeldOutResult:
    """The outcome of one evaluation: every question's result, and the figures derived from them."""

    questions: list[QuestionResult]

    def tasks(self) -> list[str]:
        """Tasks in order of first appearance."""
        return list(dict.fromkeys(q.task for q in self.questions))

    def _correct(self, task: str | None) -> list[float]:
        return [float(q.correct) for q in self.questions if task is None or q.task == task]

    def pass_at_1(self, task: str | None = None) -> float:
        """Fraction of questions (of ``task``, or all) solved; NaN for none."""
        values = self._correct(task)
        return sum(values) / len(values) if values else math.nan

    def standard_error(self, task: str | None = None) -> float:
        """Standard error of :meth:`pass_at_1` over the questions (sample standard deviation / sqrt(n))."""
        return _standard_error(self._correct(task))

    def metrics(self, prefix: str = "eval/") -> dict[str, float]:
        """Flat figures for logs: ``pass@1``, its ``pass@1_se``, ``pass@1/<task>``, ``questions``, ``mean_tokens``."""
        out = {
            f"{prefix}pass@1": self.pass_at_1(),
            f"{prefix}pass@1_se": self.standard_error(),
            f"{prefix}questions": float(len(self.questions)),
            f"{prefix}mean_score": _mean([q.score for q in self.questions]),
            f"{prefix}mean_tokens": _mean([float(q.completion_tokens) for q in self.questions]),
        }
        for task in self.tasks():
            out[f"{prefix}pass@1/{task}"] = self.pass_at_1(task)
        return out

    def table(self) -> str:
        """A per-task text table: questions, solved, pass@1 and its standard error."""
        header = f"{'task':<28} {'questions':>9} {'solved':>7} {'pass@1':>7} {'± s.e.':>7}"
        lines = [header, "-" * len(header)]
        for task in [*self.tasks(), None]:
            values = self._correct(task)
            name = task if task is not None else "all"
            if task is None:
                lines.append("-" * len(header))
            lines.append(
                f"{name:<28} {len(values):>9} {int(sum(values)):>7} {self.pass_at_1(task):>7.3f} "
                f"{self.standard_error(task):>7.3f}"
            )
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready form (:meth:`from_json` reads it back)."""
        return {"questions": [asdict(q) for q in self.questions]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HeldOutResult:
        """The result :meth:`to_json` wrote."""
        return cls([QuestionResult(**q) for q in data["questions"]])


def paired_difference(before: HeldOutResult, after: HeldOutResult) -> tuple[float, float]:
    """Mean and standard error of the per-question difference in solved (after - before) on the same questions.

    Raises ``ValueError`` when the two results are not evaluations of the same question set.
    """
    if [(q.task, q.index) for q in before.questions] != [(q.task, q.index) for q in after.questions]:
        raise ValueError("paired_difference needs two evaluations of the same held-out questions, in the same order")
    differences = [float(a.correct) - float(b.correct) for b, a in zip(before.questions, after.questions, strict=True)]
    return _mean(differences), _standard_error(differences)


def item_key_of(row: dict[str, Any]) -> str | None:
    """The durable key of a question row's item, from its ``provenance`` column: the source's own key where it has
    one (a dataset item's content hash), else ``source/task/seed/index`` (a seeded generator's or reasoning-gym's
    item), with the configuration's hash where the item has one. None: the row has no readable provenance."""
    import hashlib
    import json

    from sapo.sources.base import row_provenances

    provenance = row_provenances([row])[0]
    if provenance is None:
        return None
    if provenance.key is not None:
        return provenance.key
    if provenance.seed is None or provenance.index is None:
        return None
    config = json.dumps(provenance.config, sort_keys=True)
    suffix = f"/{hashlib.sha256(config.encode()).hexdigest()[:8]}" if provenance.config else ""
    return f"{provenance.source}/{provenance.task}/{provenance.seed}/{provenance.index}{suffix}"


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def _standard_error(values: Sequence[float]) -> float:
    n = len(values)
    if n < 2:
        return math.nan
    mean = sum(values) / n
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)


def generate_greedy(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[list[dict[str, str]]],
    max_new_tokens: int,
    batch_size: int = 16,
    eos_token_ids: Sequence[int] | None = None,
    progress: bool = False,
    merge_adapters: bool | None = None,
    bf16: bool | None = None,
) -> list[tuple[str, int]]:
    """Greedy completions of chat ``prompts`` under ``tokenizer``'s chat template: (text, token count) each.

    Prompts are batched by length (less padding), left-padded, and returned in their original order. The model's
    training mode is restored afterwards. ``progress`` shows a progress bar over the questions. ``merge_adapters``
    (LoRA adapters merged while generating) and ``bf16`` (bf16 autocast) are the speed-ups of
    `sapo.speed.inference.inference_context`; `None` decides each as `SAPOConfig` does
    (`sapo.speed.devices.device_defaults`).
    """
    import torch
    from transformers import GenerationConfig

    from sapo.speed.devices import device_defaults
    from sapo.speed.inference import inference_context

    if merge_adapters is None or bf16 is None:
        defaults = device_defaults()
        merge_adapters = defaults["generation_merge_adapters"] if merge_adapters is None else merge_adapters
        bf16 = defaults["bf16"] if bf16 is None else bf16

    eos = list(eos_token_ids) if eos_token_ids else [tokenizer.eos_token_id]
    config = GenerationConfig(
        do_sample=False,
        max_new_tokens=max_new_tokens,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=eos,
        use_cache=True,
    )
    texts = [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in prompts]
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    out: list[tuple[str, int]] = [("", 0)] * len(texts)
    was_training, padding_side = model.training, tokenizer.padding_side
    model.eval()
    tokenizer.padding_side = "left"
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(texts), desc="held-out", unit="question", dynamic_ncols=True)
    try:
        device = next(model.parameters()).device
        for start in range(0, len(order), batch_size):
            batch = order[start : start + batch_size]
            encoded = tokenizer(
                [texts[i] for i in batch], return_tensors="pt", padding=True, add_special_tokens=False
            ).to(device)
            with torch.no_grad(), inference_context(model, merge_adapters=merge_adapters, bf16=bf16):
                generated = model.generate(**encoded, generation_config=config)
            new_tokens = generated[:, encoded["input_ids"].shape[1] :]
            for i, ids in zip(batch, new_tokens, strict=True):
                ids = ids.tolist()  # after the first EOS come only pad tokens
                length = next((k + 1 for k, t in enumerate(ids) if t in eos), len(ids))
                out[i] = (tokenizer.decode(ids[:length], skip_special_tokens=True), length)
            if bar is not None:
                bar.update(len(batch))
    finally:
        if bar is not None:
            bar.close()
        tokenizer.padding_side = padding_side
        model.train(was_training)
    return out


def correctness_scores(completions: Sequence[str], rows: Sequence[dict[str, Any]]) -> list[float]:
    """The correctness reward of each completion for its row (reasoning-gym scorer, else math match)."""
    scores = []
    for text, row in zip(completions, rows, strict=True):
        message = [{"role": "assistant", "content": text}]
        if row.get("entry"):
            value = reasoning_gym_reward(
                [row["prompt"]], [message], entry=[row["entry"]], provenance=[row.get("provenance")]
            )[0]
        else:
            value = math_reward([row["prompt"]], [message], answer=[row.get("answer")])[0]
        scores.append(float(value or 0.0))
    return scores


Scorer = Callable[[Sequence[str], Sequence[dict[str, Any]]], list[tuple[float, bool]]]
"""Scores greedy completions of held-out rows: ``(score, passed)`` for each (completion, row)."""


def reward_scorer(reward_funcs: Sequence[Callable[..., Any]], weights: Sequence[float], threshold: float) -> Scorer:
    """A scorer of the user's own reward functions (TRL's signature: prompts, completions, **columns): the weighted
    sum of their rewards (None terms left out) for each completion, passed when it reaches ``threshold``. Reasoning-gym
    rows (with an ``entry``) keep the correctness reward, as every node measures them."""

    def score(completions: Sequence[str], rows: Sequence[dict[str, Any]]) -> list[tuple[float, bool]]:
        out: list[tuple[float, bool] | None] = [None] * len(rows)
        own = [i for i, row in enumerate(rows) if not row.get("entry")]
        if own:
            prompts = [rows[i]["prompt"] for i in own]
            messages = [[{"role": "assistant", "content": completions[i]}] for i in own]
            columns = {k: [rows[i].get(k) for i in own] for k in rows[own[0]] if k not in ("prompt", "completion")}
            totals = [0.0] * len(own)
            for function, weight in zip(reward_funcs, weights, strict=True):
                values = function(prompts=prompts, completions=messages, **columns)
                totals = [t + weight * v if v is not None else t for t, v in zip(totals, values, strict=True)]
            for i, total in zip(own, totals, strict=True):
                out[i] = (total, total >= threshold)
        rest = [i for i in range(len(rows)) if out[i] is None]
        for i, value in zip(rest, correctness_scores([completions[i] for i in rest], [rows[i] for i in rest]),
                            strict=True):  # fmt: skip
            out[i] = (value, value >= _FULL_MARKS)
        return out  # type: ignore[return-value]

    return score


def evaluate_policy(
    model: Any,
    tokenizer: Any,
    questions: Any,
    max_new_tokens: int = 128,
    batch_size: int = 16,
    eos_token_ids: Sequence[int] | None = None,
    first_index: int = 0,
    progress: bool = False,
    merge_adapters: bool | None = None,
    bf16: bool | None = None,
    scorer: Scorer | None = None,
) -> HeldOutResult:
    """Greedy pass@1 of ``model`` on ``questions`` (rows with ``prompt``, ``task``, ``entry``/``answer`` columns, as
    made by :func:`sapo.tasks.build_held_out_dataset` or a source's ``held_out()``); ``first_index`` numbers the
    questions of a shard; ``merge_adapters`` and ``bf16`` as in :func:`generate_greedy`; ``scorer`` (default: the
    correctness reward) decides what counts as solved."""
    rows = [dict(row) for row in questions]
    generated = generate_greedy(
        model, tokenizer, [row["prompt"] for row in rows], max_new_tokens, batch_size, eos_token_ids, progress,
        merge_adapters=merge_adapters, bf16=bf16,
    )  # fmt: skip
    texts = [text for text, _ in generated]
    verdicts = scorer(texts, rows) if scorer is not None else [(s, None) for s in correctness_scores(texts, rows)]
    return HeldOutResult(
        [
            QuestionResult(task=str(row["task"]), index=first_index + k, score=score, completion=text,
                           completion_tokens=length, passed=passed, key=item_key_of(row))
            for k, (row, (text, length), (score, passed)) in enumerate(zip(rows, generated, verdicts, strict=True))
        ]
    )  # fmt: skip


def is_question_set(dataset: Any) -> bool:
    """Whether greedy pass@1 can measure ``dataset``: a sized ``datasets.Dataset`` of questions of a task source
    (chat ``prompt``, ``task``, ``entry`` and ``answer`` columns, as a source's ``held_out()`` makes them)."""
    from datasets import Dataset

    if not isinstance(dataset, Dataset) or len(dataset) == 0:
        return False
    if not {"prompt", "task", "entry", "answer"} <= set(dataset.column_names):
        return False
    return isinstance(dataset[0]["prompt"], list)


def held_out_questions(
    train_dataset: Any, size: int, tasks: Sequence[Any] | None = None, sources: Sequence[Any] = ()
) -> Any:
    """Held-out questions: those the given task ``sources`` hold out (a dataset's test split or held-out fraction, a
    generator's held-out seed), up to ``size`` shared among them; else of reasoning-gym ``tasks`` (`TaskSpec`s), by
    default those ``train_dataset`` draws from (see :func:`sapo.tasks.build_held_out_dataset`). Raises
    ``ValueError`` when there are none: pass ``eval_dataset`` then, or turn evaluation off."""
    from datasets import concatenate_datasets

    from sapo.sources import ReasoningGymSource, as_dataset
    from sapo.tasks import build_held_out_dataset, reasoning_gym_tasks_of

    if tasks is None:
        tasks = reasoning_gym_tasks_of(train_dataset) if train_dataset is not None else []
    holders = [source.held_out for source in sources if not isinstance(source, ReasoningGymSource)]
    if tasks:
        holders.append(lambda n: build_held_out_dataset(tasks, size=n))
    parts = []
    for k, held_out in enumerate(holders):
        share = size // len(holders) + (1 if k < size % len(holders) else 0)
        # A source may return a list of dicts (`TaskSource.held_out`): a Dataset from here on.
        rows = as_dataset(held_out(share), f"{getattr(held_out, '__qualname__', 'held_out')}()") if share else []
        if len(rows):
            parts.append(rows)
    if not parts:
        raise ValueError(
            "evaluation is on (eval_strategy != 'no') but there are no held-out questions: give a task source some "
            "(DatasetSource(eval_fraction=... or eval_data=...), a GeneratorSource), pass eval_dataset= with "
            "questions training never draws, or set eval_strategy='no'."
        )
    names = list(dict.fromkeys(c for part in parts for c in part.column_names))
    parts = [part.map(lambda r, n=names: {c: r.get(c) for c in n}) if part.column_names != names else part
             for part in parts]  # fmt: skip
    return concatenate_datasets(parts) if len(parts) > 1 else parts[0]
