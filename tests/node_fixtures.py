"""Helpers and fixtures for tests that run sapo-node processes: tiny settings, bounded waits, metrics, and
processes (and their p2pd daemons) that are always stopped by PID."""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from benchmarks.soak import TINY_NODE, tiny_node_command
from sapo.node.callbacks import FAULT_PAUSE_IN_OPTIMIZER_STEP
from sapo.node.report import is_evaluation_line
from sapo.node.warm_start import WarmProcess, WarmStarter, start_node_process
from sapo.trainer import FAULT_PAUSE_BEFORE_MARKER
from swarm.daemon import ProcessIdentity

# Small enough for a 2-core machine: 2 groups of 2 completions per step, short completions.
TINY = [*TINY_NODE, "--join_timeout", "20"]
# No held-out evaluation (a node evaluates at step 0, or at the step it resumed from, and every 10 steps otherwise):
# for tests that assert nothing about it.
NO_EVALUATION = ["--eval_on_start", "false", "--eval_steps", "1000"]
PACED = ["--min_step_seconds", "2"]
"""For nodes that run while a test waits on something else (a join, a cut link): their steps need not be fast."""


def _node_command(model_dir: Path, output_dir: Path, *extra: str) -> list[str]:
    return tiny_node_command(model_dir, output_dir, "--join_timeout", "20", *extra)


# Made at import, before any test changes the environment: nodes meant for this worker's environment start warm
# (the fault-injection switches are read when the fault's moment comes, not at import). Shared: the local swarms and
# benchmarks the tests start fork their nodes from this server too. Started now, while the worker collects.
STARTER = WarmStarter(varying=frozenset({FAULT_PAUSE_IN_OPTIMIZER_STEP, FAULT_PAUSE_BEFORE_MARKER}), share=True)
STARTER.prepare()


def start_node(command: Sequence, *, warm: bool = True, **popen_kwargs) -> subprocess.Popen | WarmProcess:
    """Start a `sapo-node` command: forked warm from this worker's server (sapo.node.warm_start) where the command and
    its environment allow, for tests whose subject is what the node does, not how its process starts (``warm=False``
    for those); cold otherwise. ``popen_kwargs``: stdout, stderr, env, cwd, start_new_session."""
    return start_node_process(command, starter=STARTER if warm else None, **popen_kwargs)


def run_node(command: Sequence, *, timeout: float, warm: bool = True, **popen_kwargs) -> subprocess.CompletedProcess:
    """Run a `sapo-node` command to its end (:func:`start_node`) and return its exit code and output (text), as
    ``subprocess.run(command, capture_output=True, text=True, timeout=timeout)`` does; killed after ``timeout``."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        process = start_node(command, warm=warm, stdout=out, stderr=err, **popen_kwargs)
        try:
            code = process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise
        out.seek(0)
        err.seek(0)
        text = [stream.read().decode(errors="replace") for stream in (out, err)]
    return subprocess.CompletedProcess(list(command), code, *text)


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


def _p2pd(output_dir: Path) -> ProcessIdentity | None:
    """The running node's p2pd daemon (pid and start time), from the state file the node writes."""
    state = output_dir / "p2pd-state.json"
    if not state.exists():
        return None
    recorded = json.loads(state.read_text())
    return ProcessIdentity(recorded["p2pd_pid"], recorded["p2pd_start"])


def _assert_gone(daemon: ProcessIdentity | None, timeout: float = 15.0) -> None:
    """Wait until ``daemon`` is gone (a zombie counts as gone); kill it and fail if it outlives ``timeout``."""
    if daemon is None:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not daemon.running():
            return  # exited (perhaps waiting to be reaped by init); its pid may already be another process's
        time.sleep(0.2)
    daemon.kill()  # never leave it behind, but fail: the node should have stopped it
    raise AssertionError(f"p2pd {daemon.pid} outlived its node")


@pytest.fixture
def started():
    """Processes a test starts; all killed by PID at the end, whatever happened."""
    processes: list[subprocess.Popen] = []
    yield processes
    for process in processes:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)
