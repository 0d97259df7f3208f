"""Held-out evaluation inside the trainer: greedy pass@1 on questions training never draws, beside TRL's evaluation.

:class:`HeldOutEvaluation` is a mixin of :class:`sapo.trainer.SAPOTrainer`: it keeps TRL's evaluation of every eval
set TRL accepts and adds the pass@1 figures where the eval rows are questions with a checkable answer
(:func:`sapo.evaluation.is_question_set`), logged in the same line. The held-out set the trainer derives itself (no
`eval_dataset`, evaluation on) is measured by pass@1 alone.
"""

from __future__ import annotations

import json
import logging
import math
import os
from typing import Any

import torch
from accelerate.utils import gather_object

from sapo.evaluation import HeldOutResult, evaluate_policy, is_question_set, reward_scorer
from sapo.jsonl_files import RotatingJsonl
from sapo.speed import SpeedUps

logger = logging.getLogger(__name__)

HELD_OUT_LOG_MAX_BYTES = 32_000_000
"""Size past which `held_out_log` is rotated (`.1` the newest older file): about 400 evaluations of 512 questions."""

HELD_OUT_LOG_BACKUPS = 2
"""Rotated `held_out_log` files kept (the oldest deleted): with the file itself at most about 96 MB."""

COMPLETIONS_LOG_MAX_BYTES = 32_000_000
"""Size past which `completions_log` is rotated, as `held_out_log` is (:data:`HELD_OUT_LOG_BACKUPS` older files kept):
about 70,000 completions of 64 tokens."""


