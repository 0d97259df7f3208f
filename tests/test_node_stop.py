"""A stop request (SIGTERM, as `docker stop` and systemd send) is honoured within seconds in every phase of a real node
process: while it waits for peers, during a held-out evaluation, during generation and during the optimizer step.
Each time the node says it leaves the swarm, exits 0, stops its p2pd, and keeps the last completed step resumable."""
# ruff: noqa: F811  (the started fixture imported from tests.node_fixtures is redefined as an argument)

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from sapo.checkpoints import latest_complete_checkpoint
from sapo.node.callbacks import FAULT_PAUSE_IN_OPTIMIZER_STEP
from tests.node_fixtures import _assert_gone, _evaluations, _metrics, _node_command, _p2pd, _wait, started  # noqa: F401

STOP_WITHIN_S = 10.0
# Long enough that the node is surely still in the phase when the signal lands (a tiny random model rarely ends a
# completion early), short enough for a 2-core machine.
LONG_COMPLETIONS = ["--max_completion_length", "1500"]
NO_EVALUATION = ["--eval_on_start", "false", "--eval_steps", "1000"]


def _phase(out: Path) -> str | None:
    try:
        return json.loads((out / "status.json").read_text()).get("phase")
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _wait_for_phase(out: Path, phase: str, node: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _phase(out) == phase:
            return
        if node.poll() is not None:
            raise AssertionError(f"node exited with {node.returncode} while waiting for phase {phase!r}")
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for phase {phase!r} (last: {_phase(out)!r})")


def _stop(node: subprocess.Popen, out: Path, log: Path) -> str:
    """SIGTERM `node`; assert it exits 0 within the bound, said it leaves the swarm, and stopped its p2pd."""
    p2pd = _p2pd(out)
    sent = time.monotonic()
    node.send_signal(signal.SIGTERM)
    try:
        code = node.wait(timeout=STOP_WITHIN_S)
    except subprocess.TimeoutExpired:
        tail = log.read_text()[-3000:]
        raise AssertionError(f"node still running {STOP_WITHIN_S} s after SIGTERM:\n{tail}") from None
    text = log.read_text()
    assert code == 0, text[-3000:]
    assert "SIGTERM received" in text and "leaving the swarm" in text, text[-3000:]
    _assert_gone(p2pd)
    print(f"exited {time.monotonic() - sent:.1f} s after SIGTERM")
    return text


def _start(out: Path, log: Path, model: Path, started: list, *extra: str, env: dict | None = None) -> subprocess.Popen:
    node = subprocess.Popen(
        _node_command(model, out, "--max_steps", "1000", "--save_steps", "1000", *extra),
        stdout=subprocess.DEVNULL, stderr=open(log, "w"), env={**os.environ, **(env or {})},
    )  # fmt: skip
    started.append(node)
    return node


def test_sigterm_while_waiting_for_peers_exits_within_seconds(tmp_path, tiny_model_a, started):
    out, log = tmp_path / "node", tmp_path / "node.err"
    node = _start(out, log, tiny_model_a, started, "--wait_for_peers", "1", "--wait_for_peers_timeout", "600")
    _wait(lambda: "waiting up to" in log.read_text(), 300, "the wait for peers", node)
    text = _stop(node, out, log)
    assert "abandoning waiting for peers" in text
    assert latest_complete_checkpoint(out) is None and not _metrics(out)


def test_sigterm_in_generation_optimizer_step_and_evaluation_keeps_the_last_completed_step(
    tmp_path, tiny_model_a, started
):
    out = tmp_path / "node"

    # 1. During generation of step 2: abandoned; step 1, never checkpointed by save_steps, is checkpointed on leaving.
    log = tmp_path / "run1.err"
    node = _start(out, log, tiny_model_a, started, *NO_EVALUATION, *LONG_COMPLETIONS)
    _wait(lambda: len(_metrics(out)) >= 1, 300, "step 1", node)
    _wait_for_phase(out, "generating", node)
    text = _stop(node, out, log)
    assert "abandoning generating" in text
    done = max(m["step"] for m in _metrics(out))
    assert latest_complete_checkpoint(out).name == f"checkpoint-{done}"

    # 2. During the optimizer step (held there by a pause): the step finishes and is checkpointed.
    log = tmp_path / "run2.err"
    pause = {FAULT_PAUSE_IN_OPTIMIZER_STEP: "4"}
    node = _start(out, log, tiny_model_a, started, *NO_EVALUATION, env=pause)
    _wait(lambda: "pausing 4 s in the optimizer step" in log.read_text(), 300, "an optimizer step", node)
    text = _stop(node, out, log)
    assert f"resuming from {out / f'checkpoint-{done}'}" in text
    assert "finishing the optimizer step" in text
    steps = [m["step"] for m in _metrics(out)]
    assert steps == sorted(set(steps)) and steps[-1] == done + 1  # the step in its optimizer step was completed
    assert latest_complete_checkpoint(out).name == f"checkpoint-{done + 1}"

    # 3. During the held-out evaluation a restarted node runs first: abandoned, nothing logged for it, and the
    # checkpoint it resumed from is still the newest.
    log = tmp_path / "run3.err"
    node = _start(out, log, tiny_model_a, started, "--eval_questions", "256", *LONG_COMPLETIONS)
    _wait_for_phase(out, "evaluating held-out questions", node)
    text = _stop(node, out, log)
    assert f"resuming from {out / f'checkpoint-{done + 1}'}" in text
    assert "abandoning evaluating held-out questions" in text
    assert not _evaluations(out)
    assert latest_complete_checkpoint(out).name == f"checkpoint-{done + 1}"
