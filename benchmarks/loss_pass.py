"""The training pass alone: TRL's loss forward and backward of the default node's batch, where its CPU time goes.

The default node's batch (8 rows, 72 prompt and 48 completion tokens, the default model with LoRA r=16) runs through
the model's fused LM head (`trl.trainer.utils.add_fused_lm_head`, as `GRPOTrainer` calls it) forward and backward,
in float32 and, where asked or where the CPU computes it natively, under bf16 autocast; each with TRL's CPU scoring
(every position, prompt and padding included) and with the completion positions only
(`sapo.speed.lm_head.completion_positions_only`, what `SAPOTrainer` does). Repetitions are interleaved and measured in
CPU seconds of this one-thread process (the steadier measure on a shared machine); the two scorings' log-probabilities
and gradients are compared exactly. ``--profile`` adds each configuration's heaviest operators (torch.profiler).

    python -m benchmarks.loss_pass --reps 3 --profile     # the default model, about 2 minutes of one core
    python -m benchmarks.loss_pass --quick                # a tiny model on a small batch: a smoke test

Writes ``loss_pass.{json,md}`` into ``--output-dir`` (default benchmarks/results), naming the commit.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import RESULTS, record_lines, run_record, write_report

ROWS, PROMPT, COMPLETION = 8, 72, 48
QUICK_BATCH = (4, 16, 8)
"""Rows, prompt and completion tokens of ``--quick``'s batch: a smoke test's, enough for the left padding of 10."""


def build(quick: bool, model_dir: str | None) -> Any:
    """The policy with the node's LoRA adapters and TRL's fused LM head, in training mode; the head computes
    log-probabilities and entropies, as GRPOTrainer asks of it."""
    from trl.trainer.utils import add_fused_lm_head

    from sapo.models import LoraSpec, load_policy, save_tiny_model

    path = model_dir or (str(save_tiny_model(Path(tempfile.mkdtemp()) / "tiny")) if quick else None)
    model, _ = load_policy(path, lora=LoraSpec(r=16, alpha=32, dropout=0.0))
    add_fused_lm_head(model.get_base_model(), outputs=("log_probs", "entropy"))
    return model.train()


def batch(
    vocab: int, seed: int = 0, rows: int = ROWS, prompt: int = PROMPT, completion: int = COMPLETION
) -> tuple[Any, Any, Any]:
    """Token ids, attention mask (half the rows left-padded by 10) and labels (completion positions only); the
    default node's batch unless told."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(10, vocab - 1, (rows, prompt + completion), generator=generator)
    mask = torch.ones_like(ids)
    mask[: rows // 2, :10] = 0
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :-completion] = -100
    return ids, mask, labels


def loss_pass(
    model: Any, inputs: tuple[Any, Any, Any], bf16: bool, compact: bool, as_node: bool = False,
    fused_lora: bool = True, lean_head: bool = True,
) -> dict[str, Any]:  # fmt: skip
    """One forward and backward; CPU seconds of each, the completion log-probabilities and the adapters' gradients.
    ``as_node``: under bf16, as `SAPOTrainer` runs it (frozen weights cast to bf16 once, attention in float32, LoRA
    adapters added inside one matmul unless not ``fused_lora``, the LM head's tiles folded in fewer passes unless not
    ``lean_head``)."""
    import contextlib

    import torch

    from sapo.speed.lm_head import completion_positions_only, lean_cpu_lm_head
    from sapo.speed.lora_layers import fused_lora_forward
    from sapo.speed.precision import bf16_training_pass

    ids, mask, labels = inputs
    scoring = completion_positions_only() if compact else contextlib.nullcontext()
    precision = torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16)
    node_way = bf16_training_pass(model) if as_node else contextlib.nullcontext()
    lora = fused_lora_forward(model) if as_node and fused_lora else contextlib.nullcontext()
    head = lean_cpu_lm_head() if as_node and lean_head else contextlib.nullcontext()
    start = time.process_time()
    with scoring, precision, node_way, lora, head:
        out = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
    log_probs = out.log_probs[:, -int((labels[-1] != -100).sum()) :]  # the last row is not padded
    middle = time.process_time()
    log_probs.sum().backward()
    end = time.process_time()
    grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    model.zero_grad(set_to_none=True)
    return {"forward": middle - start, "backward": end - middle, "log_probs": log_probs.detach(), "grads": grads}


