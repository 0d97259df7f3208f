"""Trainer callbacks of a running node: progress bar, metrics.jsonl, graceful stop on signals, swarm logs."""

from __future__ import annotations

import json
import logging
import signal
import time
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm
from transformers import TrainerCallback

logger = logging.getLogger("sapo.node")


class NodeProgress(TrainerCallback):
    """One progress bar over the training steps, showing reward, peers and groups shared/taken."""

    def __init__(self) -> None:
        self.bar: tqdm | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.bar = tqdm(
                total=state.max_steps, initial=state.global_step, desc="sapo", unit="step", dynamic_ncols=True
            )

    def on_step_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.update(state.global_step - self.bar.n)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.bar is None or not logs or "sapo/local_reward" not in logs and "reward" not in logs:
            return
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


class MetricsJsonl(TrainerCallback):
    """Appends one JSON line per logging step to `metrics.jsonl`: the trainer's metrics plus swarm figures.

    Lines logged after the step training starts from (the checkpoint being resumed, or step 0 for a run
    that left no complete checkpoint) are dropped first, so the file never holds two lines for one step.
    """

    def __init__(self, path: str | Path, resume_step: int | None = None):
        self.path = Path(path)
        start = resume_step or 0
        if self.path.exists():
            kept = [line for line in self.path.read_text().splitlines() if _step_of(line) <= start]
            self.path.write_text("".join(f"{line}\n" for line in kept))

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs or "train_runtime" in logs:
            return
        record = {"step": state.global_step, "time": time.time(), **logs}
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")


def _step_of(line: str) -> float:
    try:
        return json.loads(line).get("step", float("inf"))
    except (json.JSONDecodeError, AttributeError):
        return float("inf")  # a torn last line from a crash: drop it


class GracefulStop(TrainerCallback):
    """SIGINT/SIGTERM finish the current step, write a checkpoint and stop training; a second SIGINT aborts.
    The last step of a run is checkpointed too, so every exit leaves a checkpoint to resume from."""

    def __init__(self) -> None:
        self.requested: str | None = None
        self._previous: dict[int, Any] = {}

    def install(self) -> GracefulStop:
        """Take over SIGINT and SIGTERM (main thread only)."""
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def uninstall(self) -> None:
        """Give the signals back to their previous handlers."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if self.requested is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # second Ctrl-C: abandon the step; the node still leaves the swarm
        self.requested = name
        logger.info("%s received: finishing the current step, then checkpoint and leave (Ctrl-C again to abort)", name)

    def on_step_end(self, args, state, control, **kwargs):
        if self.requested is not None:
            control.should_save = True
            control.should_training_stop = True
        elif state.global_step >= state.max_steps:
            control.should_save = True  # the last step is always resumable, whatever save_steps says


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
