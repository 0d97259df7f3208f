"""A stop request (SIGTERM, as `docker stop` and systemd send) is honoured within `docker stop`'s default grace (10 s)
in every phase of a real node process: while it imports its libraries, joins the swarm, waits for peers, evaluates
held-out questions, generates, takes its optimizer step and writes a checkpoint. Each time the node exits 0, stops its
p2pd, keeps the last completed step resumable and has flushed its log through the line saying it left."""
# ruff: noqa: F811  (the started fixture imported from tests.node_fixtures is redefined as an argument)

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from sapo.checkpoints import COMPLETE_MARKER, checkpoints, latest_complete_checkpoint
from sapo.node.callbacks import FAULT_PAUSE_IN_OPTIMIZER_STEP, RESTING
from sapo.trainer import FAULT_PAUSE_BEFORE_MARKER
from tests.node_fixtures import (  # noqa: F401
    NO_EVALUATION,
    _assert_gone,
    _evaluations,
    _metrics,
    _node_command,
    _p2pd,
    _wait,
    start_node,
    started,
)

STOP_WITHIN_S = 10.0
# Long enough that the node is surely still in the phase when the signal lands (a tiny random model rarely ends a
# completion early), short enough for a 2-core machine.
LONG_COMPLETIONS = ["--max_completion_length", "1500"]


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


def _stop(node: subprocess.Popen, out: Path, log: Path, joined: bool = True) -> str:
    """SIGTERM `node`; assert it exits 0 within the bound having stopped its p2pd and, once it had ``joined`` the
    swarm, said it left (the last line of its node.log: the log is flushed to its end)."""
    p2pd = _p2pd(out)
    sent = time.monotonic()
    node.send_signal(signal.SIGTERM)
    try:
        code = node.wait(timeout=STOP_WITHIN_S)
    except subprocess.TimeoutExpired:
        tail = log.read_text()[-3000:]
        raise AssertionError(f"node still running {STOP_WITHIN_S} s after SIGTERM:\n{tail}") from None
    took = time.monotonic() - sent
    text = log.read_text()
    assert code == 0, text[-3000:]
    assert "SIGTERM received" in text, text[-3000:]
    if joined:
        assert "leaving the swarm" in text, text[-3000:]
        assert re.search(r"peer \w+ left swarm", (out / "node.log").read_text().splitlines()[-1]), text[-3000:]
    _assert_gone(p2pd)
    print(f"exited {took:.1f} s after SIGTERM")
    return text


