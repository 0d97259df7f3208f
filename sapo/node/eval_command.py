"""`sapo-node eval MODEL`: held-out greedy pass@1 of a model, checkpoint or LoRA adapter, as a per-task table."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The options of `sapo-node eval`."""
    from sapo.node.options import NODE_DEFAULTS

    parser = argparse.ArgumentParser(
        prog="sapo-node eval",
        description="Score a model on the held-out questions a node evaluates on (the same set for the same tasks, "
        "questions and token limit): greedy pass@1 per task, with standard errors.",
    )
    parser.add_argument(
        "model",
        help="'default' (the embedded SmolLM2-135M-Instruct), a Hugging Face model directory, a node's "
        "checkpoint-N or final directory, or a LoRA adapter directory",
    )
    parser.add_argument(
        "--tasks", nargs="+", default=None,
        help="reasoning-gym task names (default: the node's default mix, with its settings)",
    )  # fmt: skip
    questions, tokens = NODE_DEFAULTS["eval_questions"], NODE_DEFAULTS["max_completion_length"]
    parser.add_argument(
        "--questions", type=int, default=questions, help=f"held-out questions (default {questions}, as a node)"
    )
    parser.add_argument(
        "--max-new-tokens", type=int, default=tokens, help=f"completion token limit (default {tokens}, as a node)"
    )
    parser.add_argument("--batch-size", type=int, default=16, help="questions per generation batch (default 16)")
    parser.add_argument("--base", default=None, help="base model directory of a LoRA adapter (default: its own)")
    parser.add_argument(
        "--merge-adapters", action=argparse.BooleanOptionalAction, default=None,
        help="generate with LoRA adapters merged into copies of their base weights (default: as a node on this "
        "machine, on without a CUDA GPU; sapo.speed.inference)",
    )  # fmt: skip
    parser.add_argument(
        "--bf16", action=argparse.BooleanOptionalAction, default=None,
        help="bf16 autocast, as a node evaluates (default: with a CUDA GPU that supports it, or where the CPU computes "
        "bf16 natively, AVX512-BF16 or AMX)",
    )  # fmt: skip
    parser.add_argument("--json", type=Path, default=None, help="also write every question's result to this file")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    """Print the table; exit 2 on a model or task the user must fix."""
    args = parse_args(argv)
    from sapo.evaluation import evaluate_policy
    from sapo.models import load_trained_policy
    from sapo.node.runner import NodeError, default_task_names, task_specs
    from sapo.tasks import build_held_out_dataset

    try:
        tasks = task_specs(args.tasks or default_task_names())
        if args.questions < 1:
            raise NodeError(f"--questions must be at least 1, got {args.questions}")
        questions = build_held_out_dataset(tasks, size=args.questions)
        print(f"sapo-node eval: loading {args.model}", file=sys.stderr, flush=True)
        model, tokenizer = load_trained_policy(args.model, base=args.base)
    except (NodeError, FileNotFoundError, ValueError, OSError) as e:
        print(f"sapo-node eval: error: {e}", file=sys.stderr)
        return 2
    result = evaluate_policy(
        model, tokenizer, questions, max_new_tokens=args.max_new_tokens, batch_size=args.batch_size, progress=True,
        merge_adapters=args.merge_adapters, bf16=args.bf16,
    )  # fmt: skip
    print(f"held-out greedy pass@1 of {args.model} ({args.questions} questions, {args.max_new_tokens} new tokens):")
    print(result.table())
    if args.json is not None:
        args.json.write_text(json.dumps({"model": args.model, **result.to_json()}, indent=1))
        print(f"per-question results: {args.json}")
    return 0
