"""SAPOTrainer: TRL's GRPOTrainer, training each round on its own groups plus groups taken from the swarm.

A round (one generation batch of TRL) holds `num_local + num_external` groups of `num_generations` rows each. One
SAPO round, top to bottom (:meth:`SAPOTrainer.sapo_round`):

1. the intake takes up to J external groups (:mod:`sapo.intake`): fetched, their truth re-derived, checked,
   tokenized and scored once with this peer's rewards, sampled and checked for plausibility;
2. the round is built as a value (:mod:`sapo.round`): the external groups in the last J slots, every other slot
   keeping its own question (a fill-in where the swarm gave fewer);
3. TRL runs the round (:mod:`sapo.trl_bridge`, the one place that touches TRL's private methods): its generation
   hook generates the own rows and splices in the external ones, its reward hook scores the own rows and splices in
   the external rewards, it normalizes advantages per group, and later its loss reads which rows are external from
   the batch (the plausibility reference learns from the own ones);
4. the groups generated here are published (:mod:`sapo.publication`) and every group is logged.

Everything else is TRL's: with no swarm (or J = 0) the trainer does what GRPOTrainer does.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from accelerate.utils import broadcast_object_list, gather_object
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_callback import TrainerCallback, TrainerState
from transformers.trainer_utils import TrainOutput, get_last_checkpoint
from trl.data_utils import is_conversational

from rewards import completion_text
from sapo.checkpoints import mark_complete, read_totals, write_totals
from sapo.collector import long_lived_frozen
from sapo.config import SAPOConfig
from sapo.evaluation import held_out_questions
from sapo.held_out import HeldOutEvaluation
from sapo.hygiene import CompletionFilter
from sapo.intake import Intake
from sapo.probe import PolicyProbe
from sapo.publication import group_id, own_groups, publish, row_provenance
from sapo.questions import questions_of_rows, system_messages
from sapo.replay import own_candidates
from sapo.reward_guard import reward_guards
from sapo.round import Round, RoundOutcome, build_round, round_figures
from sapo.sampling import ExternalSampler
from sapo.sources import SourceRegistry, TaskSource
from sapo.sources.own import keyed_by_content, registry_for
from sapo.tasks import TaskSpec
from sapo.trl_bridge import TRLBridge
from swarm.transport import SwarmTransport

logger = logging.getLogger(__name__)

SENDERS_FILE = "senders.json"
"""Written in `output_dir` at every checkpoint and at the end of training: per sending peer, its groups trained on
(`taken`) and dropped by this node (`dropped/<reason>`), for audits of who sent what."""

FAULT_PAUSE_BEFORE_MARKER = "SAPO_FAULT_PAUSE_BEFORE_MARKER"
"""Environment variable (seconds, for fault-injection tests): pause after a checkpoint's files are written and
before its completion marker, so that a kill in that window surely leaves a half-written checkpoint."""


class _StepsFromArguments(TrainerCallback):
    """Log, evaluate and save every N steps as this run's arguments say, after a resume too: Trainer reads those
    intervals from the checkpoint's trainer state, so a node restarted with another `--save_steps` kept the old one."""

    def on_train_begin(self, args: Any, state: TrainerState, control: Any, **kwargs: Any) -> None:
        before = (state.logging_steps, state.eval_steps, state.save_steps)
        state.compute_steps(args, state.max_steps)
        if before != (state.logging_steps, state.eval_steps, state.save_steps):
            logger.info(
                "logging, evaluating and saving every %s, %s and %s steps as asked (the checkpoint said %s, %s, %s)",
                state.logging_steps, state.eval_steps, state.save_steps, *before,
            )  # fmt: skip