def _start(
    out: Path, log: Path, model: Path, started: list, *extra: str, env: dict | None = None, warm: bool = True
) -> subprocess.Popen:
    with open(log, "w") as stderr:
        node = start_node(
            _node_command(model, out, "--max_steps", "1000", "--save_steps", "1000", *extra),
            stdout=subprocess.DEVNULL, stderr=stderr, env={**os.environ, **(env or {})}, warm=warm,
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


def test_sigterm_while_resting_between_paced_steps_exits_within_seconds(tmp_path, tiny_model_a, started):
    """`--min_step_seconds`: a stop during the rest before the next step ends it at once, step 1 kept."""
    out, log = tmp_path / "node", tmp_path / "node.err"
    node = _start(out, log, tiny_model_a, started, *NO_EVALUATION, "--min_step_seconds", "600")
    _wait_for_phase(out, RESTING, node)  # after step 1, resting out the 600 s
    text = _stop(node, out, log)  # within seconds all the same
    assert "pacing: each step starts at least 600 s after the previous one began" in text
    assert "abandoning step 2" in text
    assert [m["step"] for m in _metrics(out)] == [1]
    assert latest_complete_checkpoint(out).name == "checkpoint-1"


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


def test_sigterm_while_starting_and_while_joining_exits_within_seconds(tmp_path, tiny_model_a, started):
    # 1. While it imports its libraries (before the node's own handlers): exit 0 at once, nothing written.
    out, log = tmp_path / "starting", tmp_path / "starting.err"
    node = _start(out, log, tiny_model_a, started, warm=False)  # its subject is the start: a cold process
    time.sleep(1.0)  # the interpreter is up; torch and transformers take seconds more to import
    assert node.poll() is None and not (out / "status.json").exists()
    _stop(node, out, log, joined=False)
    assert "received while starting" in log.read_text()
    assert not (out / "node.log").exists()

    # 2. While it joins through a peer that never answers (nothing listens on that port): the join is abandoned, its
    # p2pd stopped, and no swarm is started alone.
    out, log = tmp_path / "joining", tmp_path / "joining.err"
    silent = "/ip4/127.0.0.1/tcp/9/p2p/QmXv6bGuuUmBVb5RZtN4zGbiMJ2NjuZfD4uBFT5GfRmHZL"
    node = _start(out, log, tiny_model_a, started, "--initial_peers", silent, "--join_timeout", "120")
    _wait_for_phase(out, "joining swarm", node)
    time.sleep(3.0)  # its p2pd started, dialing the silent peer (retried until join_timeout)
    text = _stop(node, out, log, joined=False)
    assert "abandoning joining the swarm" in text and "training alone" not in text
    assert not (out / "address.txt").exists()
    assert not _daemons_with_identity(out / "identity.key")  # the p2pd it had started is gone


def _daemons_with_identity(identity: Path) -> list[int]:
    """p2pd processes started with ``identity`` (its -id= argument): a node's, whether or not it recorded the pid."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        if argv and argv[0].endswith(b"p2pd") and f"-id={identity}".encode() in argv:
            found.append(int(entry.name))
    return found


def test_sigterm_while_a_checkpoint_is_written_lets_it_complete(tmp_path, tiny_model_a, started):
    """The save in progress finishes (it is what the stop keeps), then the node leaves, all within the grace."""
    out, log = tmp_path / "node", tmp_path / "node.err"
    pause = {FAULT_PAUSE_BEFORE_MARKER: "3"}  # between the checkpoint's files and its completion marker
    node = _start(out, log, tiny_model_a, started, "--save_steps", "1", *NO_EVALUATION, env=pause)
    deadline = time.monotonic() + 300
    while not (writing := [path for _, path, complete in checkpoints(out) if not complete]):
        assert time.monotonic() < deadline and node.poll() is None, "never saw a checkpoint being written"
        time.sleep(0.01)
    _stop(node, out, log)
    assert (writing[0] / COMPLETE_MARKER).is_file()
    assert latest_complete_checkpoint(out) == writing[0]
    assert max(m["step"] for m in _metrics(out)) == int(writing[0].name.split("-")[1])


def test_exit_process_runs_the_exit_handlers_and_is_bounded(tmp_path):
    """The node's last act: exit handlers run and output flushed, with the given code, and a thread or handler that
    never ends does not keep the process (it exits at the deadline all the same)."""
    script = (
        "import atexit, sys, threading, time\n"
        "from sapo.node.teardown import exit_process\n"
        f"atexit.register(lambda: open({str(tmp_path / 'ran')!r}, 'w').write('yes'))\n"
        "sys.stdout.write('unflushed line')\n"
        "if sys.argv[1] == 'stuck':\n"
        "    threading.Thread(target=time.sleep, args=(600,)).start()  # not a daemon: a normal exit would wait\n"
        "    atexit.register(time.sleep, 600)\n"
        "exit_process(3, timeout=2.0)\n"
    )
    for case in ("clean", "stuck"):
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-c", script, case], capture_output=True, text=True, timeout=60)
        assert done.returncode == 3 and done.stdout == "unflushed line", (case, done.stderr)
        assert time.monotonic() - started < STOP_WITHIN_S
        if case == "clean":
            assert (tmp_path / "ran").read_text() == "yes"
        else:
            assert "exiting without them" in done.stderr
