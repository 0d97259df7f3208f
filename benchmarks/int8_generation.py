"""int8 generation on a CPU without native bf16: the default step's generation on dynamically quantized int8 linear
layers, beside today's fp32 path, with the cost of re-quantizing after each optimizer step and the numerics drift.

The policy changes every optimizer step, so an int8 copy must be made again each step: its cost is part of the
figure. One run, on the default model (SmolLM2-135M-Instruct, float32) with the node's LoRA adapter (r=16, alpha 32,
every linear layer but the output head; B matrices drawn small and non-zero, as after training), for the default
step's generation (2 held-out prompts x 4 completions, 48 new tokens forced, temperature 1, no top-k), repetitions
interleaved, medians reported:

- ``fp32 merged (today)``: `sapo.speed.generation.generate_completions` under `inference_context` (LoRA merged, each
  prompt prefilled once), what the node runs now;
- ``int8``: the same call with every linear layer of the model, the output head included (SmolLM2 ties it to the
  input embedding: the int8 copy is a separate packed copy, the embedding stays float32), replaced by a
  `torch.ao.nn.quantized.dynamic.Linear` made from the merged weights (int8 weights per output channel, activations
  quantized per call);
- ``int8, lm_head fp32``: the same with the output head left in float32;
- ``fp32 merged, int8 lm_head``: today's path with the output head alone in int8. Under LoRA the head is frozen
  (SmolLM2 ties it to the frozen input embedding), so its copy is made once per node, not once per step;
- ``int8 base, LoRA unmerged``: every linear layer's frozen base weight in int8 (the head included), made once per
  node, each LoRA adapter running unmerged beside its int8 base layer in float32 (two rank-16 matmuls per layer);
- the cost of making each int8 copy (merge + quantize + pack): once per optimizer step for the copies of merged
  LoRA layers (made again in every repetition), once per node for the frozen ones;
- numerics: on the sampled completions of the fp32 path, the per-token log-probability (temperature 1) under each
  int8 copy minus under the fp32 merged model (mean |diff|, 99th percentile, max, mean KL of the next-token
  distributions), and greedy agreement over 8 distinct held-out prompts x 48 greedy tokens (share of positions with
  the same token, and the mean length of the common prefix).

On a machine whose cores are already busy (the project's 2 cores under a learning campaign), 2 torch threads can
stall for minutes (each parallel region waits for a descheduled thread: one such run did not finish its warm-up in
10 minutes); `--threads 1` is then the measurable setting.

Usage:
    python -m benchmarks.int8_generation               # default model, 2 torch threads, 3 repetitions
    python -m benchmarks.int8_generation --threads 1 --reps 1 --greedy-prompts 0   # the shortest real run
    python -m benchmarks.int8_generation --quick       # tiny model, seconds: a smoke test

Writes ``int8_generation.{json,md}`` into ``--output-dir`` (default benchmarks/results), naming the commit and
whether the tree was clean.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
import statistics
import tempfile
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.harness import RESULTS, git_state, percentile, record_lines, run_record, write_report

PROMPTS, GENERATIONS, NEW_TOKENS, GREEDY_PROMPTS, WARMUP_TOKENS = 2, 4, 48, 8, 4
TODAY, INT8, INT8_BODY = "fp32 merged (today)", "int8", "int8, lm_head fp32"
INT8_HEAD, INT8_BASE = "fp32 merged, int8 lm_head", "int8 base, LoRA unmerged"
VARIANTS = (TODAY, INT8, INT8_BODY, INT8_HEAD, INT8_BASE)
PARTS = {INT8: "all", INT8_BODY: "body", INT8_HEAD: "head", INT8_BASE: "base"}
"""Which linear layers each int8 variant quantizes (see :func:`int8_linears`)."""
MADE_ONCE = (INT8_HEAD, INT8_BASE)
"""Variants whose int8 copy does not change with training (under LoRA the base weights are frozen, and the output head
is tied to the frozen input embedding): made once per node, not once per optimizer step."""
HEAD_NAME = "lm_head"


# ------------------------------------------------------------------------------------------------
# the int8 copy


def int8_linear(weight: Any, bias: Any = None) -> Any:
    """A dynamically quantized int8 linear layer (`torch.ao.nn.quantized.dynamic.Linear`) computing ``x W^T + b``
    with ``weight`` quantized per output channel (symmetric); ``weight`` and ``bias`` are read, not kept."""
    import torch
    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear
    from torch.ao.quantization import per_channel_dynamic_qconfig

    float_layer = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
    float_layer.weight = torch.nn.Parameter(weight.detach().float(), requires_grad=False)
    if bias is not None:
        float_layer.bias = torch.nn.Parameter(bias.detach().float(), requires_grad=False)
    float_layer.qconfig = per_channel_dynamic_qconfig
    return DynamicLinear.from_float(float_layer)


def int8_linears(model: Any, parts: str = "all") -> dict[str, Any]:
    """int8 copies of the linear layers of ``model``, by the qualified name of the module each replaces.

    A LoRA layer of a PEFT model is replaced as a whole by an int8 layer of its merged weight (base + B A scaled,
    made by `sapo.speed.inference.inference_weights`); a plain ``torch.nn.Linear`` by an int8 layer of its weight.
    ``parts``: ``"all"`` every linear layer, ``"body"`` all but the output head (a module named ``lm_head``),
    ``"head"`` the output head alone; ``"base"`` every linear layer, but a LoRA layer's *base layer* (key
    ``<name>.base_layer``) by an int8 layer of its frozen base weight, the adapter left to run unmerged beside it (a
    copy that training does not change; generate with the adapters unmerged). ``model`` is left as it was: its
    weights are read, never written. Raises ValueError for an unknown ``parts`` and for a LoRA layer that is not
    plain LoRA (DoRA and other variants), naming it.
    """
    import torch

    from sapo.speed.inference import inference_weights

    if parts not in ("all", "body", "head", "base"):
        raise ValueError(f"int8_linears: parts must be 'all', 'body', 'head' or 'base', got {parts!r}")
    copies: dict[str, Any] = {}
    replaced: list[str] = []
    with torch.no_grad(), inference_weights(model, merge_adapters=parts != "base"):
        for name, module in model.named_modules():
            if any(name.startswith(prefix + ".") for prefix in replaced):
                continue  # inside a LoRA layer replaced as a whole
            is_head = name.rsplit(".", 1)[-1] == HEAD_NAME
            if (parts == "head" and not is_head) or (parts == "body" and is_head):
                continue
            if hasattr(module, "get_base_layer") and hasattr(module, "lora_A"):
                variant = any(a in module.lora_variant for a in module.active_adapters)
                if variant or (parts != "base" and not module.merged):
                    raise ValueError(
                        f"int8 copy: the LoRA layer {name!r} is not plain LoRA (a DoRA or other variant adapter, or an "
                        "inactive one); only plain LoRA adapters can run beside or be folded into an int8 weight"
                    )
                base = module.get_base_layer()
                copies[f"{name}.base_layer" if parts == "base" else name] = int8_linear(base.weight, base.bias)
                replaced.append(name)
            elif type(module) is torch.nn.Linear:
                copies[name] = int8_linear(module.weight, module.bias)
    return copies


@contextlib.contextmanager
def swapped_modules(model: Any, replacements: Mapping[str, Any]) -> Iterator[Any]:
    """Within the context, each module of ``model`` named in ``replacements`` is replaced by its replacement; the
    original module objects are put back on exit, also on error."""
    originals = []
    try:
        for name, replacement in replacements.items():
            parent_name, _, attribute = name.rpartition(".")
            parent = model.get_submodule(parent_name)
            originals.append((parent, attribute, getattr(parent, attribute)))
            setattr(parent, attribute, replacement)
        yield model
    finally:
        for parent, attribute, original in reversed(originals):
            setattr(parent, attribute, original)


# ------------------------------------------------------------------------------------------------
# numerics


def completion_logps(model: Any, rows: Sequence[Sequence[int]], completions: Sequence[Sequence[int]], pad: int) -> Any:
    """Log-softmax (temperature 1) of ``model`` at every completion position, ``[rows, completion tokens, vocab]``:
    one forward pass of the left-padded prompt + completion rows (completions of equal length)."""
    import torch

    width = len(completions[0])
    if any(len(c) != width for c in completions):
        raise ValueError("completion_logps: completions must all have the same length (generate them fixed-length)")
    full = [list(r) + list(c) for r, c in zip(rows, completions, strict=True)]
    length = max(map(len, full))
    ids = torch.tensor([[pad] * (length - len(f)) + f for f in full])
    mask = torch.tensor([[0] * (length - len(f)) + [1] * len(f) for f in full])
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids).logits
    return torch.log_softmax(logits[:, -width - 1 : -1].float(), -1)


def logp_drift(reference: Any, other: Any, completions: Sequence[Sequence[int]]) -> dict[str, float]:
    """How far ``other``'s log-probabilities (``[rows, tokens, vocab]``) are from ``reference``'s: on the sampled
    ``completions`` tokens, mean, 99th percentile and max of |diff| and the mean diff (other - reference); over the
    whole vocabulary, the mean KL(reference || other) per position; and the largest |diff| of a completion's summed
    log-probability."""
    import torch

    tokens = torch.tensor([list(c) for c in completions])[..., None]
    diff = (other.gather(-1, tokens) - reference.gather(-1, tokens))[..., 0]
    absolute = diff.abs().flatten().tolist()
    kl = (reference.exp() * (reference - other)).sum(-1)
    return {
        "mean_abs": statistics.mean(absolute),
        "p99_abs": percentile(absolute, 0.99),
        "max_abs": max(absolute),
        "mean": diff.mean().item(),
        "mean_kl": kl.mean().item(),
        "max_abs_sequence": diff.sum(-1).abs().max().item(),
        "tokens": len(absolute),
    }


def greedy_agreement(reference: Sequence[Sequence[int]], other: Sequence[Sequence[int]]) -> dict[str, float]:
    """Share of positions where two sets of greedy completions hold the same token, and the mean length of the
    common prefix (the tokens before the first difference) per row."""
    same = total = 0
    prefixes = []
    for a, b in zip(reference, other, strict=True):
        n = min(len(a), len(b))
        same += sum(x == y for x, y in zip(a[:n], b[:n], strict=True))
        total += max(len(a), len(b))
        prefixes.append(next((k for k in range(n) if a[k] != b[k]), n))
    return {"share_same": same / total if total else 1.0, "mean_common_prefix": statistics.mean(prefixes)}


# ------------------------------------------------------------------------------------------------
# the run


def prompt_ids(tokenizer: Any, dataset: Any, count: int) -> list[list[int]]:
    """The chat-template prompt ids of the first ``count`` questions of ``dataset``."""
    return [
        list(tokenizer.apply_chat_template(dataset[i]["prompt"], add_generation_prompt=True, tokenize=True,
                                           return_dict=True)["input_ids"])
        for i in range(count)
    ]  # fmt: skip


def generation_config(tokenizer: Any, greedy: bool = False) -> Any:
    """The default node's sampling (temperature 1, no top-k/top-p), or greedy decoding; 48 new tokens, all of them."""
    from transformers import GenerationConfig

    sampling = {"do_sample": False} if greedy else {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0}
    return GenerationConfig(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, pad_token_id=tokenizer.pad_token_id,
                            eos_token_id=[tokenizer.eos_token_id], disable_compile=True, **sampling)  # fmt: skip


