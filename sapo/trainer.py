"""SAPOTrainer: TRL's GRPOTrainer, training each round on its own groups plus groups taken from the swarm.

A round (one generation batch of TRL) holds `num_local + num_external` groups of `num_generations` rows each.
The SAPO round, read top to bottom in `_generate_and_score_completions`:

1. take up to J external groups (`sapo.intake`): fetched, their truth re-derived, checked, scored once with this
   peer's reward functions, sampled and checked for plausibility;
2. put them into the last J group slots of the batch; slots left empty keep their local question (fill-in);
3. hand the batch to TRL: its generation hook (`_generate`, a thin adapter here) generates only the local slots and
   re-tokenizes the external completions with this peer's tokenizer; its reward hook (`_calculate_rewards`) scores
   only the local rows and takes the intake's rewards for the external ones; TRL normalizes advantages per group
   and later computes the loss exactly as GRPOTrainer does (the loss pass also feeds the intake's plausibility
   reference with the typicality of this node's own completions);
4. publish the groups generated here, as text.

Everything else is TRL's: with no swarm (or J = 0) the trainer does what GRPOTrainer does.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import os
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from accelerate.utils import broadcast_object_list, gather_object
from datasets import Dataset
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl import GRPOTrainer
from trl.data_utils import is_conversational

from rewards import completion_text
from sapo.checkpoints import mark_complete
from sapo.config import SAPOConfig
from sapo.evaluation import HeldOutResult, evaluate_policy, held_out_questions, is_question_set
from sapo.group_log import GroupLog
from sapo.hygiene import CompletionFilter
from sapo.intake import Intake, Taken, weighted_rewards
from sapo.plausibility import CompletionStatistics, floor_mask, token_typicality
from sapo.sampling import Candidate, ExternalSampler
from sapo.speed import SpeedUps
from sapo.tasks import TaskSpec, reasoning_gym_tasks_of
from sapo.verification import QuestionVerifier, published_prompt
from swarm.records import Group, Provenance, RecordRejected, provenance_from_wire
from swarm.transport import SwarmTransport

logger = logging.getLogger(__name__)

SENDERS_FILE = "senders.json"
"""Written in `output_dir` at every checkpoint and at the end of training: per sending peer, its groups trained on
(`taken`) and dropped by this node (`dropped/<reason>`), for audits of who sent what."""

FAULT_PAUSE_BEFORE_MARKER = "SAPO_FAULT_PAUSE_BEFORE_MARKER"
"""Environment variable (seconds, for fault-injection tests): pause after a checkpoint's files are written and
before its completion marker, so that a kill in that window surely leaves a half-written checkpoint."""


@dataclass
class _Round:
    """What SAPO adds to one TRL generation batch: which rows are external, and what they contain."""

    rows: list[dict[str, Any]]
    taken: Taken  # the intake's outcome: every process's external groups, this process's share
    first_slot: int  # the group slot the external groups start at (the same on every process)
    external_text: dict[int, str] = field(default_factory=dict)  # row index -> completion text from the swarm
    senders: dict[int, str] = field(default_factory=dict)  # row index -> sending peer
    completion_keys: dict[int, tuple[str, str, int]] = field(default_factory=dict)  # row -> its _completion_key
    local_completions: dict[int, Any] = field(default_factory=dict)  # row index -> completion generated here
    rewards: torch.Tensor | None = None  # weighted reward per row, set when TRL scores the batch


class SAPOTrainer(GRPOTrainer):
    """GRPO on a mix of locally generated groups and groups sampled from a swarm of peers (SAPO).

    Everything `trl.GRPOTrainer` accepts is accepted here, plus:

    Args:
        swarm (`swarm.SwarmTransport` or `None`):
            Where groups are published and taken from (`swarm.dht.DHTTransport` for a real swarm,
            `swarm.MemorySwarm(...).join(...)` for tests and simulation). `None` trains alone: every slot is
            filled in locally and nothing is published.
        sampler (`sapo.sampling.ExternalSampler` or `None`):
            Chooses external groups among candidates; default built from `args.sampling_strategy`.
        verifier (`sapo.verification.QuestionVerifier` or `None`):
            Re-derives the ground truth of external groups; default built from `args.external_source_policy`
            and `args.regeneration_timeout`.
        completion_filter (`Callable[[str], str | None]` or `None`):
            A check of each received completion after `args`' completion hygiene: None lets it pass, a string
            says why not and drops its group (counted as `hygiene`).
        held_out_tasks (`list[sapo.tasks.TaskSpec]` or `None`):
            The reasoning-gym tasks of the held-out set derived when no `eval_dataset` is given; default: those
            `train_dataset` draws from. A task specialist evaluated on a whole mix passes the mix.

    Without a swarm (or with `num_external=0`) it trains as GRPOTrainer does, on the same batches, with TRL's
    evaluation (held-out pass@1 added on reasoning-gym eval rows, see `evaluate`), and says so in one log line.

    With several processes (`accelerate launch --num_processes N`), the node is one swarm peer: pass the swarm on
    the main process and `None` on the others. The main process fetches candidates for every process (each verifies
    and scores them identically, then takes an equal share of one common selection) and publishes the groups of
    every process. With a swarm, `num_local` and `num_external` must then be multiples of N.

    Attributes:
        swarm_totals (`collections.Counter`): cumulative counts (external groups, fill-ins, drops by reason, ...),
            logged as `sapo/total/<name>`.
        taken_from (`collections.Counter`): external groups trained on, by verified sender.
        last_external (`list[sapo.sampling.Candidate]`): the external groups of the latest round, with the
            rewards this peer gave them.
    """

    def __init__(
        self,
        model: Any,
        reward_funcs: Any = None,
        args: SAPOConfig | None = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        *,
        swarm: SwarmTransport | None = None,
        sampler: ExternalSampler | None = None,
        verifier: QuestionVerifier | None = None,
        completion_filter: CompletionFilter | None = None,
        held_out_tasks: Sequence[TaskSpec] | None = None,
        **kwargs: Any,
    ):
        if args is None:  # as GRPOTrainer names its default output directory
            name = model if isinstance(model, str) else str(getattr(model.config, "_name_or_path", "") or "model")
            args = SAPOConfig(f"{name.rstrip('/').split('/')[-1]}-SAPO")
        if not isinstance(args, SAPOConfig):
            raise TypeError(f"SAPOTrainer needs args=SAPOConfig(...), got {type(args).__name__}.")
        derived_held_out = eval_dataset is None and args.eval_strategy != "no"
        if derived_held_out:
            eval_dataset = held_out_questions(train_dataset, args.eval_questions, tasks=held_out_tasks)
        super().__init__(
            model=model,
            reward_funcs=reward_funcs,
            args=args,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            **kwargs,
        )
        # Measured by greedy pass@1 only: GRPOTrainer has no eval set here (see evaluate).
        self._derived_held_out = self.eval_dataset if derived_held_out else None
        self._eval_questions: Any = None  # reasoning-gym rows of the eval set TRL's evaluation loop is running on
        self.swarm = swarm
        # Every process must agree on whether there is a swarm and on its peer id: they take part in the
        # main process's fetches and publications together, and make the same selection.
        self._uses_swarm, peer_id = self._main_process_swarm(swarm)
        if self._uses_swarm and args.num_external > 0:
            self._check_external_support(train_dataset)
        if not self._uses_swarm and args.num_external > 0:
            logger.warning(
                "no swarm given: SAPOTrainer trains as a local GRPO learner; the %d external groups of each round are "
                "generated here (pass swarm=... to take them from peers)", args.num_external,
            )  # fmt: skip
        elif not self._uses_swarm:
            logger.info("no swarm given: SAPOTrainer trains as a local GRPO learner (pass swarm=... to join peers)")
        group_log = None
        if args.groups_log is not None and self.accelerator.is_main_process:
            group_log = GroupLog(os.path.join(args.output_dir, args.groups_log), max_bytes=args.groups_log_max_bytes)
        self.intake = Intake(
            args, swarm, self._uses_swarm, peer_id, self.accelerator, self.reward_weights,
            system_messages=_system_messages(train_dataset),  # this node's own, around every external question
            sampler=sampler, verifier=verifier, completion_filter=completion_filter, group_log=group_log,
        )  # fmt: skip
        # The intake's parts, under the names this trainer has always had them.
        self.verifier, self.sampler, self.standing = self.intake.verifier, self.intake.sampler, self.intake.standing
        self.plausibility, self.taken_from = self.intake.plausibility, self.intake.taken_from
        self.sender_outcomes, self.swarm_totals = self.intake.sender_outcomes, self.intake.totals
        self._register_local_copy(train_dataset)
        self.swarm_model_name = args.swarm_model_name or str(getattr(self.model.config, "_name_or_path", "") or "")
        self._round: _Round | None = None
        self._phase_seconds: Counter[str] = Counter()
        self._token_typicality: dict[tuple[str, str, int], list[float]] = {}  # per external completion: per token
        self.last_external: list[Candidate] = []  # the external groups of the latest round, as scored here
        self.last_evaluation: HeldOutResult | None = None  # the latest held-out evaluation, question by question

    def _main_process_swarm(self, swarm: SwarmTransport | None) -> tuple[bool, str | None]:
        """(whether the node has a swarm, its peer id), as the main process sees it, on every process."""
        processes = self.accelerator.num_processes
        if processes == 1:
            return swarm is not None, swarm.peer_id if swarm is not None else None
        if swarm is not None and not self.accelerator.is_main_process:
            raise ValueError(
                "with several processes, pass the swarm on the main process only (swarm=None elsewhere): the node "
                "is one peer, and the main process fetches and publishes for all of them."
            )
        uses_swarm, peer_id = broadcast_object_list(
            [(swarm is not None, swarm.peer_id if swarm is not None else None)], from_process=0
        )[0]
        for name in ("num_local", "num_external"):
            if uses_swarm and getattr(self.args, name) % processes != 0:
                raise ValueError(
                    f"{name}={getattr(self.args, name)} must be divisible by the number of processes ({processes}), "
                    "so that every process holds whole groups to publish and to take."
                )
        return uses_swarm, peer_id

    def _check_external_support(self, train_dataset: Any) -> None:
        if self.tools or self.rollout_func is not None or self.environment_factories is not None:
            raise ValueError("num_external > 0 does not support tools, rollout_func or environment_factory yet.")
        if self.use_vllm and self.vllm_importance_sampling_correction:
            raise ValueError(
                "num_external > 0 with vLLM needs vllm_importance_sampling_correction=False: external completions "
                "have no sampling log-probabilities."
            )
        first = next(iter(train_dataset)) if train_dataset is not None else None
        if first is not None and not is_conversational(first):
            raise ValueError(
                "num_external > 0 with a swarm needs a conversational dataset (a 'prompt' column of chat messages), "
                "since swarm groups carry their question as chat messages; set num_external=0 to train on own groups."
            )

    def _register_local_copy(self, train_dataset: Any) -> None:
        """Tell the verifier what this peer's own questions are: a non-procedural dataset to check received
        questions against, or the reasoning-gym configs it may regenerate in this process (cheap, our own)."""
        if not isinstance(train_dataset, Dataset) or len(train_dataset) == 0:
            return
        provenance = _row_provenance(train_dataset[0])
        if provenance.source == "dataset":
            self.verifier.register(provenance.task, train_dataset)
        elif provenance.source == "reasoning_gym":
            self.verifier.register_tasks(reasoning_gym_tasks_of(train_dataset))

    # ------------------------------------------------------------------------------------------------
    # the SAPO round

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        if not self.model.training:
            return super()._generate_and_score_completions(inputs)  # TRL's evaluation

        num_groups = len(inputs) // self.num_generations
        num_slots = min(self.args.num_external // self.accelerator.num_processes, num_groups)
        self._phase_seconds.clear()
        # 1. external groups: fetched, verified, checked, scored once, sampled, checked for plausibility
        score = functools.partial(self._score_completions, list(inputs[0]))
        self._token_typicality.clear()
        taken = self.intake.take(num_slots, score, self._typicality_of, self._timed, step=self.state.global_step)
        self._share_token_typicality()
        # 2. into the last slots of this process's share of the batch; the slots left keep their local question
        self._round = self._place_external_groups(inputs, taken, first_slot=num_groups - num_slots)
        try:
            # 3. TRL: generate the local rows (`_generate`), score them (`_calculate_rewards`), advantages per group
            output = super()._generate_and_score_completions(self._round.rows)
            # 4. publish the groups generated here
            self._publish_local_groups(self._round)
            self._log_completions("train", [(str(self._round.rows[i].get("task", "")), completion_text(c))
                                            for i, c in sorted(self._round.local_completions.items())])  # fmt: skip
            self._log_round(num_slots, taken)
        finally:
            self._round = None
        self._announce_phase("training")  # the rest of the step is TRL's loss, backward pass and optimizer step
        return output

    def _place_external_groups(self, inputs: list[dict[str, Any]], taken: Taken, first_slot: int) -> _Round:
        """Rows for TRL: this process's external groups replace the questions of the last slots, the rest stay."""
        rows = [dict(row) for row in inputs]
        round_ = _Round(rows=rows, taken=taken, first_slot=first_slot)
        keys = list(inputs[0].keys())
        for slot, candidate in enumerate(taken.share, start=first_slot):
            for k, text in enumerate(candidate.group.completions):
                i = slot * self.num_generations + k
                rows[i] = _external_row(keys, candidate.group.prompt, candidate.columns)
                round_.external_text[i] = text
                round_.senders[i] = candidate.sender
                round_.completion_keys[i] = _completion_key(candidate, k)
        self.last_external = taken.chosen
        return round_

    # ------------------------------------------------------------------------------------------------
    # TRL hooks

    def _generate(self, prompts: list):
        """TRL's generation hook: generate the local rows (kept for publishing); re-tokenize the external rows."""
        round_ = getattr(self, "_round", None)  # None also in a trainer built without its __init__ (TRL's tests)
        if round_ is None:  # TRL's own evaluation path
            return super()._generate(prompts)
        external = {i: self._tokenize_external_completion(text) for i, text in sorted(round_.external_text.items())}
        self.intake.note_external_tokens(list(external.values()))  # how the loss pass tells them from own rows
        local = [i for i in range(len(prompts)) if i not in external]
        if not external:
            with self._timed("generation"):
                result = super()._generate(prompts)
            round_.local_completions = dict(enumerate(result[3]))
            return result

        prompt_ids: list[list[int]] = [[] for _ in prompts]
        completion_ids: list[list[int]] = [[] for _ in prompts]
        completions: list[Any] = [None] * len(prompts)
        if local:
            with self._timed("generation"):
                l_prompt_ids, l_completion_ids, _, l_completions, *_ = super()._generate([prompts[i] for i in local])
            for j, i in enumerate(local):
                prompt_ids[i], completion_ids[i] = l_prompt_ids[j], l_completion_ids[j]
                completions[i] = round_.local_completions[i] = l_completions[j]

        e_prompt_ids, _, _ = self._tokenize_prompts([prompts[i] for i in external])
        for j, (i, ids) in enumerate(external.items()):
            prompt_ids[i], completion_ids[i] = list(e_prompt_ids[j]), ids
            completions[i] = [{"role": "assistant", "content": round_.external_text[i]}]
        token_mask = None  # TRL's per-token loss mask (its `tool_mask`): 0 for external tokens not trained on
        if self.args.external_token_floor is not None:
            token_mask = [
                self._external_token_mask(round_.completion_keys[i], ids) if i in external else [1] * len(ids)
                for i, ids in enumerate(completion_ids)
            ]
        return prompt_ids, completion_ids, token_mask, completions, None, {}, None, []

    def _external_token_mask(self, key: tuple[str, str, int], ids: list[int]) -> list[int]:
        """Per token of an external completion: 1 to train on it, 0 if its typicality under this policy (from the
        plausibility pass) lies below `external_token_floor` or within `external_token_floor_before` /
        `external_token_floor_after` tokens of one that does, so a payload that passed the check is not learned."""
        typicality = self._token_typicality.get(key)
        if typicality is None or len(typicality) != len(ids):  # not scored: nothing says it is foreign
            return [1] * len(ids)
        args = self.args
        mask = floor_mask(
            typicality, args.external_token_floor, args.external_token_floor_before, args.external_token_floor_after
        )
        self.swarm_totals["external_tokens"] += len(mask)
        self.swarm_totals["external_tokens_masked"] += len(mask) - sum(mask)
        return mask

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, *args, **kwargs):
        """TRL's generation of the local rows, inside the speed-ups that apply to it (`sapo.speed`)."""
        with SpeedUps.of(self).generation(self, images, multimodal_fields):
            return super()._generate_single_turn(prompt_ids, images, multimodal_fields, *args, **kwargs)

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        """TRL's reward hook: the rows generated here are scored now; external rows keep the rewards the intake gave
        them (an external group is scored once)."""
        round_ = getattr(self, "_round", None)
        with self._timed("scoring"):
            if round_ is None or not round_.taken.chosen:  # TRL's evaluation, or a round of own groups only
                rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
            else:
                own = [i for i in range(len(prompts)) if i not in round_.external_text]
                scored = torch.empty(0, len(self.reward_funcs), device=self.accelerator.device)
                if own:  # the same number of own rows on every process (each takes an equal share of the groups)
                    ids = None if completion_ids_list is None else [completion_ids_list[i] for i in own]
                    pick = [inputs[i] for i in own], [prompts[i] for i in own], [completions[i] for i in own]
                    scored = super()._calculate_rewards(*pick, ids)
                rewards_per_func = self._with_external_rewards(round_, own, scored, len(prompts))
        if round_ is not None:
            start = self.accelerator.process_index * len(prompts)
            round_.rewards = weighted_rewards(rewards_per_func[start : start + len(prompts)], self.reward_weights)
        return rewards_per_func

    def _with_external_rewards(self, round_: _Round, own: list[int], scored: torch.Tensor, rows: int) -> torch.Tensor:
        """The rewards of every row of every process, as TRL's reward step gathers them: own rows from ``scored``
        (gathered, process by process), external rows as the intake scored them. Every process places its share of
        the common selection from the same slot on, so each knows where every process's external rows are."""
        processes, size = self.accelerator.num_processes, self.num_generations
        share = len(round_.taken.chosen) // processes
        rewards = torch.empty(processes * rows, len(self.reward_funcs), device=scored.device)
        for p in range(processes):
            if own:
                rewards[[p * rows + i for i in own]] = scored[p * len(own) : (p + 1) * len(own)]
            for slot, candidate in enumerate(round_.taken.chosen[p * share : (p + 1) * share], start=round_.first_slot):
                first = p * rows + slot * size
                rewards[first : first + size] = torch.tensor(candidate.rewards_per_func, device=rewards.device)
        return rewards

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        loss_pass = torch.is_grad_enabled() and self.model.training
        speed = SpeedUps.of(self)
        with speed.loss_pass(self, model, training=loss_pass):
            result = speed.shared_prompt_scores(self, model, input_ids, attention_mask, logits_to_keep, args, kwargs)
            if result is None:
                result = super()._get_per_token_logps_and_entropies(
                    model, input_ids, attention_mask, logits_to_keep, *args, **kwargs
                )
        intake = getattr(self, "intake", None)  # None: a trainer built without its __init__ (TRL's own tests do)
        if loss_pass and result[1] is not None and intake is not None:
            completion = slice(input_ids.shape[1] - logits_to_keep, None)
            intake.observe_loss_pass(input_ids[:, completion], result[0], result[1], attention_mask[:, completion])
        return result

    def train(self, *args: Any, **kwargs: Any) -> Any:
        """TRL's training loop; at its end, the per-sender outcomes are written to `output_dir`/senders.json."""
        result = super().train(*args, **kwargs)
        self._write_sender_outcomes()
        return result

    def _write_sender_outcomes(self) -> None:
        if not self.accelerator.is_main_process or not self._uses_swarm:
            return
        os.makedirs(self.args.output_dir, exist_ok=True)
        path = os.path.join(self.args.output_dir, SENDERS_FILE)
        with open(path + ".tmp", "w") as f:
            json.dump({sender: dict(counts) for sender, counts in sorted(self.sender_outcomes.items())}, f, indent=1)
        os.replace(path + ".tmp", path)  # never a torn file, whenever the node is killed

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        super()._save_checkpoint(model, trial)
        self._write_sender_outcomes()
        pause = float(os.environ.get(FAULT_PAUSE_BEFORE_MARKER) or 0)
        if pause > 0:  # fault injection (tests): a kill in this window always leaves a half-written checkpoint
            time.sleep(pause)
        if self.args.should_save:  # the marker comes last: a checkpoint without it is incomplete
            folder = os.path.join(
                self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            )
            mark_complete(folder, self.state.global_step)

    # ------------------------------------------------------------------------------------------------
    # held-out evaluation

    def evaluate(
        self, eval_dataset: Any = None, ignore_keys: list[str] | None = None, metric_key_prefix: str = "eval"
    ) -> dict[str, float]:
        """TRL's evaluation of every eval set it accepts (`eval_loss`, rewards, ...), plus greedy pass@1 on the
        held-out questions where the eval rows are reasoning-gym questions (`sapo.evaluation.is_question_set`),
        logged as `eval/pass@1`, `eval/pass@1_se`, `eval/pass@1/<task>`, ... in the same line.

        The held-out set this trainer derives itself (evaluation on and no `eval_dataset`, where GRPOTrainer would
        have nothing to evaluate) is measured by greedy pass@1 alone, the node's measurement. The Trainer's schedule
        drives both (`eval_strategy`, `eval_steps`, `eval_on_start`); evaluation never fetches or publishes groups.
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
        if dataset is self._derived_held_out:
            return self._evaluate_held_out_only(dataset, metric_key_prefix)
        self._eval_questions = dataset if is_question_set(dataset) else None
        try:
            return super().evaluate(eval_dataset, ignore_keys, metric_key_prefix)
        finally:
            self._eval_questions = None

    def evaluation_loop(self, dataloader: Any, description: str, prediction_loss_only: bool | None = None,
                        ignore_keys: list[str] | None = None, metric_key_prefix: str = "eval") -> Any:  # fmt: skip
        """TRL's evaluation loop; on reasoning-gym questions, the held-out pass@1 figures join its metrics."""
        output = super().evaluation_loop(dataloader, description, prediction_loss_only, ignore_keys, metric_key_prefix)
        if self._eval_questions is not None:
            output.metrics.update(self._held_out_metrics(self._eval_questions, metric_key_prefix))
        return output

    def _evaluate_held_out_only(self, dataset: Any, metric_key_prefix: str) -> dict[str, float]:
        """Greedy pass@1 on ``dataset``, logged and handed to the callbacks as an evaluation."""
        metrics = self._held_out_metrics(dataset, metric_key_prefix)
        was_training = self.model.training
        self.model.eval()  # so that TRL's log() adds no training figures to this line
        try:
            self.log(metrics)
        finally:
            self.model.train(was_training)
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
        the whole result)."""
        if self.args.held_out_log is None or not self.accelerator.is_main_process:
            return
        path = os.path.join(self.args.output_dir, self.args.held_out_log)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        outcomes = [{"task": q.task, "index": q.index, "correct": bool(q.correct), "score": q.score}
                    for q in result.questions]  # fmt: skip
        with open(path, "a") as f:
            f.write(json.dumps({"step": self.state.global_step, "eval": name, "questions": outcomes}) + "\n")

    def _evaluate_held_out(self, dataset: Any) -> HeldOutResult:
        """Each process evaluates a contiguous share of the questions; every process gets the whole result."""
        processes, rank = self.accelerator.num_processes, self.accelerator.process_index
        share = math.ceil(len(dataset) / processes)
        first = min(rank * share, len(dataset))
        result = evaluate_policy(
            self.accelerator.unwrap_model(self.model),
            self._tokenizer,
            dataset.select(range(first, min(first + share, len(dataset)))),
            max_new_tokens=self.max_completion_length,
            batch_size=self.args.per_device_eval_batch_size,
            eos_token_ids=self.eos_token_ids,
            first_index=first,
            **SpeedUps.of(self).evaluation_options(),
        )
        if processes > 1:
            result = HeldOutResult(gather_object(result.questions))
        return result

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if self.model.training:
            for name, value in sorted(self.swarm_totals.items()):
                logs[f"sapo/total/{name}"] = float(value)
            if self.swarm is not None:
                logs["sapo/peers"] = float(len(self.swarm.peers()))
                readout = self.swarm.readout()
                for name, value in sorted(readout.counters.items()):
                    logs[f"swarm/{name}"] = float(value)
                for name, value in sorted(readout.gauges.items()):
                    logs[f"swarm/gauge/{name}"] = float(value)
        super().log(logs, start_time)

    # ------------------------------------------------------------------------------------------------
    # helpers

    def _score_completions(self, keys: list[str], prompt: list[dict[str, str]], texts: list[str],
                           columns: dict[str, Any]) -> torch.Tensor:  # fmt: skip
        """This peer's rewards (completions x reward functions) of completion texts, as the rows a round trains on
        (``keys``: its columns), by TRL's own reward path (reward models, async rewards behave as for local rows).
        A text longer than `max_completion_length` tokens is scored as it is trained on: cut to that length."""
        row = _external_row(keys, prompt, columns)
        trained = [self._completion_ids(t) for t in texts]
        # Score the text trained on: past `max_completion_length` tokens a completion loses its tail in the batch, so
        # an answer there (a longer-limit sender's, or an attacker's behind a payload) must not earn its reward.
        scored = [self._tokenizer.decode(ids) if cut else t for t, (ids, cut) in zip(texts, trained, strict=True)]
        completions = [[{"role": "assistant", "content": t}] for t in scored]
        ids = [ids for ids, _ in trained]
        # Every process scores the same candidates: TRL's gather returns one copy per process, take the first.
        return super()._calculate_rewards([row] * len(texts), [prompt] * len(texts), completions, ids)[: len(texts)]

    def _typicality_of(self, candidates: list[Candidate]) -> list[CompletionStatistics]:
        """Typicality scores (`sapo.plausibility`) of every completion of ``candidates`` under the current policy:
        one forward pass without gradients, prompts padded on the left, completions on the right."""
        prompt_ids, _, _ = self._tokenize_prompts([c.group.prompt for c in candidates])
        rows = [(list(p), self._completion_ids(text)[0]) for c, p in zip(candidates, prompt_ids, strict=True)
                for text in c.group.completions]  # fmt: skip
        prompt_len, completion_len = max(len(p) for p, _ in rows), max(max(len(c) for _, c in rows), 1)
        input_ids = torch.full((len(rows), prompt_len + completion_len), self._tokenizer.pad_token_id)
        attention_mask = torch.zeros_like(input_ids)
        for i, (prompt, completion) in enumerate(rows):
            input_ids[i, prompt_len - len(prompt) : prompt_len] = torch.tensor(prompt, dtype=torch.long)
            input_ids[i, prompt_len : prompt_len + len(completion)] = torch.tensor(completion, dtype=torch.long)
            attention_mask[i, prompt_len - len(prompt) : prompt_len + len(completion)] = 1
        device, model = self.accelerator.device, self.accelerator.unwrap_model(self.model)
        # one forward pass: its weights are not worth packing
        with torch.no_grad(), SpeedUps.of(self).inference(model, pack_weights=False):
            logps, entropies, _ = self._get_per_token_logps_and_entropies(
                model, input_ids.to(device), attention_mask.to(device),
                completion_len, batch_size=self.args.per_device_train_batch_size, compute_entropy=True,
            )  # fmt: skip
        if self.args.external_token_floor is not None:  # kept for the loss mask of the groups that pass
            typicality = token_typicality(logps, entropies).cpu()
            keys = [_completion_key(c, k) for c in candidates for k in range(len(c.group.completions))]
            for key, row, (_, completion) in zip(keys, typicality, rows, strict=True):
                self._token_typicality[key] = row[: len(completion)].tolist()
        return self.plausibility.statistics(logps, entropies, attention_mask[:, prompt_len:].to(device))

    def _share_token_typicality(self) -> None:
        """Give every process the token typicalities the main process scored (it alone runs the plausibility pass),
        so that each can mask the tokens of its share of the external groups."""
        if self.args.external_token_floor is not None and self.accelerator.num_processes > 1:
            self._token_typicality = broadcast_object_list([self._token_typicality], from_process=0)[0]

    def _tokenize_external_completion(self, text: str) -> list[int]:
        """Token ids of a foreign completion under this peer's tokenizer, ended with EOS when it fits (truncations
        counted)."""
        ids, truncated = self._completion_ids(text)
        if truncated:
            self.swarm_totals["external_truncated"] += 1
        return ids

    def _completion_ids(self, text: str) -> tuple[list[int], bool]:
        """Token ids of a foreign completion as it is trained on, and whether text was cut off to fit."""
        # split_special_tokens: a completion that spells out "<|im_end|>" must not become a control token.
        ids = self._tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        limit = self.args.max_completion_length
        if limit is not None and len(ids) >= limit:
            # At the limit exactly, the sender stopped there too (no EOS, like a local completion that ran out of
            # tokens); only a longer one loses text here.
            return list(ids[:limit]), len(ids) > limit
        return list(ids) + [self.eos_token_ids[0]], False

    def _log_completions(self, kind: str, completions: list[tuple[str, str]]) -> None:
        """Append ``(task, text)`` completions to `args.completions_log` (every process's, written by the main)."""
        if self.args.completions_log is None:
            return
        if self.accelerator.num_processes > 1 and kind == "train":  # evaluation results are gathered already
            completions = gather_object(completions)
        if not self.accelerator.is_main_process:
            return
        path = os.path.join(self.args.output_dir, self.args.completions_log)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        step = self.state.global_step
        with open(path, "a") as f:
            for task, text in completions:
                f.write(json.dumps({"step": step, "kind": kind, "task": task, "completion": text}) + "\n")

    def _publish_local_groups(self, round_: _Round) -> None:
        """Publish each group generated here this round as decoded text (every process calls it: it gathers)."""
        if not self._uses_swarm or not self.args.publish_groups:
            return
        local_rows = sorted(round_.local_completions)
        groups, now, step = [], time.time(), self.state.global_step
        for start in range(0, len(local_rows), self.num_generations):
            members = local_rows[start : start + self.num_generations]
            row = round_.rows[members[0]]
            texts = [completion_text(round_.local_completions[i]) for i in members]
            groups.append(
                Group(
                    group_id=f"{step}-{self.accelerator.process_index}-{start // self.num_generations}",
                    prompt=published_prompt(row["prompt"]),
                    completions=texts,
                    provenance=_row_provenance(row),
                    metadata={"answer": str(row["answer"])} if row.get("answer") is not None else {},
                    model=self.swarm_model_name,
                    step=step,
                    created_at=now,
                )
            )
        if self.accelerator.num_processes > 1:
            groups = gather_object(groups)  # the main process publishes the groups of all processes
        if self.swarm is None or not groups:
            return
        try:
            with self._timed("publish"):
                self.swarm.publish(groups)
            self.swarm_totals["published_groups"] += len(groups)
        except RecordRejected as e:
            # Our own groups broke our own limits (e.g. a huge completion): skip them, keep training.
            self.swarm_totals[f"publish_rejected/{e.reason}"] += len(groups)
            logger.warning("not publishing %d groups of step %d: %s", len(groups), step, e)

    @contextlib.contextmanager
    def _timed(self, phase: str):
        """Add the seconds spent in ``phase`` to this round's `sapo/time/<phase>` metric (for benchmarks)."""
        self._announce_phase(phase)
        start = time.perf_counter()
        try:
            yield
        finally:
            self._phase_seconds[phase] += time.perf_counter() - start

    def _announce_phase(self, phase: str) -> None:
        """Tell callbacks that have an `on_phase(phase, state)` method what the step is doing now (a node's status)."""
        for callback in self.callback_handler.callbacks:
            on_phase = getattr(callback, "on_phase", None)
            if on_phase is not None:
                on_phase(phase, self.state)

    def _log_round(self, num_slots: int, taken: Taken) -> None:
        """Per-round figures, averaged by TRL over each logging window."""
        metrics, external = self._metrics["train"], taken.share
        for phase, seconds in self._phase_seconds.items():
            metrics[f"sapo/time/{phase}"].append(seconds)
        metrics["sapo/external_groups"].append(float(len(external)))
        metrics["sapo/fill_ins"].append(float(num_slots - len(external)))
        metrics["sapo/distinct_senders"].append(float(len({c.sender for c in external})))
        if taken.scored:
            metrics["sapo/zero_advantage_fraction"].append(taken.zero_advantage / taken.scored)
        if external:  # staleness of what is trained on: seconds since the sender made it, and its policy's lag
            now, step = time.time(), self.state.global_step
            metrics["sapo/external_age_seconds"].append(sum(now - c.group.created_at for c in external) / len(external))
            metrics["sapo/external_step_lag"].append(sum(step - c.group.step for c in external) / len(external))
        rewards = self._round.rewards
        if rewards is None:
            return
        # The sampler learns which tasks this peer still fails on (weak_prompt_first); the others ignore it. The task
        # is the one its published groups name, which is what the sampler reads of a received group.
        size, step, rank = self.num_generations, self.state.global_step, self.accelerator.process_index
        own_starts = [s for s in range(0, len(rewards), size) if s not in self._round.external_text]
        self.intake.observe_own_groups(
            [(f"{step}-{rank}-{k}", _row_provenance(self._round.rows[s]).task, rewards[s : s + size].tolist())
             for k, s in enumerate(own_starts)],
            model=self.swarm_model_name,
        )  # fmt: skip
        is_external = torch.zeros(len(rewards), dtype=torch.bool)
        is_external[list(self._round.external_text)] = True
        # Local groups whose rewards differ: the ones the paper sampler would keep, to compare like with like
        # with the external groups (which it chose that way).
        groups = rewards.view(-1, self.num_generations)
        spread = (groups.nan_to_num(0.0).amax(dim=1) > groups.nan_to_num(0.0).amin(dim=1)).repeat_interleave(
            self.num_generations
        )
        for name, mask in (
            ("local_reward", ~is_external),
            ("external_reward", is_external),
            ("local_reward_with_spread", ~is_external & spread),
        ):
            values = rewards[mask]
            values = values[~torch.isnan(values)]
            if values.numel():
                metrics[f"sapo/{name}"].append(values.mean().item())


def _system_messages(train_dataset: Any) -> list[dict[str, str]]:
    """The system messages of this node's own prompts (its first row's), or none for a plain-text dataset."""
    if not isinstance(train_dataset, Dataset) or len(train_dataset) == 0:
        return []
    prompt = train_dataset[0].get("prompt")
    return [dict(m) for m in prompt if m.get("role") == "system"] if isinstance(prompt, list) else []


def _completion_key(candidate: Candidate, index: int) -> tuple[str, str, int]:
    """Which external completion this is (sender, group id, position): two groups may hold the same text."""
    return candidate.sender, candidate.group.group_id, index


def _external_row(keys: list[str], prompt: list[dict[str, str]], columns: dict[str, Any]) -> dict[str, Any]:
    """The batch row of an external completion: the columns of this node's rows (``keys``), from the reward columns
    this node re-derived, and the prompt it wrote."""
    return {**{key: columns.get(key) for key in keys}, "prompt": prompt}


def _row_provenance(row: dict[str, Any]) -> Provenance:
    """The provenance a dataset row carries in its 'provenance' column (JSON), or a 'custom' one."""
    raw = row.get("provenance")
    if raw:
        try:
            return provenance_from_wire(json.loads(raw) if isinstance(raw, str) else raw)
        except (ValueError, TypeError) as e:
            logger.warning("row has an unreadable provenance (%s); publishing it as a custom source", e)
    return Provenance(source="custom", task=str(row.get("task") or "unknown"))
