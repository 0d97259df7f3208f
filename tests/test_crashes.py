"""kill -9 a node at random moments, and in the middle of a checkpoint write (every time: the node pauses before
the completion marker): every restart resumes from the newest complete checkpoint, never from a half-written one,
no step is logged twice, the run ends with its LoRA adapters saved, and a restart after the last checkpoint trains
nothing more."""
# ruff: noqa: F811  (the started fixture imported from tests.node_fixtures is redefined as an argument)

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import torch

from sapo.checkpoints import COMPLETE_MARKER, INCOMPLETE_KEPT, checkpoints, latest_complete_checkpoint
from sapo.trainer import FAULT_PAUSE_BEFORE_MARKER
from tests.node_fixtures import (  # noqa: F401
    NO_EVALUATION,
    _assert_gone,
    _metrics,
    _node_command,
    _p2pd,
    _wait,
    run_node,
    start_node,
    started,
)


def _last_step(out: Path) -> int:
    rows = _metrics(out)
    return max((r["step"] for r in rows), default=0)


def _logged_since(out: Path, since: float) -> bool:
    return any(r.get("time", 0.0) >= since for r in _metrics(out))


def _step_of(checkpoint: Path | None) -> int:
    return int(checkpoint.name.split("-")[1]) if checkpoint is not None else 0