def load_model(quick: bool, workdir: Path) -> tuple[Any, Any]:
    """(the policy with the node's LoRA adapter, its tokenizer); the adapter's B matrices drawn N(0, 1e-3), so the
    merged weights differ from the base ones as after training."""
    import torch

    from sapo.models import LoraSpec, load_policy, save_tiny_model

    model, tokenizer = load_policy(save_tiny_model(workdir / "tiny") if quick else None,
                                   lora=LoraSpec(r=16, alpha=32, dropout=0.0))  # fmt: skip
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 1e-3)
    return model.eval(), tokenizer


def generate(
    model: Any, tokenizer: Any, rows: list[list[int]], config: Any, int8: Mapping[str, Any], merge: bool = True
) -> Any:
    """Completions of ``rows`` as the node generates them (each prompt prefilled once, the LoRA layers left in the
    model merged unless ``merge`` is false) with the int8 copies ``int8`` swapped in (none: today's fp32 path)."""
    import torch

    from sapo.speed.generation import generate_completions
    from sapo.speed.inference import inference_context

    eos, pad = [tokenizer.eos_token_id], tokenizer.pad_token_id
    with torch.no_grad(), swapped_modules(model, int8), inference_context(model, merge_adapters=merge):
        return generate_completions(model, rows, config, eos, pad, prefill_once=True)