class HeldOutEvaluation:
    """Greedy held-out pass@1 for a `sapo.trl_bridge.TRLBridge` subclass (see the module docstring).

    Attributes:
        last_evaluation (`sapo.evaluation.HeldOutResult` or `None`): the latest held-out evaluation, question by
            question.
    """

    derived_held_out: Any = None  # the eval set the trainer derived itself, measured by pass@1 alone
    last_evaluation: HeldOutResult | None = None

    def evaluate(
        self, eval_dataset: Any = None, ignore_keys: list[str] | None = None, metric_key_prefix: str = "eval"
    ) -> dict[str, float]:
        """TRL's evaluation of every eval set it accepts (`eval_loss`, rewards, ...), plus greedy pass@1 on the
        held-out questions where the eval rows are questions with a checkable answer, logged as `eval/pass@1`,
        `eval/pass@1_se`, `eval/pass@1/<task>`, ... in the same line.

        The held-out set the trainer derives itself (evaluation on and no `eval_dataset`, where GRPOTrainer would
        have nothing to evaluate) is measured by greedy pass@1 alone. The Trainer's schedule drives both
        (`eval_strategy`, `eval_steps`, `eval_on_start`); evaluation never fetches or publishes groups.
        """
        chosen = self.eval_dataset if eval_dataset is None else eval_dataset
        if isinstance(chosen, dict):  # a dict or DatasetDict of eval sets: each one's figures under its own prefix
            metrics: dict[str, float] = {}
            for name, part in chosen.items():
                given = part if eval_dataset is not None else name
                metrics.update(self.evaluate(given, ignore_keys, f"{metric_key_prefix}_{name}"))
            return metrics
        dataset = self.eval_dataset[chosen] if isinstance(chosen, str) else chosen
        if dataset is None:  # evaluation is off (eval_on_start still calls here)
            logger.info("no eval set (eval_strategy='no' and no eval_dataset): evaluation skipped")
            return {}
        self._announce_phase("evaluating")
        if dataset is self.derived_held_out:
            return self._evaluate_held_out_only(dataset, metric_key_prefix)
        return super().evaluate(eval_dataset, ignore_keys, metric_key_prefix)

    def evaluation_loop(self, dataloader: Any, description: str, prediction_loss_only: bool | None = None,
                        ignore_keys: list[str] | None = None, metric_key_prefix: str = "eval") -> Any:  # fmt: skip
        """TRL's evaluation loop; on an eval set of questions, the held-out pass@1 figures join its metrics."""
        output = super().evaluation_loop(dataloader, description, prediction_loss_only, ignore_keys, metric_key_prefix)
        dataset = getattr(dataloader, "dataset", None)
        if is_question_set(dataset):
            output.metrics.update(self._held_out_metrics(dataset, metric_key_prefix))
        return output

    def _evaluate_held_out_only(self, dataset: Any, metric_key_prefix: str) -> dict[str, float]:
        """Greedy pass@1 on ``dataset``, logged and handed to the callbacks as an evaluation."""
        metrics = self._held_out_metrics(dataset, metric_key_prefix)
        self.log_evaluation(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics

    def _held_out_metrics(self, dataset: Any, metric_key_prefix: str) -> dict[str, float]:
        """Greedy pass@1 figures of ``dataset`` (kept in `last_evaluation`; answers go to the completions log)."""
        self.last_evaluation = self._evaluate_held_out(dataset)
        self._log_completions("eval", [(q.task, q.completion) for q in self.last_evaluation.questions])
        self._log_held_out(self.last_evaluation, metric_key_prefix)
        return self.last_evaluation.metrics(prefix=f"{metric_key_prefix}/")

    def _log_held_out(self, result: HeldOutResult, name: str) -> None:
        """Append the evaluation's per-question outcomes to `args.held_out_log` (main process; every process holds
        the whole result): each question's task, position, item key (the same on every peer holding the item),
        verdict and score."""
        if self.args.held_out_log is None or not self.accelerator.is_main_process:
            return
        path = os.path.join(self.args.output_dir, self.args.held_out_log)
        outcomes = [{"task": q.task, "index": q.index, "key": q.key, "correct": bool(q.correct), "score": q.score}
                    for q in result.questions]  # fmt: skip
        line = json.dumps({"step": self.state.global_step, "eval": name, "questions": outcomes})
        RotatingJsonl(path, HELD_OUT_LOG_MAX_BYTES, HELD_OUT_LOG_BACKUPS).append([line])

    def _evaluate_held_out(self, dataset: Any) -> HeldOutResult:
        """Each process evaluates a contiguous share of the questions; every process gets the whole result."""
        processes, rank = self.accelerator.num_processes, self.accelerator.process_index
        share = math.ceil(len(dataset) / processes)
        first = min(rank * share, len(dataset))
        result = evaluate_policy(
            self.accelerator.unwrap_model(self.model),
            self.text_tokenizer,
            dataset.select(range(first, min(first + share, len(dataset)))),
            max_new_tokens=self.max_completion_length,
            batch_size=self.args.per_device_eval_batch_size,
            eos_token_ids=self.eos_token_ids,
            first_index=first,
            **SpeedUps.of(self).evaluation_options(),
            scorer=self._held_out_scorer(),
        )
        if processes > 1:
            result = HeldOutResult(gather_object(result.questions))
        return result

    def _held_out_scorer(self) -> Any:
        """The user's reward functions against `success_threshold` for questions of non-procedural sources (a
        reward model cannot score them here: the correctness reward does)."""
        if not all(callable(f) and not isinstance(f, torch.nn.Module) for f in self.reward_funcs):
            return None
        weights = [float(w) for w in self.reward_weights.tolist()]
        return reward_scorer(self.reward_funcs, weights, self.args.success_threshold)

    def _log_completions(self, kind: str, completions: list[tuple[str, str]]) -> None:
        """Append ``(task, text)`` completions to `args.completions_log` (every process's, written by the main)."""
        if self.args.completions_log is None:
            return
        if self.accelerator.num_processes > 1 and kind == "train":  # evaluation results are gathered already
            completions = gather_object(completions)
        if not self.accelerator.is_main_process:
            return
        path = os.path.join(self.args.output_dir, self.args.completions_log)
        step = self.state.global_step
        lines = [
            json.dumps({"step": step, "kind": kind, "task": task, "completion": text}) for task, text in completions
        ]
        RotatingJsonl(path, COMPLETIONS_LOG_MAX_BYTES, HELD_OUT_LOG_BACKUPS).append(lines)