def _catch_a_checkpoint_write(out: Path, node: subprocess.Popen, timeout: float = 120) -> Path:
    """Poll until a checkpoint directory exists without its completion marker; return it (the node is mid-save)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and node.poll() is None:
        for _, path, complete in checkpoints(out):
            if not complete:
                return path
        time.sleep(0.002)
    raise AssertionError("never saw a checkpoint being written")


def test_kill9_at_random_moments_resumes_from_the_newest_complete_checkpoint(tmp_path, tiny_model_a, started):
    out = tmp_path / "node"
    rng = random.Random(7)
    expected_resume: Path | None = None
    killed = False
    caught_mid_write = 0
    # Three lives: a random kill between two mid-checkpoint kills, so each kind of kill is resumed from (the final
    # run resumes from the second mid-checkpoint kill) and two half-written checkpoints are set aside.
    for attempt, moment in enumerate(["mid_checkpoint", "random", "mid_checkpoint"]):
        log = tmp_path / f"attempt{attempt}.log"
        # Mid-checkpoint: the node waits 60 s between a checkpoint's files and its marker, so the kill lands there.
        pause = {FAULT_PAUSE_BEFORE_MARKER: "60"} if moment == "mid_checkpoint" else {}
        since = time.time()
        node = start_node(
            _node_command(tiny_model_a, out, "--max_steps", "1000", "--save_steps", "1", *NO_EVALUATION),
            stdout=subprocess.DEVNULL, stderr=open(log, "w"), env={**os.environ, **pause},
        )  # fmt: skip
        started.append(node)
        # A step this life logged: not a step number past the file's last, which the restart first drops when that
        # step's checkpoint was the one killed mid-write (then the same number comes again, and the next one only
        # after the checkpoint's 60 s pause).
        _wait(lambda since=since: _logged_since(out, since), 300, "a new step", node)
        assert (out / "address.txt").exists()  # the swarm address others join through, written before training
        if expected_resume is not None:  # the previous kill's newest complete checkpoint, nothing else
            assert f"resuming from {expected_resume}" in log.read_text()
        elif killed:  # killed while writing its first checkpoint: it starts over, from nothing
            assert "resuming from" not in log.read_text()
        if moment == "mid_checkpoint":
            half_written = _catch_a_checkpoint_write(out, node)
        else:
            time.sleep(rng.uniform(0.0, 6.0))  # generation, scoring, a publish, a save: wherever it falls
        p2pd = _p2pd(out)
        node.send_signal(signal.SIGKILL)
        node.wait(timeout=30)
        killed = True
        _assert_gone(p2pd)
        expected_resume = latest_complete_checkpoint(out)
        left_half_written = [path for _, path, complete in checkpoints(out) if not complete]
        caught_mid_write += len(left_half_written)  # a random kill may land in a save too
        if moment == "mid_checkpoint":
            assert not (half_written / COMPLETE_MARKER).exists() and expected_resume != half_written
        assert _last_step(out) - _step_of(expected_resume) <= 1  # at most one step lost

    assert expected_resume is not None  # three lives of at least one step each left a complete checkpoint
    resumed_step = _step_of(expected_resume)
    final = run_node(
        _node_command(tiny_model_a, out, "--max_steps", str(resumed_step + 2), "--save_steps", "1", *NO_EVALUATION),
        timeout=600,
    )  # fmt: skip
    assert final.returncode == 0, final.stderr[-3000:]
    assert f"resuming from {expected_resume}" in final.stderr, final.stderr[:3000]
    assert (out / "final" / "adapter_config.json").exists()  # a node trains LoRA adapters by default
    # The optimizer state was restored with the weights: Adam has counted every step since the first life (a resume
    # that loaded only the weights would count 2 here).
    optimizer = torch.load(out / f"checkpoint-{resumed_step + 2}" / "optimizer.pt", weights_only=True)
    assert {int(state["step"]) for state in optimizer["state"].values()} == {resumed_step + 2}
    assert all(complete for _, _, complete in checkpoints(out))  # half-written ones were set aside
    set_aside = list((out / "incomplete").iterdir()) if (out / "incomplete").exists() else []
    assert caught_mid_write >= 2  # both mid-checkpoint kills left one
    # each checkpoint a kill left half-written was set aside at the next start, and the newest of them are kept
    logs = "".join((tmp_path / f"attempt{n}.log").read_text() for n in (1, 2)) + final.stderr
    assert logs.count("was never completed (the node stopped mid-save); moved to") == caught_mid_write
    assert len(set_aside) == min(caught_mid_write, INCOMPLETE_KEPT)
    steps = [m["step"] for m in _metrics(out)]
    assert steps == sorted(set(steps)) and steps[-1] == resumed_step + 2  # no step logged twice across four lives
    _assert_gone(_p2pd(out))

    # killed after its last checkpoint (in its final evaluation, say), the node finishes without training more
    again = run_node(
        _node_command(tiny_model_a, out, "--max_steps", str(resumed_step + 2), "--save_steps", "1", *NO_EVALUATION),
        timeout=600,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    assert "nothing left to train" in again.stderr
    assert max(m["step"] for m in _metrics(out)) == resumed_step + 2
    assert latest_complete_checkpoint(out).name == f"checkpoint-{resumed_step + 2}"
    _assert_gone(_p2pd(out))


def test_a_restart_skips_the_evaluation_it_already_did_and_counts_its_totals_on(tmp_path, tiny_model_a):
    from tests.node_fixtures import _evaluations

    out = tmp_path / "node"
    lives = []
    for max_steps in (2, 4):  # the second life resumes from checkpoint-2, evaluated already by the first
        result = run_node(
            _node_command(tiny_model_a, out, "--max_steps", str(max_steps), "--save_steps", "2", "--eval_steps", "10",
                          "--eval_questions", "2", "--status_port", "none"),
            timeout=600,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
        lives.append(result.stderr)
    assert "resuming from" in lives[1] and "step 2's held-out evaluation is in metrics.jsonl already" in lives[1]
    assert [e["step"] for e in _evaluations(out)] == [0, 2, 4]  # step 2 evaluated once, by the first life
    held_out_steps = [json.loads(line)["step"] for line in (out / "held_out.jsonl").read_text().splitlines()]
    assert held_out_steps == [0, 2, 4]
    fill_ins = [m["sapo/total/fill_ins"] for m in _metrics(out)]  # alone: one external slot filled in per step
    published = [m["sapo/total/published_groups"] for m in _metrics(out)]  # two groups of this node per step
    assert fill_ins == [1, 2, 3, 4] and published == [2, 4, 6, 8]  # counted on from the checkpoint, not from 0
    _assert_gone(_p2pd(out))


def test_only_the_newest_half_written_checkpoints_are_kept_aside(tmp_path):
    """A node killed mid-save at every start over months left a half-written checkpoint in `incomplete/` each time,
    for good; the newest `INCOMPLETE_KEPT` are kept, a complete checkpoint is never touched."""
    from sapo.checkpoints import set_aside_incomplete

    (tmp_path / "checkpoint-1").mkdir()
    (tmp_path / "checkpoint-1" / COMPLETE_MARKER).write_text("{}")
    for life in range(INCOMPLETE_KEPT + 3):  # each start finds the checkpoint its kill left half-written
        half = tmp_path / f"checkpoint-{life + 2}"
        half.mkdir()
        (half / "adapter_model.safetensors").write_bytes(b"x" * 100)
        os.utime(half, (1_800_000_000 + life, 1_800_000_000 + life))  # written at its life's time
        moved = set_aside_incomplete(tmp_path)
        assert [path.name.rsplit("-", 1)[0] for path in moved] == [half.name]
    kept = sorted(path.name.rsplit("-", 1)[0] for path in (tmp_path / "incomplete").iterdir())
    assert kept == sorted(f"checkpoint-{life + 2}" for life in range(3, INCOMPLETE_KEPT + 3))  # the newest
    assert [(step, done) for step, _, done in checkpoints(tmp_path)] == [(1, True)]