def timed(fn: Any, *args: Any, **kwargs: Any) -> tuple[Any, float, float]:
    """(``fn(*args, **kwargs)``, wall seconds, process CPU seconds)."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn(*args, **kwargs)
    return result, time.perf_counter() - wall, time.process_time() - cpu


def measure(model: Any, tokenizer: Any, dataset: Any, reps: int, seed: int, greedy_prompts: int) -> dict[str, Any]:
    """Timings of every variant and of making its int8 copy (interleaved; the copies that change with training are
    made again in every repetition, as after every optimizer step), then the numerics."""
    import torch

    from sapo.speed.inference import inference_context

    distinct = prompt_ids(tokenizer, dataset, max(PROMPTS, greedy_prompts))
    rows = [p for p in distinct[:PROMPTS] for _ in range(GENERATIONS)]
    sampling = generation_config(tokenizer)
    times: dict[str, dict[str, list[float]]] = {
        name: {"wall": [], "cpu": []} for name in (*VARIANTS, *(f"make {v}" for v in PARTS))
    }

    def record(name: str, wall: float, cpu: float) -> None:
        times[name]["wall"].append(wall)
        times[name]["cpu"].append(cpu)

    copies: dict[str, Any] = {TODAY: {}}
    merge = {name: PARTS.get(name) != "base" for name in VARIANTS}  # "base" runs its adapters unmerged
    for name in MADE_ONCE:
        copies[name], *cost = timed(int8_linears, model, PARTS[name])
        record(f"make {name}", *cost)
        print(f"int8_generation: made {name} once: {cost[0]:.2f} s", flush=True)
    warmup = copy.deepcopy(sampling)
    warmup.min_new_tokens = warmup.max_new_tokens = WARMUP_TOKENS
    for name in PARTS:  # first calls (the int8 kernels, the cache) on short generations, not recorded
        copies.setdefault(name, int8_linears(model, PARTS[name]))
    for name in VARIANTS:
        generate(model, tokenizer, rows, warmup, copies[name], merge[name])
    sampled: list[list[int]] = []
    for rep in range(reps):
        for name in VARIANTS:
            if name in PARTS and name not in MADE_ONCE:
                copies[name], *cost = timed(int8_linears, model, PARTS[name])
                record(f"make {name}", *cost)
                print(f"int8_generation: repetition {rep + 1} of {reps}: make {name} {cost[0]:.2f} s", flush=True)
            torch.manual_seed(seed + rep)
            out, *cost = timed(generate, model, tokenizer, rows, sampling, copies[name], merge[name])
            record(name, *cost)
            sampled = out if name == TODAY else sampled
            print(f"int8_generation: repetition {rep + 1} of {reps}: {name} {cost[0]:.2f} s", flush=True)
    medians = {n: {k: statistics.median(v) for k, v in t.items()} | {"runs": t} for n, t in times.items()}
    if any(len(c) != NEW_TOKENS for c in sampled):
        raise RuntimeError("a completion stopped before its 48 tokens: min_new_tokens was not applied")

    print("int8_generation: numerics", flush=True)
    pad = tokenizer.pad_token_id
    with inference_context(model):
        reference = completion_logps(model, rows, sampled, pad)
    greedy = generation_config(tokenizer, greedy=True)
    greedy_rows = distinct[:greedy_prompts]
    greedy_ref = generate(model, tokenizer, greedy_rows, greedy, {}) if greedy_rows else None
    numerics = {}
    for name in PARTS:
        with swapped_modules(model, copies[name]), inference_context(model, merge_adapters=merge[name]):
            numerics[name] = logp_drift(reference, completion_logps(model, rows, sampled, pad), sampled)
        if greedy_rows:
            numerics[name] |= greedy_agreement(
                greedy_ref, generate(model, tokenizer, greedy_rows, greedy, copies[name], merge[name])
            )
    return {
        "timings": medians,
        "numerics": numerics,
        "prompt_tokens": [len(p) for p in distinct[:PROMPTS]],
        "int8_layers": {name: len(copies[name]) for name in PARTS},
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.int8_generation", description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=None, help="timed repetitions (default 3; 1 with --quick)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2, as a node on this machine)")
    parser.add_argument(
        "--greedy-prompts",
        type=int,
        default=GREEDY_PROMPTS,
        help=f"distinct prompts of the greedy agreement check (default {GREEDY_PROMPTS}; 0 skips it)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="tiny random model: a smoke test in seconds")
    parser.add_argument("--output-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)  # fmt: skip
    args.reps = args.reps or (1 if args.quick else 3)
    if args.reps < 1 or args.threads < 1 or args.greedy_prompts < 0:
        parser.error("--reps and --threads must be at least 1, --greedy-prompts at least 0")
    return args


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Everything the report shows."""
    import torch
    from transformers.utils import logging as hf_logging

    from sapo.tasks import DEFAULT_TASKS, build_held_out_dataset

    warnings.filterwarnings("ignore")  # the quantized-tensor deprecation warning is named in the report instead
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    torch.set_num_threads(args.threads)
    started, load_start = time.monotonic(), list(os.getloadavg())
    with tempfile.TemporaryDirectory(prefix="int8-generation-") as tmp:
        model, tokenizer = load_model(args.quick, Path(tmp))
        dataset = build_held_out_dataset(DEFAULT_TASKS, max(PROMPTS, args.greedy_prompts))
        measured = measure(model, tokenizer, dataset, args.reps, args.seed, args.greedy_prompts)
    return {
        "settings": {
            "model": "tiny" if args.quick else "SmolLM2-135M-Instruct",
            "lora": "r=16, alpha=32, all linear layers but lm_head, B ~ N(0, 1e-3)",
            "threads": torch.get_num_threads(),
            "reps": args.reps,
            "seed": args.seed,
            "rows": PROMPTS * GENERATIONS,
            "new_tokens": NEW_TOKENS,
            "greedy_prompts": args.greedy_prompts,
            "tied_head": bool(getattr(model.config, "tie_word_embeddings", False)),
        },
        "torch": torch.__version__,
        "quantized_engine": torch.backends.quantized.engine,
        **measured,
        "load_average": {"start": load_start, "end": list(os.getloadavg())},
        "elapsed_seconds": time.monotonic() - started,
    }


