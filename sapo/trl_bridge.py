"""The bridge to TRL: every override of a TRL or Trainer private method, and every private name the project reads.

`SAPOTrainer` subclasses `trl.GRPOTrainer` through :class:`TRLBridge`, so that a TRL upgrade is this module's work. The
rest of the project calls the bridge's public methods (`run_trl_round`, `text_tokenizer`, `tokenize_prompts`,
`score_with_trl`, `policy_logps`, `record_metric`, `log_evaluation`, `save_checkpoint`, `load_checkpoint`) and
overrides its hooks (`sapo_round`, `on_loss_pass`, `on_checkpoint_saved`, `timed`), none of which are TRL's.

Tested TRL versions: 1.16.0 (`pyproject.toml` pins `trl>=1.16,<1.17`), with this project's tests and TRL's own GRPO
tests run against this class and against `SAPOTrainer` without a swarm (`python -m benchmarks.trl_peer_tests`: the
same tests pass as with `GRPOTrainer`). What each private name is relied on for:

- `GRPOTrainer._generate_and_score_completions(inputs) -> dict`: called once per generation batch with the rows TRL
  drew; returns the batch the loss reads. Training rounds go to `sapo_round`, which replaces the rows of the external
  slots and has TRL run them (`run_trl_round`); the batch gains the bool column `EXTERNAL_COLUMN`.
- `GRPOTrainer._generate(prompts)`: generates a batch's completions; returns the 8-tuple `(prompt_ids, completion_ids,
  tool_mask, completions, logprobs, extra_fields, images, tool_images)`. Here it generates the own rows and splices
  the external ones in (`sapo.round.splice_generation`).
- `GRPOTrainer._calculate_rewards(inputs, prompts, completions, completion_ids_list)`: scores a process's rows and
  gathers them (rows of every process x reward functions). Here the own rows are scored and the external rewards
  spliced in (`sapo.round.splice_rewards`); `score_with_trl` runs TRL's own version on received completions.
- `GRPOTrainer._compute_loss(model, inputs)`: the loss of one micro-batch; the loss phase, and which rows are external.
- `GRPOTrainer._generate_single_turn(prompt_ids, images, multimodal_fields, ...)`: the transformers generation call,
  run inside the generation speed-ups (`sapo.speed`); `GRPOTrainer._is_vlm` (set by `__init__`: the model is a
  vision-language model) tells them to step aside.
- `GRPOTrainer._get_per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep, batch_size=,
  compute_entropy=) -> (logps, entropies, ...)`: run inside the loss-pass speed-ups; the loss pass's statistics of own
  completions feed the plausibility reference (`on_loss_pass`).
- `GRPOTrainer._tokenize_prompts(prompts) -> (prompt_ids, ...)`, `GRPOTrainer._tokenizer` (the text tokenizer):
  prompts and received completions tokenized as TRL tokenizes its own.
- `GRPOTrainer._metrics[mode][name]`: lists of values TRL averages into each logged line.
- `GRPOTrainer.log` names its figures `train` or `eval` by `model.training`: `log_evaluation` logs in eval mode.
- `Trainer._save_checkpoint(model, trial)`, `Trainer._get_output_dir(trial)`, `Trainer._load_from_checkpoint(path)`:
  a checkpoint's folder, completed by `on_checkpoint_saved`; a finished run's checkpoint loaded.

The speed-ups replace a few private names of TRL and transformers for one context (TRL's fused LM head, transformers'
attention registry); they are named in `sapo/speed/patch_point.py` alone, with what each is relied on for. No other
module names a private name of TRL or transformers (`tests/test_trl_bridge.py` looks for any).

The phase of a call (a training round, the loss pass, an evaluation) is set where it starts (`training_step`,
`_compute_loss`, `prediction_step`) and read from :attr:`TRLBridge.phase`, never from `model.training` or
`torch.is_grad_enabled()`. :func:`missing_trl_names` lists what the installed TRL lacks; the trainer refuses to start
without it.
"""

