"""Trainer callbacks of a running node: progress, status file, metrics.jsonl, graceful stop, step pacing, swarm logs."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm
from transformers import TrainerCallback

from sapo.jsonl_files import RotatingJsonl, jsonl_files
from sapo.node.board import StatusBoard
from sapo.node.logs import STEP_LOGGER, step_line
from sapo.node.report import is_evaluation_line
from sapo.node.status import write_status

logger = logging.getLogger(__name__)
step_logger = logging.getLogger(STEP_LOGGER)


class NodeProgress(TrainerCallback):
    """A node's progress: one line per logged step in the log (step, reward, peers, groups taken, seconds; logger
    :data:`~sapo.node.logs.STEP_LOGGER`) and, on a terminal, a progress bar over the steps showing the same figures.

    Args:
        terminal: draw the bar (default: whether stderr is a terminal). Without one (Docker, systemd, a file) a bar's
            redraws would pile up in one long line: the step lines say it all.
    """

    def __init__(self, terminal: bool | None = None) -> None:
        self.terminal = sys.stderr.isatty() if terminal is None else terminal
        self.bar: tqdm | None = None
        self._last_end: float | None = None
        self._seconds: float | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        self._last_end = time.monotonic()
        if state.is_world_process_zero and self.terminal:
            self.bar = tqdm(
                total=state.max_steps, initial=state.global_step, desc="sapo", unit="step", dynamic_ncols=True
            )

    def on_step_end(self, args, state, control, **kwargs):
        now = time.monotonic()
        self._seconds, self._last_end = now - (self._last_end or now), now
        if self.bar is not None:
            self.bar.update(state.global_step - self.bar.n)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs or "sapo/local_reward" not in logs and "reward" not in logs:
            return
        seconds = logs.get("step_time", self._seconds)
        step_logger.info("%s", step_line(state.global_step, state.max_steps, logs, seconds))
        if self.bar is not None:
            self.bar.set_postfix(
                reward=f"{logs.get('sapo/local_reward', logs.get('reward', float('nan'))):.3f}",
                peers=int(logs.get("sapo/peers", 0)),
                shared=int(logs.get("sapo/total/published_groups", 0)),
                taken=int(logs.get("sapo/total/external_groups", 0)),
                refresh=False,
            )

    def on_train_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.close()
            self.bar = None


_PHASE_WORDS = {  # SAPOTrainer's phase names, as a person reads them
    "swarm_fetch": "fetching swarm groups",
    "external_scoring": "scoring swarm groups",
    "generation": "generating",
    "publish": "publishing",
    "scoring": "scoring",
    "training": "training",
    "evaluating": "evaluating held-out questions",
}


class NodeStatus(TrainerCallback):
    """What the node is doing now, in `status.json` of its output directory (read by `local-swarm`'s status line):
    `{"phase": ..., "step": ..., "time": ..., "swarm": "joined" | "alone", "page": URL}`, and on its status page
    (a :class:`~sapo.node.board.StatusBoard`). Phases before training (loading, joining, waiting) are set by the
    node with :meth:`set`; during training, SAPOTrainer announces the step's phases through :meth:`on_phase`.
    After each logged step the swarm is read again (:meth:`watch`): joining and being left alone are logged."""

    def __init__(self, output_dir: str | Path, board: StatusBoard | None = None):
        self.output_dir = Path(output_dir)
        self.board = board or StatusBoard()
        self._step = 0
        self._extra: dict[str, Any] = {}
        self._swarm: Any = None
        self._senders: Any = None
        self._rejoin_through: list[str] = []
        self._require_swarm = False

    def set(self, phase: str, step: int | None = None, patience: float = 0.0, **extra: Any) -> None:
        """Record ``phase`` (at ``step``, or the step last recorded); ``extra`` fields stay in status.json;
        ``patience``: see :meth:`StatusBoard.set_phase`."""
        if step is not None:
            self._step = step
        self._extra.update(extra)
        self.board.set_phase(phase, self._step, patience)
        write_status(self.output_dir, phase, self._step, **self._extra)

    def watch(
        self, swarm: Any, senders: Any = None, rejoin_through: list[str] | None = None, require_swarm: bool = False
    ) -> None:
        """Read ``swarm`` (a SwarmTransport) and ``senders()`` (per-sender outcomes) after every logged step."""
        self._swarm, self._senders = swarm, senders
        self._rejoin_through, self._require_swarm = list(rejoin_through or []), require_swarm
        self.read_swarm(self._step)

    def read_swarm(self, step: int) -> None:
        """Update the board from the swarm; log when the node joins or is left alone."""
        if self._swarm is None:
            return
        state = self.board.record_swarm(self._swarm, self._require_swarm, self._rejoin_through)
        if self._senders is not None:
            self.board.record_senders(self._senders())
        before = self._extra.get("swarm")
        if state != before:
            self._extra["swarm"] = state
            if state == "joined" and before == "alone":
                logger.info("step %d: joined the swarm: groups of other peers can fill the external slots now", step)
            elif state == "alone" and not self._rejoin_through and before is None:
                logger.info("no other peer in the swarm yet: every slot is filled with this node's own groups")
            elif state == "alone":
                logger.warning(
                    "step %d: training alone: no other peer is reachable, so every slot is filled with this node's "
                    "own groups; trying to join in the background%s", step,
                    f" through {', '.join(self._rejoin_through)}" if self._rejoin_through else "",
                )  # fmt: skip

    def on_phase(self, phase: str, state) -> None:
        if state.is_world_process_zero:
            self.set(_PHASE_WORDS.get(phase, phase), state.global_step + (phase != "evaluating"))

    def on_train_begin(self, args, state, control, **kwargs):
        self.board.set_max_steps(state.max_steps)
        self.board.step_done(state.global_step)

    def on_step_end(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.board.step_done(state.global_step)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs or "train_runtime" in logs or is_evaluation_line(logs):
            return
        self.board.record_step(state.global_step, logs)
        self.read_swarm(state.global_step)

    def replay(self, records: list[dict[str, Any]]) -> None:
        """Put the lines of metrics.jsonl logged before this process started (a resumed run) on the page's plots."""
        for record in records:
            step = record.get("step")
            if not isinstance(step, int):
                continue
            if is_evaluation_line(record):
                self.board.record_held_out(step, record["eval/pass@1"], record.get("eval/pass@1_se"), _per_task(record))
            elif "train_runtime" not in record:
                self.board.record_history(step, record)

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        if state.is_world_process_zero and metrics and is_evaluation_line(metrics):
            per_task = _per_task(metrics)
            self.board.record_held_out(
                state.global_step, metrics["eval/pass@1"], metrics.get("eval/pass@1_se"), per_task
            )
            tasks = ", ".join(f"{task} {value:.2f}" for task, value in per_task.items())
            logger.info(
                "step %d: held-out pass@1 %.3f ± %.3f on %d questions (%s)",
                state.global_step, metrics["eval/pass@1"], metrics["eval/pass@1_se"], metrics["eval/questions"], tasks,
            )  # fmt: skip

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.set("checkpoint written", state.global_step)

    def on_train_end(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.set("finished training", state.global_step)


def _per_task(metrics: dict[str, Any]) -> dict[str, float]:
    """Held-out pass@1 per task of an evaluation line (`eval/pass@1/<task>`)."""
    return {k.rsplit("/", 1)[1]: v for k, v in metrics.items() if k.startswith("eval/pass@1/")}


RESTING = "resting (min_step_seconds)"
"""The phase a paced node shows while it rests out a step's remainder."""


class StepPace(TrainerCallback):
    """Each step starts at least ``min_seconds`` after the previous one began: the node rests out the remainder before
    it starts the next (``--min_step_seconds``), so on a machine that does other work it takes a bounded share (a
    3-second step paced to 10 s keeps it busy 30 % of the time). Placed after :class:`GracefulStop`, whose step is
    abandonable from its beginning: a stop request ends the rest at once. ``on_rest(seconds)`` is told each rest
    before it begins (the node's status shows it); ``sleep`` and ``clock``: tests pass their own."""

    def __init__(
        self,
        min_seconds: float,
        on_rest: Callable[[float], None] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.min_seconds, self._on_rest, self._sleep, self._clock = min_seconds, on_rest, sleep, clock
        self._began: float | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        logger.info("pacing: each step starts at least %g s after the previous one began (min_step_seconds)",
                    self.min_seconds)  # fmt: skip

    def on_step_begin(self, args, state, control, **kwargs):
        if self._began is not None:
            rest = self.min_seconds - (self._clock() - self._began)
            if rest > 0:
                if self._on_rest is not None:
                    self._on_rest(rest)
                self._sleep(rest)
        self._began = self._clock()


class EvaluateAtEnd(TrainerCallback):
    """The last step of a run is evaluated too (when evaluation is on), so every run has a final held-out figure."""

    def on_step_end(self, args, state, control, **kwargs):
        if args.eval_strategy != "no" and state.global_step >= state.max_steps:
            control.should_evaluate = True


LOG_HISTORY_KEPT = 1000
"""Entries of the trainer's in-memory log (``state.log_history``) a node keeps once each is in `metrics.jsonl`. The
trainer keeps every one, about 6-8 KB a step with the swarm's figures, and writes them all into each checkpoint's
`trainer_state.json`: a month at 10 s a step would hold 1.5-2 GB in memory and take about 36 s a checkpoint."""


METRICS_MAX_BYTES = 32_000_000
"""Size past which `metrics.jsonl` is rotated (`metrics.jsonl.1`): about 10,000 steps at 3 KB a step."""

METRICS_BACKUPS = 2
"""Rotated `metrics.jsonl` files kept (`.1`, `.2`): with the file itself at most about 96 MB, the last 30,000 steps."""

HISTORY_KEPT = 2000
"""Lines of earlier runs a restarted node holds in memory for its status page's plots (as many as a plot's points,
`sapo.node.board.SERIES_POINTS`)."""


class MetricsJsonl(TrainerCallback):
    """Appends one JSON line per logging step to `metrics.jsonl`: the trainer's metrics plus swarm figures; the file
    being the run's record, the trainer's in-memory log then keeps its last :data:`LOG_HISTORY_KEPT` entries. The file
    is rotated past ``max_bytes`` (``backups`` older files kept, :class:`sapo.jsonl_files.RotatingJsonl`), so a node
    left running holds at most about ``(backups + 1) * max_bytes`` of it; ``sapo-node report`` reads the rotated files
    too (:func:`sapo.jsonl_files.read_jsonl`).

    Lines logged after the step training starts from (the checkpoint being resumed, or step 0 for a run
    that left no complete checkpoint) are dropped first, from the rotated files too, so the files never hold two lines
    of one kind for one step. The evaluation of that step is kept: a restarted node that finds it (:meth:`evaluated`)
    does not run it again. The files are read one line at a time, and the last :data:`HISTORY_KEPT` kept lines are
    held (:attr:`history`).
    """

    def __init__(
        self,
        path: str | Path,
        resume_step: int | None = None,
        max_bytes: int = METRICS_MAX_BYTES,
        backups: int = METRICS_BACKUPS,
    ):
        self.path = Path(path)
        self._file = RotatingJsonl(self.path, max_bytes, backups)
        # No checkpoint: the run starts again at step 0 and keeps nothing (not even step 0's evaluation).
        start = -1 if resume_step is None else resume_step
        history: deque[dict[str, Any]] = deque(maxlen=HISTORY_KEPT)
        self._evaluated: set[int] = set()
        for file in jsonl_files(self.path):
            self._keep_up_to(file, start, history)
        self.history: list[dict[str, Any]] = list(history)
        """The last :data:`HISTORY_KEPT` lines kept from earlier runs of this output directory, as records."""

    def _keep_up_to(self, file: Path, start: int, history: deque[dict[str, Any]]) -> None:
        """Keep ``file``'s records up to step ``start`` (into ``history``, their evaluations' steps noted), the file
        rewritten without the others when it held any."""
        lines, dropped = [], False
        with file.open(encoding="utf-8") as f:
            for line in f:
                record = _kept_on_resume(line, start)
                if record is None:
                    dropped = True
                    continue
                history.append(record)
                if is_evaluation_line(record):
                    self._evaluated.add(record.get("step", 0))
                lines.append(line if line.endswith("\n") else line + "\n")
        if dropped:
            file.write_text("".join(lines), encoding="utf-8")

    def evaluated(self, step: int | None) -> bool:
        """Whether an earlier run of this output directory logged a held-out evaluation of ``step``."""
        return (step or 0) in self._evaluated

    def on_log(self, args, state, control, logs=None, **kwargs):
        del state.log_history[:-LOG_HISTORY_KEPT]  # older entries are in the file (the main process's)
        if not state.is_world_process_zero or not logs or "train_runtime" in logs:
            return
        self._file.append([json.dumps({"step": state.global_step, "time": time.time(), **logs})])


def _kept_on_resume(line: str, start: int) -> dict[str, Any] | None:
    """The record of ``line`` if it is kept by a run starting at step ``start``, else None."""
    try:
        record = json.loads(line)
        step = record.get("step", float("inf"))
    except (json.JSONDecodeError, AttributeError):
        return None  # a torn last line from a crash
    return record if step <= start else None


class StopRequested(BaseException):
    """Raised in the node's main thread to abandon the work in progress once a stop is requested. A BaseException,
    as KeyboardInterrupt is, so that no ``except Exception`` in the libraries below swallows it."""


# Phases of a step (SAPOTrainer's names) that a stop abandons: nothing of them is kept that the last completed step
# did not already hold. Publishing (the round's groups sent and logged) is left to finish; the optimizer step too.
_ABANDONABLE_PHASES = frozenset({"swarm_fetch", "external_scoring", "generation", "scoring", "training", "evaluating"})


class GracefulStop(TrainerCallback):
    """SIGINT/SIGTERM stop the node within seconds, in any phase, keeping the last completed step resumable.

    Work that changes nothing kept (waiting for peers, loading, a held-out evaluation, the fetch, generation,
    scoring and the loss of a step in progress) is abandoned at once: :class:`StopRequested` is raised in the main
    thread, and the node checkpoints the last completed step (:meth:`checkpoint_last_step`) before it leaves. An
    abandoned evaluation runs again after a restart. The optimizer step and what follows it up to the step's end are
    left to finish (a few seconds at most), then the step is checkpointed. A second SIGINT aborts without a
    checkpoint. The last step of a run is checkpointed too, so every exit leaves a checkpoint to resume from.
    """

    def __init__(self) -> None:
        self.requested: str | None = None
        self._previous: dict[int, Any] = {}
        self._abandonable: str | None = None  # what the node is doing now that a stop may abandon
        self._finishing = False  # the node is leaving: a stop request changes nothing
        # The model's parameter objects at the end of the last completed step: a step abandoned inside a context that
        # swaps weights (merged LoRA adapters, bf16 copies) and did not put them back is never checkpointed.
        self._parameters: dict[str, Any] = {}

    def install(self) -> GracefulStop:
        """Take over SIGINT and SIGTERM (main thread only)."""
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def uninstall(self) -> None:
        """Give the signals back to their previous handlers."""
        self._abandonable = None
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def finishing(self) -> None:
        """From now on nothing is abandoned (the node leaves): a stop request is recorded, a second Ctrl-C still
        aborts."""
        self._abandonable = None
        self._finishing = True

    def _handle(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if self.requested is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # second Ctrl-C: abandon the step; the node still leaves the swarm
        if self.requested is not None or self._finishing:
            self.requested = self.requested or name
            logger.info("%s received: already leaving", name)
            return
        self.requested = name
        if self._abandonable is not None:
            activity, self._abandonable = self._abandonable, None
            logger.info("%s received: abandoning %s; checkpoint of the last completed step, then leave", name, activity)
            raise StopRequested(name)
        logger.info("%s received: finishing the optimizer step, then checkpoint and leave (Ctrl-C again aborts)", name)

    def raise_if_requested(self) -> None:
        """Raise :class:`StopRequested` when a stop was requested (a point where the node may stop)."""
        if self.requested is not None:
            self._abandonable = None
            raise StopRequested(self.requested)

    @contextlib.contextmanager
    def abandonable(self, activity: str) -> Iterator[None]:
        """Within the context a stop request abandons ``activity`` at once (e.g. ``"waiting for peers"``)."""
        self.raise_if_requested()
        previous, self._abandonable = self._abandonable, activity
        try:
            yield
        finally:
            self._abandonable = previous
        self.raise_if_requested()

    def _enter(self, activity: str | None) -> None:
        self._abandonable = activity
        if activity is not None:
            self.raise_if_requested()  # a stop that arrived while nothing could be abandoned

    def on_phase(self, phase: str, state) -> None:
        self._enter(_PHASE_WORDS.get(phase, phase) if phase in _ABANDONABLE_PHASES else None)

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self._parameters = _parameter_objects(model)

    def on_step_begin(self, args, state, control, **kwargs):
        self._enter(f"step {state.global_step + 1}")

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self._abandonable = None  # from here to the step's end the weights change: the step finishes
        pause = float(os.environ.get(FAULT_PAUSE_IN_OPTIMIZER_STEP) or 0)
        if pause > 0:  # fault injection (tests): a stop requested in this window lands in the optimizer step
            logger.info("fault injection: pausing %g s in the optimizer step", pause)
            time.sleep(pause)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self._abandonable = None
        self._parameters = _parameter_objects(model)
        if self.requested is not None:
            control.should_save = True
            control.should_training_stop = True
        elif state.global_step >= state.max_steps:
            control.should_save = True  # the last step is always resumable, whatever save_steps says

    def on_evaluate(self, args, state, control, **kwargs):
        self._abandonable = None  # a checkpoint may be written next

    def checkpoint_last_step(self, trainer: Any) -> Path | None:
        """After an abandoned step or evaluation: write the checkpoint of ``trainer``'s last completed step unless it
        exists or there is none (step 0). Returns the newest complete checkpoint."""
        from sapo.checkpoints import latest_complete_checkpoint

        self._abandonable = None
        output_dir = Path(trainer.args.output_dir)
        newest = latest_complete_checkpoint(output_dir)
        step = trainer.state.global_step
        if step == 0 or (newest is not None and newest.name == f"checkpoint-{step}"):
            return newest
        if not _same_parameters(trainer.model, self._parameters):
            logger.warning(
                "the work abandoned at step %d left the model's weights swapped: step %d is not checkpointed; "
                "the newest complete checkpoint is %s", step + 1, step, newest,
            )  # fmt: skip
            return newest
        # The weights, optimizer, scheduler and trainer state are those at the end of the last completed step: the
        # step in progress had not reached its optimizer step.
        trainer.save_checkpoint()
        logger.info("step %d: checkpoint written to %s/checkpoint-%d", step, output_dir, step)
        return latest_complete_checkpoint(output_dir)


FAULT_PAUSE_IN_OPTIMIZER_STEP = "SAPO_FAULT_PAUSE_IN_OPTIMIZER_STEP"
"""Environment variable (tests only): seconds a node pauses at the start of each optimizer step."""


def _parameter_objects(model: Any) -> dict[str, Any]:
    return dict(model.named_parameters()) if model is not None else {}


def _same_parameters(model: Any, recorded: dict[str, Any]) -> bool:
    """Whether ``model`` holds the very parameter objects ``recorded`` and no LoRA layer is marked merged."""
    now = _parameter_objects(model)
    if not recorded or now.keys() != recorded.keys() or any(now[k] is not recorded[k] for k in now):
        return False
    return not any(getattr(module, "merged_adapters", None) for module in model.modules())


class SwarmLog(TrainerCallback):
    """Logs what the swarm side of the node does: peers appearing, groups dropped by reason, checkpoints."""

    def __init__(self) -> None:
        self._peers = 0
        self._drops: dict[str, float] = {}

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs:
            return
        peers = int(logs.get("sapo/peers", self._peers))
        if peers != self._peers:
            logger.info("step %d: now seeing %d other peer(s) in the swarm", state.global_step, peers)
            self._peers = peers
        drops = {k: v for k, v in logs.items() if k.startswith(("sapo/total/dropped/", "swarm/rejected/"))}
        new = {k: v - self._drops.get(k, 0) for k, v in drops.items() if v > self._drops.get(k, 0)}
        if new:
            detail = ", ".join(f"{k.rsplit('/', 1)[1]} +{int(v)}" for k, v in sorted(new.items()))
            logger.info("step %d: groups dropped: %s", state.global_step, detail)
            self._drops.update(drops)

    def on_save(self, args, state, control, **kwargs):
        logger.info(
            "step %d: checkpoint written to %s/checkpoint-%d", state.global_step, args.output_dir, state.global_step
        )