class SAPOTrainer(HeldOutEvaluation, TRLBridge):
    """GRPO on a mix of locally generated groups and groups sampled from a swarm of peers (SAPO).

    Example:

    ```python
    >>> from rewards import reasoning_gym_reward
    >>> from sapo import SAPOConfig, SAPOTrainer
    >>> from sapo.models import load_policy
    >>> from sapo.sources import ReasoningGymSource
    >>> from swarm.dht import DHTTransport, DHTTransportConfig

    >>> model, tokenizer = load_policy()  # the embedded SmolLM2-135M-Instruct
    >>> tasks = ReasoningGymSource(["basic_arithmetic", "chain_sum"])
    >>> swarm = DHTTransport(DHTTransportConfig(initial_peers=["/ip4/203.0.113.7/tcp/31337/p2p/Qm..."]))
    >>> trainer = SAPOTrainer(
    ...     model=model,
    ...     reward_funcs=reasoning_gym_reward,
    ...     args=SAPOConfig(output_dir="out", num_local=4, num_external=4),  # 4 own groups, 4 from the swarm
    ...     train_dataset=tasks.rows(size=1000),
    ...     processing_class=tokenizer,
    ...     swarm=swarm,
    ... )
    >>> trainer.train()
    >>> swarm.close()
    ```

    Everything `trl.GRPOTrainer` accepts is accepted here, by position or by name, plus these keyword arguments:

    Args:
        swarm (`swarm.SwarmTransport` or `None`):
            Where groups are published and taken from (`swarm.dht.DHTTransport` for a real swarm,
            `swarm.MemorySwarm(...).join(...)` for tests and simulation). `None` trains alone: every slot is
            filled in locally and nothing is published.
        sampler (`sapo.sampling.ExternalSampler` or `None`):
            Chooses external groups among candidates; default built from `args.sampling_strategy`.
        sources (`list[sapo.sources.TaskSource]` or `None`):
            The task sources this peer holds: each re-derives the truth of received groups of its items (see
            `sapo.sources`). Default: those the training rows come from (reasoning-gym tasks, dataset items keyed by
            content; with a swarm, rows without a provenance are keyed by their content as dataset `"dataset"`).
            Groups of a source not held here follow `args.external_source_policy`; a group whose question is one of
            the evaluation set's is set aside (`held_out`), never trained on.
        completion_filter (`Callable[[str], str | None]` or `None`):
            A check of each received completion after `args`' completion hygiene: None lets it pass, a string
            says why not and drops its group (counted as `hygiene`).
        held_out_tasks (`list[sapo.tasks.TaskSpec]` or `None`):
            The reasoning-gym tasks of the held-out set derived when no `eval_dataset` is given; default: those
            `train_dataset` draws from. A task specialist evaluated on a whole mix passes the mix.

    Without a swarm (or with `num_external=0`) it trains as GRPOTrainer does, on the same batches, with TRL's
    evaluation (held-out pass@1 added on eval rows of questions, see `evaluate`), and says so in one log line. What it
    logs beside TRL's figures (`sapo/...`, `swarm/...`, `eval/pass@1`, ...) is listed in docs/metrics.md.

    With several processes (`accelerate launch --num_processes N`), the node is one swarm peer: pass the swarm on
    the main process and `None` on the others. The main process fetches candidates for every process (each verifies
    and scores them identically, then takes an equal share of one common selection) and publishes the groups of
    every process. With a swarm, `num_local` and `num_external` must then be multiples of N.

    Attributes:
        intake (`sapo.intake.Intake`): everything that happens to received groups (its `sources`, `sampler`,
            `standing`, `plausibility`).
        swarm_totals (`collections.Counter`): cumulative counts (external groups, fill-ins, drops by reason, ...),
            logged as `sapo/total/<name>`.
        taken_from (`collections.Counter`): external groups trained on, by verified sender.
        sender_outcomes (`sapo.tally.SenderTally`): per sender, groups taken, dropped and refused, by reason.
        last_external (`list[sapo.sampling.Candidate]`): the external groups of the latest round, with the
            rewards this peer gave them.
        last_evaluation (`sapo.evaluation.HeldOutResult` or `None`): the latest held-out evaluation.
    """

    def __init__(
        self,
        model: Any,
        reward_funcs: Any = None,
        args: SAPOConfig | None = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        *grpo_args: Any,
        swarm: SwarmTransport | None = None,
        sampler: ExternalSampler | None = None,
        sources: Sequence[TaskSource] | None = None,
        completion_filter: CompletionFilter | None = None,
        held_out_tasks: Sequence[TaskSpec] | None = None,
        **kwargs: Any,
    ):
        if args is None:  # as GRPOTrainer names its default output directory
            name = model if isinstance(model, str) else str(getattr(model.config, "name_or_path", "") or "model")
            args = SAPOConfig(f"{name.rstrip('/').split('/')[-1]}-SAPO")
        if not isinstance(args, SAPOConfig):
            raise TypeError(f"SAPOTrainer needs args=SAPOConfig(...), got {type(args).__name__}.")
        # What is shared must name its item, so that peers can verify it. With several processes only the main one
        # holds the swarm, but every process's groups are published: each keys its rows.
        if swarm is not None or os.environ.get("WORLD_SIZE", "1") != "1":
            train_dataset = keyed_by_content(train_dataset)
        derived_held_out = eval_dataset is None and args.eval_strategy != "no"
        if derived_held_out:
            eval_dataset = held_out_questions(train_dataset, args.eval_questions, held_out_tasks, sources or ())
        # GRPOTrainer's further arguments in its own order (processing_class, reward_processing_classes, ...) or by name
        super().__init__(model, reward_funcs, args, train_dataset, eval_dataset, *grpo_args, **kwargs)
        # Measured by greedy pass@1 only: GRPOTrainer has no eval set here (see evaluate).
        self.derived_held_out = self.eval_dataset if derived_held_out else None
        self.add_callback(_StepsFromArguments)
        self.swarm = swarm
        # Every process must agree on whether there is a swarm and on its peer id: they take part in the
        # main process's fetches and publications together, and make the same selection.
        self._uses_swarm, peer_id = self._main_process_swarm(swarm)
        if (self._uses_swarm or args.replay != "off") and args.num_external > 0:
            self._check_external_support(train_dataset)
        if not self._uses_swarm and args.num_external > 0 and args.replay != "off":
            logger.info(
                "no swarm given: the %d external slots of each round replay this trainer's own earlier groups "
                "(replay=%r), and are generated here when none is left", args.num_external, args.replay,
            )  # fmt: skip
        elif not self._uses_swarm and args.num_external > 0:
            logger.warning(
                "no swarm given: SAPOTrainer trains as a local GRPO learner; the %d external groups of each round are "
                "generated here (pass swarm=... to take them from peers)", args.num_external,
            )  # fmt: skip
        elif not self._uses_swarm:
            logger.info("no swarm given: SAPOTrainer trains as a local GRPO learner (pass swarm=... to join peers)")
        self.intake = Intake(
            args, swarm, self._uses_swarm, peer_id, self.accelerator, self.reward_weights,
            system_messages=system_messages(train_dataset),  # this node's own, around every external question
            sampler=sampler, completion_filter=completion_filter,
            sources=self._sources(train_dataset, sources),
        )  # fmt: skip
        # a received group of a question this trainer evaluates on is never trained on (`held_out`)
        self.intake.sources.hold_out(questions_of_rows(self.eval_dataset))
        self.swarm_model_name = args.swarm_model_name or str(getattr(self.model.config, "name_or_path", "") or "")
        self.last_external: list[Any] = []
        self._phase_seconds: Counter[str] = Counter()

    @property
    def swarm_totals(self) -> Counter[str]:
        """Cumulative counts (external groups, fill-ins, drops by reason, ...), logged as `sapo/total/<name>`."""
        return self.intake.totals

    @property
    def taken_from(self) -> Counter[str]:
        """External groups trained on, by verified sender."""
        return self.intake.taken_from

    @property
    def sender_outcomes(self) -> dict[str, Counter[str]]:
        """Per sender: groups taken (`taken`) and dropped (`dropped/<reason>`)."""
        return self.intake.sender_outcomes

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

    def _sources(self, train_dataset: Any, sources: Sequence[TaskSource] | None) -> SourceRegistry:
        """The task sources this peer holds: given, or found from its own rows (only a peer in a swarm needs them)."""
        policy = self.args.external_source_policy
        if not self._uses_swarm:
            return SourceRegistry(sources or (), policy)
        return registry_for(
            train_dataset, sources, policy, self.args.regeneration_timeout, self.args.regeneration_budget
        )

    def _check_external_support(self, train_dataset: Any) -> None:
        if self.tools or self.rollout_func is not None or self.environment_factories is not None:
            raise ValueError(
                "num_external > 0 does not support tools, rollout_func or environment_factory: a swarm group is "
                "single-turn text, and TRL's multi-turn rollouts index their tools and environments by the row of the "
                "whole batch; set num_external=0 to train on own rollouts."
            )
        first = next(iter(train_dataset)) if train_dataset is not None else None
        if first is not None and not is_conversational(first):
            raise ValueError(
                "num_external > 0 with a swarm needs a conversational dataset (a 'prompt' column of chat messages), "
                "since swarm groups carry their question as chat messages; set num_external=0 to train on own groups."
            )

    # ------------------------------------------------------------------------------------------------
    # the SAPO round

    def sapo_round(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        """One SAPO round for the rows TRL drew: TRL's training batch for it."""
        num_groups = len(inputs) // self.num_generations
        num_slots = min(self.args.num_external // self.accelerator.num_processes, num_groups)
        self._phase_seconds.clear()
        # 1. the external groups: fetched, judged, tokenized and scored once, sampled, checked for plausibility
        probe = PolicyProbe(self, list(inputs[0]), self.args.plausibility_span_tokens)
        taken = self.intake.take(num_slots, probe, self.timed, step=self.state.global_step)
        # 2. the round: the external groups in the last slots, every other slot keeps its own question
        round_ = build_round(inputs, taken.chosen, taken.share, num_groups - num_slots, self.num_generations)
        self.last_external = list(taken.chosen)
        # 3. TRL runs it: own rows generated and scored, external ones spliced in, advantages per group
        output, outcome = self.run_trl_round(round_, round_.rows)
        # 4. the own groups published (and kept for self-replay); every group and the round's figures logged
        self._publish(round_, outcome)
        self._remember_for_replay(round_, outcome)
        self._log_round(round_, outcome, taken.scored, taken.zero_advantage, num_slots)
        self._announce_phase("training")  # the rest of the step is TRL's loss, backward pass and optimizer step
        return output

    def on_loss_pass(
        self, logps: torch.Tensor, entropies: torch.Tensor, completion_mask: torch.Tensor, external: torch.Tensor | None
    ) -> None:
        """The loss pass's statistics of own completions feed the plausibility reference."""
        intake = getattr(self, "intake", None)  # None: a trainer built without its __init__ (TRL's own tests do)
        if intake is not None:
            intake.observe_loss_pass(logps, entropies, completion_mask, external)

    # ------------------------------------------------------------------------------------------------
    # after the round: publish, log

    def _publish(self, round_: Round, outcome: RoundOutcome) -> None:
        """Publish each group generated here this round as decoded text (every process calls it: it gathers)."""
        if not self._uses_swarm or not self.args.publish_groups:
            return
        groups = own_groups(round_.rows, outcome.own_completions, round_.own_group_starts, self.num_generations,
                            self.state.global_step, self.accelerator.process_index, self.swarm_model_name)  # fmt: skip
        if self.accelerator.num_processes > 1:
            groups = gather_object(groups)  # the main process publishes the groups of all processes
        if self.swarm is not None:
            with self.timed("publish"):
                publish(self.swarm, groups, self.intake.totals)

    def _remember_for_replay(self, round_: Round, outcome: RoundOutcome) -> None:
        """Hand this round's own groups, as trained on, to the intake's self-replay (`SAPOConfig.replay`)."""
        if self.intake.replay is None or outcome.rewards is None:
            return
        candidates = own_candidates(
            round_.rows, round_.own_group_starts, outcome.own_completion_ids,
            {i: completion_text(c) for i, c in outcome.own_completions.items()},
            outcome.rewards_per_func.tolist(), outcome.rewards.tolist(), self.num_generations,
            self.state.global_step, self.accelerator.process_index, self.swarm.peer_id if self.swarm else "self",
            self.swarm_model_name, time.time(),
        )  # fmt: skip
        self.intake.remember_own(candidates, self.state.global_step)

    def _log_round(self, round_: Round, outcome: RoundOutcome, scored: int, zero_advantage: int, slots: int) -> None:
        """The round's figures (averaged by TRL over each logging window), its own groups in the group log and the
        completions log."""
        figures = round_figures(round_, outcome, slots, scored, zero_advantage, self.state.global_step)
        for name, value in {**{f"sapo/time/{k}": v for k, v in self._phase_seconds.items()}, **figures}.items():
            self.record_metric(name, value)
        self._log_completions("train", [(str(round_.rows[i].get("task", "")), completion_text(c))
                                        for i, c in sorted(outcome.own_completions.items())])  # fmt: skip
        if outcome.rewards is not None:
            size, step, rank = self.num_generations, self.state.global_step, self.accelerator.process_index
            self.intake.observe_own_groups(
                [(group_id(step, rank, k), row_provenance(round_.rows[s]).task, outcome.rewards[s : s + size].tolist())
                 for k, s in enumerate(round_.own_group_starts)],
                model=self.swarm_model_name,
            )  # fmt: skip

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

    @contextlib.contextmanager
    def timed(self, phase: str) -> Iterator[None]:
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

    # ------------------------------------------------------------------------------------------------
    # checkpoints

    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any) -> Any:
        """TRL's training loop; at its end, the per-sender outcomes are written to `output_dir`/senders.json. What is
        alive when it starts is left out of the garbage collector's scans while it trains (:mod:`sapo.collector`).

        A checkpoint that already holds `max_steps` steps (a run killed after its last checkpoint, during its final
        evaluation say) is loaded, evaluated where `eval_on_start` asks, and trained no further: Trainer tests the
        limit only after a step, so it would train one step past it.
        """
        if resume_from_checkpoint is True:
            resume_from_checkpoint = get_last_checkpoint(self.args.output_dir) or True  # True: Trainer's own error
        done = self._completed_state(resume_from_checkpoint)
        if isinstance(resume_from_checkpoint, (str, os.PathLike)):
            self._restore_totals(read_totals(resume_from_checkpoint))
        with long_lived_frozen():  # a full garbage collection would stall the swarm transport's loop
            if done is None:
                result = super().train(resume_from_checkpoint, *args, **kwargs)
            else:
                result = self._close_completed_run(str(resume_from_checkpoint), done)
        self._write_sender_outcomes()
        return result

    def _completed_state(self, checkpoint: str | bool | None) -> TrainerState | None:
        """The checkpoint's trainer state when it already holds `max_steps` steps, else None."""
        if not isinstance(checkpoint, (str, os.PathLike)) or self.args.max_steps <= 0:
            return None
        path = os.path.join(checkpoint, TRAINER_STATE_NAME)
        if not os.path.isfile(path):
            return None
        state = TrainerState.load_from_json(path)
        return state if state.global_step >= self.args.max_steps else None

    def _close_completed_run(self, checkpoint: str, state: TrainerState) -> TrainOutput:
        logger.info("%s holds all %d steps: nothing left to train", checkpoint, self.args.max_steps)
        self.load_checkpoint(checkpoint)
        state.is_local_process_zero = self.is_local_process_zero()
        state.is_world_process_zero = self.is_world_process_zero()
        self.state = state
        self.control = self.callback_handler.on_train_begin(self.args, self.state, self.control)
        if self.args.eval_on_start:  # as Trainer evaluates a resumed run's first step
            self.evaluate()
        self.control = self.callback_handler.on_train_end(self.args, self.state, self.control)
        return TrainOutput(state.global_step, 0.0, {})

    def _write_sender_outcomes(self) -> None:
        if not self.accelerator.is_main_process or not self._uses_swarm:
            return
        os.makedirs(self.args.output_dir, exist_ok=True)
        path = os.path.join(self.args.output_dir, SENDERS_FILE)
        with open(path + ".tmp", "w") as f:
            json.dump({sender: dict(counts) for sender, counts in sorted(self.sender_outcomes.items())}, f, indent=1)
        os.replace(path + ".tmp", path)  # never a torn file, whenever the node is killed

    def _restore_totals(self, saved: dict[str, Any]) -> None:
        """Count on from a resumed checkpoint's totals: `sapo/total/...`, per-sender outcomes, reward errors."""
        self.intake.restore_totals(saved)
        guards = reward_guards(self.reward_funcs)
        if len(guards) == 1:
            guards[0].errors += int(saved.get("reward_errors") or 0)

    def on_checkpoint_saved(self, folder: str) -> None:
        """Per-sender outcomes and the running totals beside the checkpoint, then its completion marker, written last:
        a checkpoint without it is incomplete."""
        self._write_sender_outcomes()
        if self.args.should_save:
            errors = sum(guard.errors for guard in reward_guards(self.reward_funcs))
            write_totals(folder, {**self.intake.running_totals(), "reward_errors": errors})
        pause = float(os.environ.get(FAULT_PAUSE_BEFORE_MARKER) or 0)
        if pause > 0:  # fault injection (tests): a kill in this window always leaves a half-written checkpoint
            time.sleep(pause)
        if self.args.should_save:
            mark_complete(folder, self.state.global_step)
