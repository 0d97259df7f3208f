"""Complete-checkpoint markers: a checkpoint counts only once its marker is written, last and atomically.

Hugging Face's Trainer writes `checkpoint-N/` file by file, so a node killed mid-save leaves a directory
that looks like a checkpoint but is not one. `SAPOTrainer` writes `sapo-complete.json` into each checkpoint
after everything else; resuming takes the newest checkpoint that has it and sets the others aside.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
from pathlib import Path

logger = logging.getLogger(__name__)

COMPLETE_MARKER = "sapo-complete.json"
TOTALS_FILE = "sapo-totals.json"
"""Beside each checkpoint's files: the run's cumulative counts at that step (`sapo/total/...`), which a resumed run
counts on from."""
_CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")


def write_atomically(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file, fsync and rename, so readers see all or nothing."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def mark_complete(checkpoint_dir: str | Path, step: int) -> None:
    """Declare ``checkpoint_dir`` complete; call only after every file of the checkpoint is written."""
    write_atomically(Path(checkpoint_dir) / COMPLETE_MARKER, json.dumps({"step": step, "time": time.time()}))


def write_totals(checkpoint_dir: str | Path, totals: dict) -> None:
    """Keep ``totals`` (JSON-ready) in ``checkpoint_dir`` (:data:`TOTALS_FILE`)."""
    write_atomically(Path(checkpoint_dir) / TOTALS_FILE, json.dumps(totals, sort_keys=True))


def read_totals(checkpoint_dir: str | Path) -> dict:
    """The totals kept in ``checkpoint_dir``; empty for a checkpoint without them (an earlier version's) or
    unreadable ones."""
    try:
        saved = json.loads((Path(checkpoint_dir) / TOTALS_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return saved if isinstance(saved, dict) else {}


def checkpoints(output_dir: str | Path) -> list[tuple[int, Path, bool]]:
    """All `checkpoint-N` directories as (step, path, complete), oldest first."""
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return []
    found = []
    for child in output_dir.iterdir():
        match = _CHECKPOINT_RE.match(child.name)
        if match and child.is_dir():
            found.append((int(match.group(1)), child, (child / COMPLETE_MARKER).is_file()))
    return sorted(found)


def latest_complete_checkpoint(output_dir: str | Path) -> Path | None:
    """The newest checkpoint whose completion marker exists, or None."""
    complete = [path for _, path, done in checkpoints(output_dir) if done]
    return complete[-1] if complete else None


INCOMPLETE_KEPT = 3
"""Half-written checkpoints kept in `incomplete/` (for a look at what a kill left), the newest; older ones are deleted,
so a node killed mid-save again and again over months does not fill its disk."""


def set_aside_incomplete(output_dir: str | Path) -> list[Path]:
    """Move checkpoints without a marker to `incomplete/` so nothing resumes from or rotates onto them, and keep the
    newest :data:`INCOMPLETE_KEPT` there."""
    moved = []
    for step, path, done in checkpoints(output_dir):
        if done:
            continue
        target = Path(output_dir) / "incomplete" / f"{path.name}-{time.time_ns()}"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(path), str(target))
        logger.warning(
            "checkpoint of step %d was never completed (the node stopped mid-save); moved to %s", step, target
        )
        moved.append(target)
    _delete_oldest_incomplete(Path(output_dir) / "incomplete")
    return moved


def _delete_oldest_incomplete(folder: Path) -> None:
    if not folder.is_dir():
        return
    set_aside = sorted(folder.iterdir(), key=lambda path: (path.stat().st_mtime, path.name))
    for path in set_aside[: max(0, len(set_aside) - INCOMPLETE_KEPT)]:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
        logger.info("deleted %s: only the newest %d half-written checkpoints are kept", path, INCOMPLETE_KEPT)
