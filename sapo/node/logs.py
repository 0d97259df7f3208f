"""A node's logs: dated lines on stderr and in a size-rotated `node.log`, and one plain line per training step."""

from __future__ import annotations

import logging
import logging.handlers
import sys
from pathlib import Path
from typing import Any

from sapo.node.board import is_number

LOG_FILE = "node.log"
LOG_FILE_BYTES = 10 * 1024 * 1024
"""`node.log` is rotated when a line would take it past this size: it becomes `node.log.1` (the older ones move up)."""
LOG_FILE_BACKUPS = 5
"""Rotated files kept (`node.log.1` ... `node.log.5`); the oldest is deleted, so the logs never pass ~60 MiB."""

STEP_LOGGER = "sapo.node.steps"
"""The logger of the one-line-per-step record; on a terminal it goes to `node.log` only (the progress bar shows it)."""

LINE_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
DATE_FORMAT = "%Y-%m-%d %H:%M:%S"

_NOISY_LIBRARIES = ("hivemind", "transformers", "datasets", "accelerate")


class _NotSteps(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.name != STEP_LOGGER


def setup_logging(
    output_dir: Path,
    level: str = "info",
    *,
    terminal: bool | None = None,
    max_bytes: int = LOG_FILE_BYTES,
    backups: int = LOG_FILE_BACKUPS,
) -> list[logging.Handler]:
    """Send the node's logs (loggers `sapo` and `swarm`) to stderr and to `node.log` in ``output_dir``.

    Lines carry date and time. `node.log` is rotated at ``max_bytes`` keeping ``backups`` older files. With a
    ``terminal`` (default: whether stderr is one) the per-step line goes to `node.log` only, beside the progress
    bar; without one (Docker, systemd, a redirected stderr) it goes to both. Returns the handlers it added.
    """
    terminal = sys.stderr.isatty() if terminal is None else terminal
    formatter = logging.Formatter(LINE_FORMAT, DATE_FORMAT)
    root = logging.getLogger()
    root.setLevel(logging.WARNING)
    for name in ("sapo", "swarm"):
        logging.getLogger(name).setLevel(getattr(logging, level.upper(), logging.INFO))
    stderr = logging.StreamHandler(sys.stderr)
    if terminal:
        stderr.addFilter(_NotSteps())
    log_file = logging.handlers.RotatingFileHandler(
        Path(output_dir) / LOG_FILE, maxBytes=max_bytes, backupCount=backups, encoding="utf-8"
    )
    handlers: list[logging.Handler] = [stderr, log_file]
    for handler in handlers:
        handler.setFormatter(formatter)
        root.addHandler(handler)
    for noisy in _NOISY_LIBRARIES:
        logging.getLogger(noisy).setLevel(logging.ERROR)
    return handlers


def step_line(step: int, max_steps: int | None, logs: dict[str, Any], seconds: float | None) -> str:
    """One training step in words, from the trainer's log line: step, own reward (and the swarm groups' reward under
    this node's rewards), peers, swarm groups taken and filled in, seconds."""
    own = logs.get("sapo/local_reward", logs.get("reward"))
    parts = [f"step {step}" + (f"/{max_steps}" if max_steps else "")]
    reward = f"reward {_figure(own)}"
    if is_number(logs.get("sapo/external_reward")):
        reward += f" (swarm groups {_figure(logs['sapo/external_reward'])})"
    parts.append(reward)
    parts.append(f"peers {_count(logs.get('sapo/peers'))}")
    taken = f"taken {_count(logs.get('sapo/external_groups'))}"
    if is_number(logs.get("sapo/fill_ins")):
        taken += f", filled in {_count(logs['sapo/fill_ins'])}"
    parts.append(taken)
    parts.append(f"{seconds:.1f} s" if is_number(seconds) else "- s")
    return "; ".join(parts)


def _figure(value: Any) -> str:
    return f"{value:.3f}" if is_number(value) else "-"


def _count(value: Any) -> str:
    return f"{value:g}" if is_number(value) else "-"
