"""A node's TensorBoard event files stay bounded: transformers' own `TensorBoardCallback` writing real event files
through TensorBoard's `SummaryWriter`, read back with TensorBoard's own reader."""

from __future__ import annotations

from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from transformers import TrainerControl, TrainerState, TrainingArguments
from transformers.integrations import TensorBoardCallback

from sapo.node.tensorboard_files import TensorBoardFiles, event_files


def _start(output_dir: Path, name: str, max_bytes: int, kept: int) -> tuple[TensorBoardCallback, TensorBoardFiles]:
    """One start of a node: its `TensorBoardCallback` writing under ``output_dir/runs/name``, and the bound."""
    args = TrainingArguments(output_dir=str(output_dir), report_to=[])
    tensorboard = TensorBoardCallback()
    tensorboard.logging_dir = str(output_dir / "runs" / name)
    tensorboard.on_train_begin(args, TrainerState(), TrainerControl())
    return tensorboard, TensorBoardFiles(tensorboard, max_bytes=max_bytes, kept=kept)


def _log(callbacks: tuple[TensorBoardCallback, TensorBoardFiles], output_dir: Path, steps: range) -> None:
    """The trainer's logs of ``steps``, each through both callbacks in the trainer's order."""
    args = TrainingArguments(output_dir=str(output_dir), report_to=[])
    for step in steps:
        state = TrainerState(global_step=step)
        for callback in callbacks:
            callback.on_log(args, state, TrainerControl(), logs={"reward": step / 1000, "loss": 1.0})


def _steps(run_dir: Path) -> list[int]:
    """The steps of the `train/reward` scalar TensorBoard reads from ``run_dir``'s event files."""
    events = EventAccumulator(str(run_dir))
    events.Reload()
    return [event.step for event in events.Scalars("train/reward")]


def test_event_files_are_started_anew_when_full_and_the_oldest_deleted_across_restarts(tmp_path):
    first = _start(tmp_path, "first", max_bytes=4000, kept=3)
    _log(first, tmp_path, range(1, 101))
    first[0].on_train_end(None, None, None)
    second = _start(tmp_path, "second", max_bytes=4000, kept=3)  # a restart: a directory of its own
    _log(second, tmp_path, range(101, 301))
    files = event_files(tmp_path / "runs")
    assert 2 <= len(files) <= 3  # the newest three at most (the one being written included)
    assert all(path.stat().st_size < 4000 + 1000 for path in files)  # each closed past the bound by one log at most
    assert not (tmp_path / "runs" / "first").exists()  # the earlier start's files deleted, its directory with them
    steps = _steps(tmp_path / "runs" / "second")
    assert steps[-1] == 300 and steps == list(range(steps[0], 301))  # the newest steps, none missing
    assert steps[0] > 101  # the oldest were deleted


def test_files_beside_a_directory_the_node_does_not_own_are_left_alone(tmp_path):
    """With TENSORBOARD_LOGGING_DIR naming another directory, only the node's own directory's files count."""
    shared = tmp_path / "shared"
    (shared / "someone_else").mkdir(parents=True)
    theirs = shared / "someone_else" / "events.out.tfevents.1.host.1.0"
    theirs.write_bytes(b"x" * 10_000)
    args = TrainingArguments(output_dir=str(tmp_path / "node"), report_to=[])
    tensorboard = TensorBoardCallback()
    tensorboard.logging_dir = str(shared / "mine")
    tensorboard.on_train_begin(args, TrainerState(), TrainerControl())
    _log((tensorboard, TensorBoardFiles(tensorboard, max_bytes=2000, kept=1)), tmp_path / "node", range(1, 200))
    assert theirs.stat().st_size == 10_000
    assert len(event_files(shared / "mine")) == 1 and _steps(shared / "mine")[-1] == 199
