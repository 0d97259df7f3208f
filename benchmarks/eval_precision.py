"""Held-out pass@1 of one model under float32 and under bf16 autocast on this machine's device, question by question.

Why it exists: on a lent GPU the untrained students of experiment 2 scored 0.119 at step 0 where the CPU runs scored
0.088 on the same 512 questions. This script scores a model both ways with `sapo.evaluation.evaluate_policy` (the
node's own held-out path: greedy, 48 new tokens, batches of 16, the model's eos ids, LoRA adapters merged as a node
on this machine merges them), and, given a node's ``held_out.jsonl``, counts the questions where each precision
agrees with the node's own evaluation at a step:

    python -m benchmarks.eval_precision --node-config RUN/node-config.yaml --out DIR \
        --compare RUN/node-0/held_out.jsonl:0 [--compare ...]

``--node-config`` is a run's node config (its ``tasks`` are the mix evaluated). Writes ``DIR/<device>-<precision>.json``
(every question: task, correct, score, completion) and ``DIR/<device>-summary.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.held_out_table import outcomes_by_step

PRECISIONS = ("fp32", "bf16")


def node_outcomes(spec: str) -> tuple[str, list[float]]:
    """A node's held-out outcomes at a step (1.0 correct, by question index), from ``PATH:STEP`` (``held_out.jsonl``
    as a node writes it; `benchmarks.held_out_table.outcomes_by_step` reads it)."""
    path, _, step = spec.rpartition(":")
    by_step = outcomes_by_step(Path(path))
    if int(step) not in by_step:
        raise SystemExit(f"{path} has no held-out evaluation at step {step}")
    return spec, by_step[int(step)]


def agreement(ours: Sequence[dict[str, Any]], theirs: Sequence[float]) -> int:
    """Questions on which our evaluation and a node's outcomes of the same question set agree about correctness."""
    if len(ours) != len(theirs):
        raise SystemExit(f"the evaluations cover {len(ours)} and {len(theirs)} questions: not the same set")
    return sum(bool(a["correct"]) == (b == 1.0) for a, b in zip(ours, theirs, strict=True))


def main(argv: Sequence[str] | None = None) -> int:
    """Score the model in each precision, write the results, print pass@1 and the agreement with each node."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--node-config", type=Path, required=True, help="a run's node config: its tasks are scored")
    parser.add_argument("--out", type=Path, required=True, help="folder for the results")
    parser.add_argument("--model", default="default", help="what sapo-node eval takes (default: the embedded model)")
    parser.add_argument("--questions", type=int, default=512, help="held-out questions (512)")
    parser.add_argument("--precisions", default=",".join(PRECISIONS), help="fp32, bf16 or both (both)")
    parser.add_argument("--compare", action="append", default=[], help="a node's held_out.jsonl:STEP to agree with")
    args = parser.parse_args(argv)

    import torch
    import yaml

    from sapo.evaluation import evaluate_policy
    from sapo.models import load_trained_policy
    from sapo.tasks import TaskSpec, build_held_out_dataset

    nodes = [node_outcomes(spec) for spec in args.compare]
    tasks = [TaskSpec(**item) for item in yaml.safe_load(args.node_config.read_text())["tasks"]]
    questions = build_held_out_dataset(tasks, size=args.questions)
    model, tokenizer = load_trained_policy(args.model)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model.to(device)
    eos = model.generation_config.eos_token_id
    eos = [eos] if isinstance(eos, int) else list(eos or [])
    if tokenizer.eos_token_id not in eos:  # as a node's trainer collects them
        eos = [tokenizer.eos_token_id, *eos]
    args.out.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__,
        "model": args.model, "questions": args.questions, "precisions": {},
    }  # fmt: skip
    for precision in args.precisions.split(","):
        if precision not in PRECISIONS:
            raise SystemExit(f"--precisions takes {', '.join(PRECISIONS)}; got {precision!r}")
        start = time.time()
        result = evaluate_policy(
            model, tokenizer, questions, max_new_tokens=48, batch_size=16, eos_token_ids=eos, progress=True,
            bf16=precision == "bf16",  # LoRA adapters merged or not as a node on this machine does
        )  # fmt: skip
        rows = [{"task": q.task, "correct": bool(q.correct), "score": q.score, "completion": q.completion}
                for q in result.questions]  # fmt: skip
        (args.out / f"{device}-{precision}.json").write_text(json.dumps(rows))
        summary["precisions"][precision] = {
            "pass@1": result.pass_at_1(), "seconds": round(time.time() - start, 1),
            "agrees_with": {spec: agreement(rows, outcomes) for spec, outcomes in nodes},
        }  # fmt: skip
        print(f"{device} {precision}: pass@1 {result.pass_at_1():.3f}", summary["precisions"][precision]["agrees_with"])
    (args.out / f"{device}-summary.json").write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
