"""Helpers and fixtures for tests that run sapo-node processes: tiny settings, bounded waits, metrics, and
processes (and their p2pd daemons) that are always stopped by PID."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sapo.node.report import is_evaluation_line

# Small enough for a 2-core machine: 2 groups of 2 completions per step, short completions.
TINY = [
    "--num_local", "1", "--num_external", "1", "--num_generations", "2", "--per_device_train_batch_size", "4",
    "--max_completion_length", "8", "--dataset_size", "64", "--tasks", "basic_arithmetic",
    "--sampling_strategy", "uniform", "--join_timeout", "20",
]  # fmt: skip


def _node_command(model_dir: Path, output_dir: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "sapo.node.cli",
        "--model",
        str(model_dir),
        "--output_dir",
        str(output_dir),
        *TINY,
        *extra,
    ]


def _lines(output_dir: Path) -> list[dict]:
    path = output_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _metrics(output_dir: Path) -> list[dict]:
    """The node's training lines (one per step)."""
    return [line for line in _lines(output_dir) if not is_evaluation_line(line)]


def _evaluations(output_dir: Path) -> list[dict]:
    """The node's held-out evaluation lines."""
    return [line for line in _lines(output_dir) if is_evaluation_line(line)]


def _wait(condition, timeout: float, what: str, process: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        if process is not None and process.poll() is not None:
            raise AssertionError(f"node exited with {process.returncode} while waiting for {what}")
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def _p2pd_pid(output_dir: Path) -> int | None:
    state = output_dir / "p2pd-state.json"
    return json.loads(state.read_text()).get("p2pd_pid") if state.exists() else None


def _assert_gone(pid: int | None, timeout: float = 15.0) -> None:
    if pid is None:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(") ", 1)[1].startswith("Z"):
                    return  # exited, waiting to be reaped by init
        except FileNotFoundError:
            return
        time.sleep(0.2)
    os.kill(pid, signal.SIGKILL)  # never leave it behind, but fail: the node should have stopped it
    raise AssertionError(f"p2pd {pid} outlived its node")


@pytest.fixture
def started():
    """Processes a test starts; all killed by PID at the end, whatever happened."""
    processes: list[subprocess.Popen] = []
    yield processes
    for process in processes:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)