from __future__ import annotations

import contextlib
import enum
import os
from collections.abc import Iterator
from typing import Any

import torch
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl import GRPOTrainer

from sapo.round import (
    EXTERNAL_COLUMN,
    Generation,
    Round,
    RoundOutcome,
    splice_generation,
    splice_rewards,
    weighted_rewards,
)
from sapo.speed import SpeedUps

TESTED_TRL = "1.16"
"""The TRL minor version this bridge is tested with."""

OVERRIDDEN = (
    "_generate_and_score_completions",
    "_generate",
    "_calculate_rewards",
    "_compute_loss",
    "_generate_single_turn",
    "_get_per_token_logps_and_entropies",
    "_save_checkpoint",
)
"""TRL's and Trainer's private methods overridden here."""

READ = ("_tokenize_prompts", "_get_output_dir", "_load_from_checkpoint")
"""Their private methods called here (and `_tokenizer`, `_metrics` and `_is_vlm`, attributes set by
`GRPOTrainer.__init__`)."""


def missing_trl_names(trainer_class: type = GRPOTrainer) -> list[str]:
    """The private methods this bridge needs that ``trainer_class`` (the installed TRL's GRPOTrainer) lacks."""
    return [name for name in (*OVERRIDDEN, *READ) if not callable(getattr(trainer_class, name, None))]


def check_trl(trainer_class: type = GRPOTrainer) -> None:
    """Raise ImportError naming what the installed TRL lacks, with the version this bridge is tested with."""
    missing = missing_trl_names(trainer_class)
    if missing:
        import trl

        raise ImportError(
            f"the installed TRL {trl.__version__} lacks {', '.join(missing)}, which SAPOTrainer overrides or calls "
            f"(sapo/trl_bridge.py); install the tested version: pip install 'trl>={TESTED_TRL},<1.17'"
        )


class Phase(enum.Enum):
    """What the trainer is doing, as the bridge's hooks need to know it."""

    IDLE = "idle"
    ROUND = "round"  # a training step's generation batch: the SAPO round is built and TRL generates and scores it
    LOSS = "loss"  # the loss pass of a training micro-batch
    EVALUATION = "evaluation"  # TRL's evaluation (prediction_step)


