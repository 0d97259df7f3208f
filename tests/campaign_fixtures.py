"""Synthetic sapo_table run directories for the campaign report's tests: a finished run's files, no training."""

from __future__ import annotations

import json
from pathlib import Path

REGISTERED = "d74d75596c83a0f8acd5fb1a775de83445212ef5"  # the node code both experiments run on
OTHER_CODE = "882238b96b9fffa62c0c4eb1ea4bbedb5d7719b2"  # before the group log: other node code
TASKS = ["basic_arithmetic", "count_bits", "chain_sum"]
QUESTION_TASKS = TASKS * 3  # 9 questions, three of each task


def group_line(step, origin, task, sender, outcome, rewards, rescue=False, model="default", group="g"):
    finite = [r for r in rewards if r is not None]
    return {"step": step, "origin": origin, "group_id": group, "task": task, "sender": sender, "model": model,
            "rewards": rewards, "success": any(r >= 1.0 for r in finite), "spread": len(set(finite)) > 1,
            "outcome": outcome, "age_seconds": 1.0, "step_lag": 1, "rescue": rescue, "time": 1.0}  # fmt: skip


def write_run(run: Path, outcomes: list[dict[int, list[int]]], identity: dict, commit=REGISTERED, *, local=2,
               node_runs: list[dict] | None = None, complete=True, fill=0.0, step_time=10.0,
               cpus: list[str] | None = None) -> Path:  # fmt: skip
    """A finished sapo_table run: per node metrics (60 training steps, evaluations at 0 and 60), held-out outcomes,
    node-run.json, a group log with its own groups; plus what an archive must leave behind. ``cpus``: the CPU models
    its marker records (None: a marker from before sapo_table recorded them)."""
    for node, by_step in enumerate(outcomes):
        folder = run / f"node-{node}"
        (folder / "checkpoint-60").mkdir(parents=True)
        (folder / "checkpoint-60" / "model.safetensors").write_bytes(b"weights")
        (folder / "final").mkdir()
        (folder / "identity.key").write_bytes(b"private")
        lines = []
        for step in range(61):
            if step in by_step:
                solved = by_step[step]
                lines.append({"step": step, "eval/pass@1": sum(solved) / 9, "eval/pass@1_se": 0.1, "eval/questions": 9})
            if step:
                lines.append({"step": step, "step_time": step_time, "sapo/time/generation": 6.0, "sapo/fill_ins": fill,
                              "sapo/local_reward": 0.01 * step})  # fmt: skip
        (folder / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
        held_out = [{"step": step, "eval": "eval", "questions": [
            {"task": QUESTION_TASKS[q], "index": q, "correct": bool(c), "score": float(c)} for q, c in enumerate(row)]}
            for step, row in by_step.items()]  # fmt: skip
        (folder / "held_out.jsonl").write_text("".join(json.dumps(x) + "\n" for x in held_out))
        record = (node_runs or [{}] * len(outcomes))[node]
        (folder / "node-run.json").write_text(json.dumps({"num_local": local, "num_external": 4 - local, **record}))
        own = [group_line(s, "own", TASKS[node % 3], f"peer{node}", "own", [0.0, 0.0]) for s in range(60)]
        (folder / "groups.jsonl").write_text("".join(json.dumps(x) + "\n" for x in own))
        (folder / "node.log").write_text("INFO started\n")
        (folder / "senders.json").write_text("{}")
    (run / "attempts.jsonl").write_text('{"started": 1.0}\n')
    (run / "node-config-count_bits.yaml").write_text("tasks: []\n")
    if complete:
        marker = {"identity": identity, "code": {"commit": commit, "dirty": False}, "finished": 1.8e9,
                  "last_attempt_seconds": 3600.0, **({"cpus": cpus} if cpus is not None else {})}  # fmt: skip
        (run / "run-complete.json").write_text(json.dumps(marker))
    return run


def others_mean(end: list[list[int]]) -> list[float]:
    """Per question, the mean outcome of the two peers that do not train on its task."""
    return [sum(end[p][q] for p in range(3) if TASKS[p] != QUESTION_TASKS[q]) / 2 for q in range(9)]
