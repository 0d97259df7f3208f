"""A bound on the TensorBoard event files a node writes with ``--report_to tensorboard``.

transformers' `TensorBoardCallback` appends to one event file per run (about 5 KB a step) and starts a directory
under ``output_dir/runs`` at every start, so a node left for months filled its disk. :class:`TensorBoardFiles` starts a
new file once the one written reaches ``max_bytes`` (the callback opens a new writer at its next log) and deletes the
oldest event files beyond the newest ``kept``, as `metrics.jsonl`'s rotation does; TensorBoard reads the files kept as
one run.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from transformers import TrainerCallback
from transformers.integrations import TensorBoardCallback

logger = logging.getLogger("sapo.node")

TENSORBOARD_MAX_BYTES = 32_000_000
"""Bytes of one event file before a new one is started (about 6,000 steps of a node's logs)."""
TENSORBOARD_FILES_KEPT = 3
"""Event files kept, the newest: with :data:`TENSORBOARD_MAX_BYTES`, at most about 96 MB."""

EVENT_FILES = "events.out.tfevents.*"


class TensorBoardFiles(TrainerCallback):
    """After each log of ``tensorboard`` (a trainer's `TensorBoardCallback`; add this callback after it), starts a new
    event file once the newest reaches ``max_bytes``, and keeps the newest ``kept`` event files.

    The files counted are those under ``output_dir/runs`` (every start's directory) when the callback writes there,
    its default; else those of its own directory only (``TENSORBOARD_LOGGING_DIR`` names a directory this node does not
    own).

    Args:
        tensorboard: the trainer's `TensorBoardCallback`.
        max_bytes: size at which the event file written is closed and a new one started (default 32 MB).
        kept: event files kept, the newest, the one being written included (default 3).
    """

    def __init__(
        self,
        tensorboard: TensorBoardCallback,
        max_bytes: int = TENSORBOARD_MAX_BYTES,
        kept: int = TENSORBOARD_FILES_KEPT,
    ):
        if max_bytes <= 0 or kept < 1:
            raise ValueError(f"TensorBoardFiles needs max_bytes > 0 and kept >= 1 (got {max_bytes}, {kept})")
        self.tensorboard = tensorboard
        self.max_bytes = max_bytes
        self.kept = kept

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Say where the event files go and how they are bounded."""
        logger.info(
            "TensorBoard: event files in %s, a new one every %d MB, the newest %d kept",
            self.tensorboard.logging_dir, self.max_bytes // 1_000_000, self.kept,
        )  # fmt: skip

    def on_log(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Start a new event file when the newest is full, and delete the oldest beyond ``kept``."""
        writer, directory = self.tensorboard.tb_writer, self.tensorboard.logging_dir
        if writer is None or directory is None:
            return
        written = event_files(Path(directory))  # at every log: the start's own directory only, one file or a few
        if not written or written[-1].stat().st_size < self.max_bytes:
            return
        files = event_files(_counted_root(Path(directory), Path(args.output_dir)))
        writer.close()
        self.tensorboard.tb_writer = None  # the callback opens a new writer, and file, at its next log
        for old in files[: max(0, len(files) - (self.kept - 1))]:  # the next file will be the newest
            old.unlink(missing_ok=True)
            _remove_if_empty(old.parent, Path(directory))
        logger.info("TensorBoard: %s reached %d bytes; a new event file is started", written[-1].name, self.max_bytes)


def event_files(root: Path) -> list[Path]:
    """TensorBoard event files under ``root``, oldest first (by modification time, then name)."""
    found = [path for path in root.rglob(EVENT_FILES) if path.is_file()]
    return sorted(found, key=lambda path: (path.stat().st_mtime, path.name))


def _counted_root(directory: Path, output_dir: Path) -> Path:
    runs = output_dir / "runs"
    return runs if directory.resolve().is_relative_to(runs.resolve()) else directory


def _remove_if_empty(directory: Path, current: Path) -> None:
    # An earlier start's directory left without event files goes; the current one stays for the next file.
    if directory.resolve() != current.resolve():
        try:
            directory.rmdir()
        except OSError:
            pass  # not empty: other files of that start