class TRLBridge(GRPOTrainer):
    """GRPOTrainer with SAPO's round spliced into its private hooks (see the module docstring for each).

    Subclasses implement :meth:`sapo_round` and may override :meth:`on_loss_pass`, :meth:`on_checkpoint_saved` and
    :meth:`timed`. Attributes: `phase` (`Phase`), the round TRL is running (set by `run_trl_round` alone).
    """

    phase: Phase = Phase.IDLE
    _round: Round | None = None
    _outcome: RoundOutcome | None = None
    _loss_rows_external: torch.Tensor | None = None

    def __init__(self, *args: Any, **kwargs: Any):
        check_trl(GRPOTrainer)
        super().__init__(*args, **kwargs)

    # ------------------------------------------------------------------------------------------------
    # the phase, set where each kind of call starts

    @contextlib.contextmanager
    def in_phase(self, phase: Phase) -> Iterator[None]:
        """Run the body in ``phase``; the previous phase after it."""
        previous, self.phase = self.phase, phase
        try:
            yield
        finally:
            self.phase = previous

    def training_step(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        with self.in_phase(Phase.ROUND):  # the generation batch, if due; the loss pass sets its own phase
            return super().training_step(*args, **kwargs)

    def prediction_step(self, *args: Any, **kwargs: Any) -> Any:
        with self.in_phase(Phase.EVALUATION):
            return super().prediction_step(*args, **kwargs)

    # ------------------------------------------------------------------------------------------------
    # hooks for the subclass

    def sapo_round(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        """A training round for the rows TRL drew (default: TRL's own round, unchanged)."""
        return self.run_trl_round(None, inputs)[0]

    def on_loss_pass(
        self, logps: torch.Tensor, entropies: torch.Tensor, completion_mask: torch.Tensor, external: torch.Tensor | None
    ) -> None:
        """Told the per-token log-probabilities and entropies of each training loss pass, with which rows of the
        micro-batch are external (None: unknown)."""

    def on_checkpoint_saved(self, folder: str) -> None:
        """Told once a checkpoint's files are written to ``folder`` (main process decides what to add)."""

    def timed(self, phase: str) -> contextlib.AbstractContextManager:
        """A context measuring the time spent in ``phase`` (default: nothing measured)."""
        return contextlib.nullcontext()

    # ------------------------------------------------------------------------------------------------
    # running a round through TRL

    def run_trl_round(self, round_: Round | None, rows: list[dict[str, Any]]) -> tuple[dict[str, Any], RoundOutcome]:
        """TRL generates and scores ``rows`` (``round_``'s, with its external rows spliced in by the hooks below), and
        returns its batch, with the external column when there is a round, and what the hooks collected."""
        self._round, self._outcome = round_, RoundOutcome()
        try:
            output = super()._generate_and_score_completions(list(rows))
        finally:
            outcome, self._round, self._outcome = self._outcome, None, None
        if round_ is not None:
            output[EXTERNAL_COLUMN] = torch.tensor(round_.is_external, device=self.accelerator.device)
        return output, outcome

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        if self.phase is not Phase.ROUND:  # TRL's evaluation, or a direct call: TRL's own round
            return super()._generate_and_score_completions(inputs)
        return self.sapo_round(inputs)

    def _generate(self, prompts: list):
        """Generate the own rows (kept for publishing); splice in the external rows."""
        round_ = self._round
        if round_ is None and self.phase is not Phase.ROUND:  # TRL's evaluation, or a direct call
            return super()._generate(prompts)
        if round_ is None:  # TRL's own round (the default `sapo_round`)
            with self.timed("generation"):
                return super()._generate(prompts)
        if not round_.external:
            with self.timed("generation"):
                result = super()._generate(prompts)
            self._outcome.own_completions = dict(enumerate(result[3]))
            self._outcome.own_completion_ids = dict(enumerate(result[1]))
            return result
        own = round_.own_rows
        generated = ([], [], None, [], None, {}, None, [])
        if own:
            with self.timed("generation"):
                generated = super()._generate([prompts[i] for i in own])
        prompt_ids, completion_ids, mask, completions, logprobs, extra_fields, _, _ = generated
        self._outcome.own_completions = dict(zip(own, completions, strict=True))
        self._outcome.own_completion_ids = dict(zip(own, completion_ids, strict=True))
        external_prompt_ids = self.tokenize_prompts([prompts[i] for i in sorted(round_.external)])
        own_rows = Generation(prompt_ids, completion_ids, mask, completions, logprobs)
        spliced = splice_generation(round_, own_rows, external_prompt_ids)
        return *spliced, extra_fields, None, []

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        """Score the own rows now; external rows keep the rewards the intake gave them (scored once)."""
        round_ = self._round
        with self.timed("scoring"):
            if round_ is None or not round_.chosen:  # TRL's evaluation, or a round of own groups only
                rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
            else:
                own = round_.own_rows
                scored = torch.empty(0, len(self.reward_funcs), device=self.accelerator.device)
                if own:  # the same number of own rows on every process (each takes an equal share of the groups)
                    ids = None if completion_ids_list is None else [completion_ids_list[i] for i in own]
                    pick = [inputs[i] for i in own], [prompts[i] for i in own], [completions[i] for i in own]
                    scored = super()._calculate_rewards(*pick, ids)
                processes = self.accelerator.num_processes
                rewards_per_func = splice_rewards(round_, scored, processes, len(self.reward_funcs))
        if self._outcome is not None:
            start = self.accelerator.process_index * len(prompts)
            self._outcome.rewards_per_func = rewards_per_func[start : start + len(prompts)].detach().cpu()
            self._outcome.rewards = weighted_rewards(self._outcome.rewards_per_func, self.reward_weights)
        return rewards_per_func

    # ------------------------------------------------------------------------------------------------
    # the loss pass

    def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> torch.Tensor:
        """TRL's loss, in the loss phase, knowing which rows of the micro-batch are external."""
        self._loss_rows_external = inputs.get(EXTERNAL_COLUMN)
        try:
            with self.in_phase(Phase.LOSS):
                return super()._compute_loss(model, inputs)
        finally:
            self._loss_rows_external = None

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        loss_pass = self.phase is Phase.LOSS
        speed = SpeedUps.of(self)
        with speed.loss_pass(self, model, training=loss_pass):
            result = speed.shared_prompt_scores(self, model, input_ids, attention_mask, logits_to_keep, args, kwargs)
            if result is None:
                result = super()._get_per_token_logps_and_entropies(
                    model, input_ids, attention_mask, logits_to_keep, *args, **kwargs
                )
        if loss_pass and result[1] is not None:
            completion_mask = attention_mask[:, input_ids.shape[1] - logits_to_keep :]
            self.on_loss_pass(result[0], result[1], completion_mask, self._loss_rows_external)
        return result

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, *args, **kwargs):
        """TRL's generation of the own rows, inside the speed-ups that apply to it (`sapo.speed`)."""
        with SpeedUps.of(self).generation(self, images, multimodal_fields, vision=self._is_vlm):
            return super()._generate_single_turn(prompt_ids, images, multimodal_fields, *args, **kwargs)

    # ------------------------------------------------------------------------------------------------
    # what the rest of the project asks of TRL

    @property
    def text_tokenizer(self) -> Any:
        """The text tokenizer TRL tokenizes with (the processing class, or its tokenizer)."""
        return self._tokenizer

    def tokenize_prompts(self, prompts: list) -> list[list[int]]:
        """The token ids of ``prompts`` as TRL tokenizes its own (chat template, generation prompt)."""
        return self._tokenize_prompts(prompts)[0]

    def score_with_trl(self, rows: list[dict[str, Any]], prompts: list, completions: list, ids: list) -> torch.Tensor:
        """TRL's own reward path (not the round's hook) over ``completions``: rows x reward functions, gathered."""
        return GRPOTrainer._calculate_rewards(self, rows, prompts, completions, ids)

    def policy_logps(
        self, model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token log-probabilities and entropies of the last ``logits_to_keep`` positions under ``model``, by
        TRL's pass (with its speed-ups; no loss phase)."""
        logps, entropies, *_ = self._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, logits_to_keep,
            batch_size=self.args.per_device_train_batch_size, compute_entropy=True,
        )  # fmt: skip
        return logps, entropies

    def record_metric(self, name: str, value: float) -> None:
        """Add ``value`` to the training figure ``name``, averaged by TRL into the next logged line."""
        self._metrics["train"][name].append(value)

    def log_evaluation(self, metrics: dict[str, float]) -> None:
        """Log ``metrics`` as an evaluation line (TRL adds no training figures to it)."""
        was_training = self.model.training
        self.model.eval()
        try:
            self.log(metrics)
        finally:
            self.model.train(was_training)

    def save_checkpoint(self) -> None:
        """Write a checkpoint of the current step as Trainer's schedule would (with `on_checkpoint_saved`)."""
        self._save_checkpoint(self.model, trial=None)

    def load_checkpoint(self, folder: str) -> None:
        """Load a checkpoint's model weights as Trainer does when resuming."""
        self._load_from_checkpoint(folder)

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        super()._save_checkpoint(model, trial)
        folder = os.path.join(self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        self.on_checkpoint_saved(folder)