def profile_table(model: Any, inputs: tuple[Any, Any, Any], bf16: bool, compact: bool, rows: int = 8) -> list[str]:
    """The heaviest operators of one pass, by self CPU time, as markdown rows."""
    import torch

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        loss_pass(model, inputs, bf16, compact)
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)[:rows]
    return [f"| {e.key} | {e.self_cpu_time_total / 1e6:.2f} | {e.count} |" for e in events]


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every configuration, interleaved ``args.reps`` times (after one warm-up pass each)."""
    import torch

    from sapo.speed.devices import cpu_has_native_bf16

    torch.set_num_threads(1)
    model = build(args.quick, args.model)
    shape = QUICK_BATCH if args.quick else (ROWS, PROMPT, COMPLETION)
    inputs = batch(model.config.vocab_size, 0, *shape)
    bf16 = {"auto": cpu_has_native_bf16(), "on": True, "off": False}[args.bf16]
    # (bf16, completion positions only, as the node, fused LoRA, lean LM head)
    configs = [(low, compact, False, False, False) for low in ([False, True] if bf16 else [False])
               for compact in (False, True)]  # fmt: skip
    if bf16:  # the node's way, and without each of its two CPU kernels (`cpu_fused_loss_pass`)
        configs += [(True, True, True, False, True), (True, True, True, True, False), (True, True, True, True, True)]
    name = {c: f"{'bf16' if c[0] else 'fp32'}, {'completion positions' if c[1] else 'every position (TRL on CPU)'}"
            + (", as the node runs it (bf16 weights once, float32 attention, fused LoRA, lean LM head)" if c[2] else "")
            + (" but PEFT's LoRA forward" if c[2] and not c[3] else "")
            + (" but TRL's LM head" if c[2] and not c[4] else "")
            for c in configs}  # fmt: skip
    samples: dict[str, list[dict[str, float]]] = {name[c]: [] for c in configs}
    same = {}
    for low in sorted({c[0] for c in configs}):
        every, only = loss_pass(model, inputs, low, False), loss_pass(model, inputs, low, True)  # warm-up and check
        same["bf16" if low else "fp32"] = {
            "log_probs_max_difference": (every["log_probs"] - only["log_probs"]).abs().max().item(),
            "grads_max_difference": (every["grads"] - only["grads"]).abs().max().item(),
        }
    for _ in range(args.reps):
        for config in configs:
            result = loss_pass(model, inputs, *config)
            samples[name[config]].append({"forward": result["forward"], "backward": result["backward"]})
    medians = {
        key: {part: statistics.median(s[part] for s in runs) for part in ("forward", "backward")}
        for key, runs in samples.items()
    }
    profiles = {name[c]: profile_table(model, inputs, *c[:2]) for c in configs if not c[2]} if args.profile else {}
    return {"configs": list(samples), "samples": samples, "medians": medians, "same_results": same,
            "profiles": profiles, "native_bf16": cpu_has_native_bf16(), "quick": args.quick,
            "batch": dict(zip(("rows", "prompt", "completion"), shape, strict=True))}  # fmt: skip


def report_lines(data: dict[str, Any], record: dict[str, str]) -> list[str]:
    """The result page."""
    base = data["medians"][data["configs"][0]]
    base_total = base["forward"] + base["backward"]
    shape = data.get("batch", {"rows": ROWS, "prompt": PROMPT, "completion": COMPLETION})  # reports before "batch"
    lines = ["# The training pass alone (`python -m benchmarks.loss_pass`)", "", *record_lines(record), "",
             f"{shape['rows']} rows of {shape['prompt']} prompt and {shape['completion']} completion tokens "
             "(half the rows left-padded by 10), "
             f"{'a tiny model' if data['quick'] else 'SmolLM2-135M-Instruct'} with LoRA r=16, TRL's fused LM head "
             "(log-probabilities and entropies, as GRPO asks; the gradient of the log-probabilities); "
             f"one thread, CPU seconds, medians of {len(data['samples'][data['configs'][0]])} interleaved "
             f"repetitions. Native bf16 on this CPU: {data['native_bf16']}.", "",
             "| configuration | forward CPU s | backward CPU s | total | x the first row |",
             "|---|---:|---:|---:|---:|"]  # fmt: skip
    for key in data["configs"]:
        m = data["medians"][key]
        total = m["forward"] + m["backward"]
        lines.append(f"| {key} | {m['forward']:.2f} | {m['backward']:.2f} | {total:.2f} | {total / base_total:.2f} |")
    lines += ["", "Completion positions only against every position, the same precision (largest absolute difference):",
              ""]  # fmt: skip
    for precision, diff in data["same_results"].items():
        lines.append(f"- {precision}: log-probabilities {diff['log_probs_max_difference']:.3g}, gradients "
                     f"{diff['grads_max_difference']:.3g}")  # fmt: skip
    for key, rows in data["profiles"].items():
        lines += ["", f"Heaviest operators, {key}:", "", "| operator | self CPU s | calls |", "|---|---:|---:|", *rows]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.loss_pass", description=__doc__.split("\n")[0])
    rows, prompt, completion = QUICK_BATCH
    quick_help = f"a tiny random model on {rows} rows of {prompt} + {completion} tokens: a smoke test"
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--model", default=None, help="a local model directory (default: the embedded SmolLM2-135M)")
    parser.add_argument("--reps", type=int, default=3, help="interleaved repetitions per configuration (default 3)")
    parser.add_argument("--bf16", choices=("auto", "on", "off"), default="auto",
                        help="measure bf16 autocast too: auto (where the CPU has native bf16), on, off")  # fmt: skip
    parser.add_argument("--profile", action="store_true", help="add each configuration's heaviest operators")
    parser.add_argument("--output-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    record = run_record()  # before the outputs change the tree
    data = run(args)
    paths = write_report(args.output_dir, "loss_pass", {"record": record, **data}, report_lines(data, record))
    print(paths["md"].read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