def ratios(timings: Mapping[str, Mapping[str, float]], clock: str = "wall") -> dict[str, dict[str, float]]:
    """Per int8 variant: its generation over today's (b/a), and with the cost of making its copy once per optimizer
    step ((b+c)/a; c = 0 for a copy made once per node, :data:`MADE_ONCE`), on medians of ``clock`` seconds."""
    today = timings[TODAY][clock]
    out = {}
    for v in PARTS:
        per_step = 0.0 if v in MADE_ONCE else timings[f"make {v}"][clock]
        out[v] = {"b/a": timings[v][clock] / today, "(b+c)/a": (timings[v][clock] + per_step) / today}
    return out


def report_lines(data: Mapping[str, Any], record: Mapping[str, str]) -> list[str]:
    """The result page."""
    s, t, n, layers = data["settings"], data["timings"], data["numerics"], data["int8_layers"]
    wall, cpu = ratios(t, "wall"), ratios(t, "cpu")
    head = "tied to the input embedding; its int8 copy is separate" if s["tied_head"] else "a separate layer"
    lines = [
        "# int8 generation: the default step's generation on dynamically quantized linear layers",
        "",
        *record_lines(record),
        f"Tree: {'dirty' if data['git']['dirty'] else 'clean'}. torch {data['torch']}, quantized engine "
        f"`{data['quantized_engine']}`, {s['threads']} torch threads; load average "
        f"{data['load_average']['start'][0]:.1f} at start, {data['load_average']['end'][0]:.1f} at end; "
        f"{data['elapsed_seconds'] / 60:.1f} min.  ",
        "**If the load average exceeds the cores, the machine was shared** (on the project's machine: a learning "
        "campaign's node processes on the same 2 cores): absolute seconds are then inflated and noisy; the ratios of "
        "variants run side by side, interleaved, are what count, CPU seconds being the steadier.",
        "",
        f"Model {s['model']}, float32, with the node's LoRA adapter ({s['lora']}); {PROMPTS} held-out prompts x "
        f"{GENERATIONS} completions ({', '.join(map(str, data['prompt_tokens']))} prompt tokens), {NEW_TOKENS} new "
        f"tokens forced, temperature 1, no top-k, each prompt prefilled once "
        "(`sapo.speed.generation.generate_completions`)."
        f" Medians of {s['reps']} interleaved repetitions after a short warm-up ({WARMUP_TOKENS} tokens per variant).",
        "",
        f"Variants: (a) `{TODAY}`: today's path, `inference_context` (LoRA merged, float32). (b) `{INT8}`: every "
        f"linear layer ({layers[INT8]}: `lm_head`, {head}, and the {layers[INT8_BODY]} others, LoRA layers with "
        "their adapters merged) replaced by `torch.ao.nn.quantized.dynamic.Linear` (int8 weights per output "
        f"channel, activations quantized per call); `{INT8_BODY}`: the same but `lm_head`; `{INT8_HEAD}`: today's "
        f"path with `lm_head` alone in int8; `{INT8_BASE}`: every frozen base weight in int8, `lm_head` included, "
        "each LoRA adapter running unmerged beside its int8 base layer in float32. (c) making the int8 copy: merge "
        "+ quantize + pack. Merged LoRA layers change with every optimizer step, so their copy is made each step; "
        "under LoRA the base weights and `lm_head` (tied to the frozen input embedding) are frozen, so their copies "
        "are made once per node and (b+c)/a counts no per-step cost for them.",
        "",
        "## Time",
        "",
        "| what | wall s | CPU s | b/a (wall) | (b+c)/a (wall) | b/a (CPU) | (b+c)/a (CPU) |",
        "|---|---:|---:|---:|---:|---:|---:|",
        f"| a. {TODAY}: generation | {t[TODAY]['wall']:.2f} | {t[TODAY]['cpu']:.2f} | 1.00 | 1.00 | 1.00 | 1.00 |",
    ]
    for v in PARTS:
        when = "once per node" if v in MADE_ONCE else "once per optimizer step"
        lines.append(
            f"| b. {v}: generation | {t[v]['wall']:.2f} | {t[v]['cpu']:.2f} | {wall[v]['b/a']:.2f} | "
            f"{wall[v]['(b+c)/a']:.2f} | {cpu[v]['b/a']:.2f} | {cpu[v]['(b+c)/a']:.2f} |"
        )
        lines.append(f"| c. {v}: making the copy, {when} | {t['make ' + v]['wall']:.2f} | "
                     f"{t['make ' + v]['cpu']:.2f} | | | | |")  # fmt: skip
    greedy = s["greedy_prompts"] > 0
    lines += [
        "",
        "Every run (wall s): "
        + "; ".join(f"{name}: {', '.join(f'{x:.2f}' for x in v['runs']['wall'])}" for name, v in t.items()),
        "",
        "## Numerics (int8 against the fp32 merged model)",
        "",
        f"Per-token log-probability (temperature 1) of the {s['rows']} x {NEW_TOKENS} completions sampled by (a) in "
        f"its last repetition, int8 minus fp32; KL(fp32 || int8) of the next-token distribution averaged over those "
        "positions; "
        + (f"greedy decoding of {s['greedy_prompts']} distinct held-out prompts x {NEW_TOKENS} tokens under each."
           if greedy else "greedy agreement not measured (`--greedy-prompts 0`)."),
        "",
        "| variant | mean abs diff (nats) | p99 abs diff | max abs diff | mean diff | mean KL | max abs diff of a "
        "completion's sum | greedy tokens the same | mean common greedy prefix (tokens) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]  # fmt: skip
    for v, x in n.items():
        agreement = (f"{x['share_same']:.1%} | {x['mean_common_prefix']:.1f} of {NEW_TOKENS}" if greedy
                     else "not measured | not measured")  # fmt: skip
        lines.append(
            f"| {v} | {x['mean_abs']:.4f} | {x['p99_abs']:.4f} | {x['max_abs']:.4f} | {x['mean']:+.4f} | "
            f"{x['mean_kl']:.5f} | {x['max_abs_sequence']:.3f} | {agreement} |"
        )
    lines += [
        "",
        f"Note: torch {data['torch']} warns that quantized tensor creation (`torch.quantize_per_channel`, which "
        "`torch.ao.nn.quantized.dynamic.Linear.from_float` uses) is deprecated and will be removed in a future "
        "release.",
    ]
    return lines


def main(argv: list[str] | None = None) -> int:
    """Run, write the report, print it."""
    args = parse_args(argv)
    record, git = run_record(), git_state()  # the code that runs: the tree as it is now, before the run
    data = run(args)
    data["record"], data["git"] = record, git
    lines = report_lines(data, record)
    paths = write_report(args.output_dir, "int8_generation", data, lines)
    print("\n".join(lines))
    print(f"wrote {paths['md']}, {paths['json']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
