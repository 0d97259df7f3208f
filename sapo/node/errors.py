"""The errors a node stops with, each with its exit code: what the user can fix, a join that failed, a limit; and
how a refusal is told (:func:`refuse`)."""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

logger = logging.getLogger("sapo.node")


class NodeError(Exception):
    """A problem the user can fix (bad address, missing model, unknown task...): one line, with the fix.

    ``recorded``: node.log and status.json say it already (the node logged it as it stopped)."""

    exit_code = 2

    def __init__(self, message: str, recorded: bool = False):
        super().__init__(message)
        self.recorded = recorded


class ErrorLimitReached(NodeError):
    """Training stopped: a reward function or a task source kept raising past its limit."""

    exit_code = 4


class JoinError(NodeError):
    """No initial peer answered."""

    exit_code = 3


def refuse(error: NodeError, output_dir: str | Path | None, create: bool = True) -> int:
    """Tell a refusal: one line on stderr and, where the node's output directory is known, an ERROR line in its
    node.log and `stopped: error` in its status.json (with the reason under `stopped`), so that an operator who
    reads those (a container's volume, the status line of local-swarm) sees why the node is not running. With
    ``create`` False (a guess at the directory, before the command line parsed) only a directory that exists gets
    them. Returns the error's exit code."""
    from sapo.node.logs import DATE_FORMAT, LOG_FILE
    from sapo.node.status import read_status, write_status

    message = " ".join(str(error).split())  # one line, whatever the message held
    print(f"sapo-node: error: {message}", file=sys.stderr, flush=True)
    if output_dir is None or error.recorded or not (create or Path(output_dir).is_dir()):
        return error.exit_code
    try:
        folder = Path(output_dir)
        folder.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime(DATE_FORMAT)
        with open(folder / LOG_FILE, "a", encoding="utf-8") as log:
            log.write(f"{stamp} ERROR {logger.name}: refused to start: {message}\n")
        previous = read_status(folder)
        extra = {k: v for k, v in previous.items() if k not in ("phase", "step", "time", "stopped")}
        write_status(folder, "stopped: error", int(previous.get("step") or 0), stopped=message, **extra)
    except OSError as e:  # an output directory that cannot be written: stderr said it all
        print(f"sapo-node: error: could not record it in {output_dir}: {e}", file=sys.stderr)
    return error.exit_code
