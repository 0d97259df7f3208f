"""The step at the machine's speed: this machine's limits, the lower bound of each phase, and where a node stands.

One run on the machine at hand measures:

1. **the machine**: matmul rate (GFLOP/s) at the model's own shapes (the decode rows, the shared prefill, the
   training micro-batch, the lm_head) and at a large shape, and memory read bandwidth (GB/s);
2. **the lower bound** of each phase from the model's FLOPs and bytes at those rates: every linear layer costs at
   least max(FLOPs / rate at its shape, weight bytes / bandwidth), summed over the phase's forward passes;
3. **generation of the default step** (2 prompts x 4 completions, 48 new tokens, fixed length, temperature 1, no
   top-k, the default model with the node's LoRA r=16): `model.generate` as TRL calls it (float32, today's
   baseline), then each generation speed-up of `sapo.speed` alone and all together, bf16 where the CPU has it, and TRL's
   `use_transformers_continuous_batching` path (`generate_batch`); repetitions interleaved, medians reported;
4. **the default node's step split** (generation, scoring, swarm, plausibility, training pass, optimizer) for each
   speed-up off and on, completions at their full 48 tokens (fixed length, the same work for every configuration),
   beside plain `trl.GRPOTrainer` at the same batch (2 local groups of 4, LoRA r=16). The node
   is a real SAPOTrainer in a MemorySwarm with a second peer that publishes one group per step, sampled from the
   same model beforehand (so the plausibility check keeps it): its steps after the first take J = 1 group from the
   swarm. The trainers take turns step by step (`benchmarks.turns.Baton`), so load from other processes spreads
   over all of them.

Wall seconds are reported beside the process's CPU seconds: on a shared machine the CPU seconds of a one-thread run
are the steadier measure of work. The load average at start and end is recorded.

With ``--device cuda`` the same parts run on the GPU as a node runs there (``sapo.speed.devices.device_defaults``: bf16
autocast, gradient checkpointing on): the matmul rates and the copy bandwidth (bytes read and written per second) are
the GPU's, every timing waits for the GPU (``torch.cuda.synchronize``), and only wall seconds are reported (the CPU
mostly waits for the GPU there). ``--random-weights`` gives the model random weights of its shapes (its config and
tokenizer suffice, e.g. a directory written by ``--export-shapes``): every completion runs to its 48 tokens, so the
timings do not depend on the weights, and that is all such a run measures.

Usage:
    python -m benchmarks.step_limit --threads 1 --reps 2 --steps 3   # default model, ~18 min on 2 shared cores
    python -m benchmarks.step_limit --quick      # tiny model, seconds: a smoke test
    python -m benchmarks.step_limit --export-shapes DIR    # the default model's config and tokenizer, no weights
    python -m benchmarks.step_limit --device cuda --model DIR --random-weights --skip-continuous-batching

Writes ``step_limit.{json,md,png}`` into ``--output-dir`` (default benchmarks/results), naming the commit and
whether the tree was clean.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import statistics
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

from benchmarks.harness import RESULTS, git_state, run_record, write_report
from benchmarks.machine_limits import (
    GENERATIONS,
    NEW_TOKENS,
    PROMPTS,
    export_shapes,
    machine_limits,
    phase_bounds,
    random_policy,
    sync_for,
)
from benchmarks.step_limit_report import RANDOM_WEIGHTS_NOTE, SPLIT, plot, report_lines
from benchmarks.turns import Baton, make_turn_callback, timed_grpo_trainer_class, train_in_turns

UNPACKED = "both + bf16 + inverse-transform sampling, weights not packed"
GENERATION_VARIANTS = ("today (TRL generate, fp32)", "prefill once", "merged adapters", "both", "both + bf16",
                       UNPACKED, "both + bf16 + inverse-transform sampling", "TRL continuous batching",
                       "TRL generate + bf16 autocast")  # fmt: skip
SWARM_PHASES = ("swarm_fetch", "external_scoring", "publish")


# ------------------------------------------------------------------------------------------------
# generation


def default_step_prompts(tokenizer: Any, dataset: Any) -> list[list[int]]:
    """The prompt ids of the default step: its first 2 questions, each 4 times (a GRPO batch)."""
    ids = [
        list(tokenizer.apply_chat_template(dataset[i]["prompt"], add_generation_prompt=True, tokenize=True,
                                           return_dict=True)["input_ids"])
        for i in range(PROMPTS)
    ]  # fmt: skip
    return [p for p in ids for _ in range(GENERATIONS)]


def generation_config(tokenizer: Any, fixed_length: bool = True) -> Any:
    """TRL's sampling settings of the default node (temperature 1, no top-k/top-p), 48 tokens (all of them when
    ``fixed_length``, so every variant does the same work)."""
    from transformers import GenerationConfig

    return GenerationConfig(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS if fixed_length else 0,
                            do_sample=True, temperature=1.0, top_k=0, top_p=1.0, pad_token_id=tokenizer.pad_token_id,
                            eos_token_id=[tokenizer.eos_token_id], disable_compile=True)  # fmt: skip


def _continuous_batching(model: Any, rows: list[list[int]], config: Any) -> None:
    """TRL's `use_transformers_continuous_batching` path: `generate_batch` on the model, as TRL calls it."""
    from transformers.generation import ContinuousBatchingConfig

    model.generate_batch(rows, generation_config=config, progress_bar=False,
                         continuous_batching_config=ContinuousBatchingConfig(max_memory_percent=0.5))  # fmt: skip


def _gpu_autocast(device: str, bf16: bool) -> Any:
    """bf16 autocast on a GPU, as accelerate wraps a trainer's forward there (``sapo.speed.inference`` autocasts on a
    CPU only); a context that does nothing on the CPU or without ``bf16``."""
    import contextlib

    import torch

    return torch.autocast(device, dtype=torch.bfloat16) if bf16 and device != "cpu" else contextlib.nullcontext()


def time_generation(
    model: Any, tokenizer: Any, rows: list[list[int]], reps: int, bf16: bool, continuous_batching: bool = True,
    device: str = "cpu",
) -> dict[str, Any]:  # fmt: skip
    """Wall and CPU seconds of each generation variant (medians over ``reps`` interleaved repetitions). On a GPU the
    bf16 variants run under bf16 autocast (as the trainers do there), TRL's generate under it is measured too (plain
    TRL's default there), inverse-transform sampling (a CPU speed-up) is left out, and every timing waits for the
    GPU."""
    import torch

    from sapo.speed.generation import generate_completions
    from sapo.speed.inference import inference_context

    config = generation_config(tokenizer)
    eos, pad = [tokenizer.eos_token_id], tokenizer.pad_token_id
    settings = {  # (prefill once, merge adapters, bf16, inverse-transform sampling, bf16 weights packed for oneDNN)
        "today (TRL generate, fp32)": (False, False, False, False, True),
        "prefill once": (True, False, False, False, True), "merged adapters": (False, True, False, False, True),
        "both": (True, True, False, False, True), "both + bf16": (True, True, True, False, True),
        UNPACKED: (True, True, True, True, False),
        "both + bf16 + inverse-transform sampling": (True, True, True, True, True),
    }  # fmt: skip
    notes: dict[str, str] = {}
    if not bf16:
        del settings["both + bf16"], settings[UNPACKED], settings["both + bf16 + inverse-transform sampling"]
    elif device != "cpu":
        del settings[UNPACKED], settings["both + bf16 + inverse-transform sampling"]
        settings["TRL generate + bf16 autocast"] = (False, False, True, False, True)
        notes["both + bf16 + inverse-transform sampling"] = "not measured: inverse-transform sampling applies on a CPU"
    sync = sync_for(device)

    def run(name: str) -> None:
        if name == "TRL continuous batching":
            return _continuous_batching(model, rows, config)
        prefill, merge, low, inverse, pack = settings[name]
        speed_ups = inference_context(model, merge_adapters=merge, bf16=low, pack_weights=pack)
        with torch.no_grad(), speed_ups, _gpu_autocast(device, low):
            generate_completions(model, rows, config, eos, pad, prefill_once=prefill, inverse_transform=inverse)

    names = list(settings)
    times: dict[str, dict[str, list[float]]] = {n: {"wall": [], "cpu": []} for n in names}

    def timed(name: str) -> None:
        if sync is not None:
            sync()
        wall, cpu = time.perf_counter(), time.process_time()
        run(name)
        if sync is not None:
            sync()
        times[name]["wall"].append(time.perf_counter() - wall)
        times[name]["cpu"].append(time.process_time() - cpu)

    for _ in range(reps):
        for name in names:
            timed(name)
    if continuous_batching:  # its first call is its measurement: far slower here, it is not repeated
        cb = "TRL continuous batching"
        times[cb] = {"wall": [], "cpu": []}
        try:
            timed(cb)
            notes[cb] = "one call (its warm-up included), not repeated"
        except Exception as e:  # noqa: BLE001 - reported as a finding: the path does not run here
            del times[cb]
            notes[cb] = f"does not run on this machine: {type(e).__name__}: {str(e)[:200]}"
    result = {n: {k: statistics.median(v) for k, v in t.items()} | {"runs": t} for n, t in times.items()}
    return {"variants": result, "notes": notes}


# ------------------------------------------------------------------------------------------------
# the default node's step


def node_configs(bf16: bool, device: str = "cpu") -> dict[str, dict[str, Any]]:
    """The step configurations: today's node (every speed-up off, 4-row micro-batches), each generation speed-up
    on, bf16 (only where the CPU computes it natively), and the node's defaults: the round in one micro-batch, whose
    prompts the loss pass runs once on a CPU. On a GPU every configuration keeps the node's gradient checkpointing
    there (on), but the loss pass with prompts once (which needs it off, not a GPU default) and one configuration,
    the default without it."""

    def config(prefill: bool, merge: bool, low: bool, micro_batch: int | None = GENERATIONS,
               scoring: bool = False) -> dict[str, Any]:  # fmt: skip
        out = dict(generation_prefill_once=prefill, generation_merge_adapters=merge, bf16=low,
                   per_device_train_batch_size=micro_batch, scoring_prefill_once=scoring)  # fmt: skip
        if device != "cpu":  # None: the node's device default (sapo.speed.devices.device_defaults)
            out["gradient_checkpointing"] = False if scoring else None
        return out

    configs = {
        "node, speed-ups off (today)": config(False, False, False),
        "node, prefill once": config(True, False, False),
        "node, merged adapters": config(False, True, False),
        "node, both": config(True, True, False),
    }
    both = "both + bf16" if bf16 else "both"
    if bf16:
        configs["node, both + bf16"] = config(True, True, True)
    if device == "cpu":
        configs[f"node, {both} + one micro-batch, prompts once (default here)"] = config(
            True, True, bf16, micro_batch=None, scoring=True
        )
    else:
        configs[f"node, {both} + one micro-batch, prompts once"] = config(True, True, bf16, None, scoring=True)
        configs[f"node, {both} + one micro-batch, no gradient checkpointing"] = config(True, True, bf16, None) | {
            "gradient_checkpointing": False
        }
        configs[f"node, {both} + one micro-batch (default here)"] = config(True, True, bf16, micro_batch=None)
    return configs


def _common_args(args: argparse.Namespace, output_dir: str) -> dict[str, Any]:
    """The node's defaults (sapo.node_args.NODE_DEFAULTS) that matter for a step, for every trainer; every completion
    runs to 48 tokens (as in the generation part), so that every configuration does the same work. On a GPU the
    trainers run there, and gradient checkpointing is left to each configuration."""
    device = getattr(args, "device", "cpu")
    common = dict(output_dir=output_dir, num_generations=GENERATIONS,
                  max_completion_length=NEW_TOKENS, learning_rate=2e-4, lr_scheduler_type="constant",
                  max_steps=args.steps, logging_steps=1, report_to="none", save_strategy="no", use_cpu=device == "cpu",
                  gradient_checkpointing=False, seed=args.seed, disable_tqdm=True,
                  generation_kwargs={"min_new_tokens": NEW_TOKENS})  # fmt: skip
    if device != "cpu":
        del common["gradient_checkpointing"]
    return common


def trl_args(bf16: bool, device: str = "cpu") -> dict[str, Any]:
    """Plain TRL's settings beside the common ones, at the node's batch (2 groups of 4, micro-batches of 4): on the
    CPU fp32 without checkpointing; on a GPU TRL's own defaults there (bf16 where measured, gradient checkpointing
    on)."""
    base = dict(per_device_train_batch_size=GENERATIONS, gradient_accumulation_steps=2, beta=0.0, epsilon_high=0.28)
    return base | (dict(bf16=False) if device == "cpu" else dict(bf16=bf16, gradient_checkpointing=True))


def feeder_groups(model: Any, tokenizer: Any, dataset: Any, count: int) -> list[Any]:
    """``count`` groups a second peer publishes: questions of the dataset's tail, completions sampled from the
    model (so the node's plausibility check keeps them), the first one ending with the right answer (so the group's
    rewards differ and the node's zero-advantage filter keeps it). Groups that the node's default hygiene would drop
    (a tiny random model samples control characters) are left out, twice as many questions are sampled for that."""
    import torch

    from sapo.hygiene import CompletionHygiene
    from sapo.publication import published_prompt
    from sapo.speed.generation import generate_completions
    from sapo.speed.inference import inference_context
    from swarm.records import Group, provenance_from_wire

    rows = [dataset[len(dataset) - 1 - j] for j in range(2 * count)]
    ids = [list(tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=True,
                                              return_dict=True)["input_ids"]) for row in rows]  # fmt: skip
    with torch.no_grad(), inference_context(model):
        completions = generate_completions(model, [i for i in ids for _ in range(GENERATIONS)],
                                           generation_config(tokenizer, fixed_length=False),
                                           [tokenizer.eos_token_id], tokenizer.pad_token_id)  # fmt: skip
    texts = tokenizer.batch_decode(completions, skip_special_tokens=True)
    groups, hygiene = [], CompletionHygiene()
    for j, row in enumerate(rows):
        group = texts[j * GENERATIONS : (j + 1) * GENERATIONS]
        # The answer within the node's NEW_TOKENS, or it is cut off and scored as cut: the sample's start, then it.
        answer = f"\n<answer>{row['answer']}</answer>"
        room = max(NEW_TOKENS - len(tokenizer(answer, add_special_tokens=False)["input_ids"]) - 2, 0)
        head = tokenizer.decode(completions[j * GENERATIONS][:room], skip_special_tokens=True)
        group[0] = f"{head.strip()}{answer}"
        if hygiene.group_problem(group) is not None:
            continue
        groups.append(Group(group_id=f"feed-{j}", prompt=published_prompt(row["prompt"]), completions=group,
                            provenance=provenance_from_wire(json.loads(row["provenance"])), metadata={},
                            model="feeder", step=0, created_at=time.time()))  # fmt: skip
    if len(groups) < count:
        raise RuntimeError(f"the feeder made {len(groups)} groups that pass the node's hygiene, {count} needed")
    return groups[:count]


def run_steps(args: argparse.Namespace, model: Any, tokenizer: Any, dataset: Any, bf16: bool,
              workdir: Path) -> dict[str, Any]:  # fmt: skip
    """Train every configuration ``args.steps`` steps, taking turns step by step; per-step records."""
    import torch
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl import GRPOConfig

    from rewards import format_reward, reasoning_gym_reward
    from sapo.config import SAPOConfig
    from sapo.models import LoraSpec, lora_config
    from sapo.trainer import SAPOTrainer
    from swarm import MemorySwarm

    device = getattr(args, "device", "cpu")
    configs = node_configs(bf16, device)
    names = [*configs, "plain TRL GRPOTrainer"]
    swarm = MemorySwarm()
    feeder = swarm.join("feeder")
    pool = feeder_groups(model, tokenizer, dataset, args.steps * len(configs))

    class Feed(TrainerCallback):  # one fresh group from the second peer before each of the node's steps
        def on_step_begin(self, *a, **kw):
            feeder.publish([dataclasses.replace(pool.pop(), created_at=time.time())])

    baton, cpu, trainers, turns = Baton(names), {}, {}, {}

    def on_step(name: str) -> None:
        cpu.setdefault(name, []).append(time.process_time() - cpu_start[name])

    cpu_start: dict[str, float] = {}

    class CpuStart(TrainerCallback):
        def __init__(self, name):
            self.name = name

        def on_step_begin(self, *a, **kw):
            cpu_start[self.name] = time.process_time()

    class WaitForGpu(TrainerCallback):  # a step's wall time ends when the GPU has done its work
        def on_step_end(self, *a, **kw):
            torch.cuda.synchronize()

    peft = lora_config(LoraSpec(r=16, alpha=32, dropout=0.0))
    timed_trl = timed_grpo_trainer_class()
    for name in names:
        common = _common_args(args, str(workdir / name.replace(" ", "_").replace(",", "")))
        turns[name] = make_turn_callback(name, baton, 1, on_step)
        callbacks = [*([WaitForGpu()] if device != "cpu" else []), turns[name], CpuStart(name)]
        if name in configs:
            trainers[name] = SAPOTrainer(
                model=copy.deepcopy(model), reward_funcs=[reasoning_gym_reward, format_reward],
                # publish_groups off: the configurations share one in-memory swarm, whose newest-first fetch would
                # hand each node the others' groups instead of the feeder's (publishing there costs microseconds)
                args=SAPOConfig(**common, num_local=1, num_external=1, publish_groups=False, **configs[name]),
                train_dataset=dataset,
                processing_class=tokenizer, swarm=swarm.join(f"node-{len(trainers)}"), peft_config=peft,
                callbacks=[Feed(), *callbacks],
            )  # fmt: skip
        else:
            trainers[name] = timed_trl(
                model=copy.deepcopy(model), reward_funcs=[reasoning_gym_reward, format_reward],
                args=GRPOConfig(**common, **trl_args(bf16, device)), train_dataset=dataset,
                processing_class=tokenizer, peft_config=peft, callbacks=callbacks,
            )  # fmt: skip
        trainers[name].remove_callback(PrinterCallback)
        trainers[name].remove_callback(ProgressCallback)
        if device != "cpu":
            _wait_after_backward(trainers[name])
    train_in_turns({name: trainers[name] for name in names}, baton, [])
    return {name: step_records(trainers[name], turns[name].wall, cpu.get(name, [])) for name in names}


def _wait_after_backward(trainer: Any) -> None:
    """Make ``trainer``'s backward pass wait for the GPU, so that TRL's ``step_time`` (hence the training pass of the
    split) holds the backward's GPU work, not only its launch."""
    import torch

    backward = trainer.accelerator.backward

    def waited(*args: Any, **kwargs: Any) -> Any:
        out = backward(*args, **kwargs)
        torch.cuda.synchronize()
        return out

    trainer.accelerator.backward = waited


def step_records(trainer: Any, wall: dict[int, float], cpu: list[float]) -> list[dict[str, float]]:
    """Per optimizer step: the split (seconds), wall and CPU seconds, external groups taken."""
    records = []
    entries = [e for e in trainer.state.log_history if "step_time" in e and "train_runtime" not in e]
    for index, entry in enumerate(entries):
        phase = {p: float(entry.get(f"sapo/time/{p}") or 0.0) for p in ("generation", "scoring", "plausibility")}
        swarm = sum(float(entry.get(f"sapo/time/{p}") or 0.0) for p in SWARM_PHASES)
        step_time, step_wall = float(entry["step_time"]), wall.get(entry["step"])
        split = {**phase, "swarm": swarm, "training pass": step_time - sum(phase.values()) - swarm}
        split["optimizer and rest"] = max(0.0, (step_wall or step_time) - step_time)
        records.append({"step": entry["step"], "wall": step_wall, "cpu": cpu[index] if index < len(cpu) else None,
                        "external_groups": entry.get("sapo/external_groups", 0.0),
                        "completion_tokens": entry.get("completions/mean_length"), **split})  # fmt: skip
    return records


def summarize_steps(records: list[dict[str, float]], swarm_groups: int, warmup: int = 1) -> dict[str, Any]:
    """Medians over the steps after the first ``warmup`` ones (the node's first step has no swarm group: its own
    groups become the plausibility reference) that trained on ``swarm_groups`` swarm groups: a step whose swarm group
    was dropped generates a group more in its place and trains on the same rows, another step than the one compared.
    With no such step, every step after the first is used (``steps_measured`` says how many were)."""
    after = records[warmup:] or records
    measured = [r for r in after if int(r["external_groups"] or 0) == swarm_groups] or after
    out = {key: statistics.median([float(r[key] or 0.0) for r in measured]) for key in (*SPLIT, "wall", "cpu")}
    out["external_groups"] = statistics.median([float(r["external_groups"] or 0.0) for r in measured])
    out["steps_measured"] = len(measured)
    out["steps_after_first"] = len(after)
    return out


# ------------------------------------------------------------------------------------------------
# the run


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.step_limit", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="a tiny random model, 2 steps and brief machine timings: a smoke test"
    )
    parser.add_argument("--model", default=None, help="model directory (default: the embedded SmolLM2-135M)")
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="where the models and trainers run (cuda: the first GPU, as a node runs there)",
    )
    parser.add_argument(
        "--random-weights",
        action="store_true",
        help="random weights of the model's shapes (only its config and tokenizer are read): timings only",
    )
    parser.add_argument(
        "--export-shapes",
        type=Path,
        default=None,
        metavar="DIR",
        help="write the default model's config and tokenizer (no weights) into DIR and exit",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads (default: torch's, the cores; not set with --device cuda)",
    )
    parser.add_argument("--reps", type=int, default=None, help="generation repetitions (default 3, quick 1)")
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps per configuration (default 4)")
    parser.add_argument("--bf16", choices=("auto", "on", "off"), default="auto",
                        help="measure bf16 variants: auto (where the CPU computes bf16 natively), on, off")  # fmt: skip
    parser.add_argument(
        "--skip-continuous-batching", action="store_true", help="leave out TRL's continuous-batching path (slow here)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    args.reps = args.reps or (1 if args.quick else 3)
    args.steps = args.steps or (2 if args.quick else 4)
    return args


def load_model(args: argparse.Namespace, workdir: Path) -> tuple[Any, Any, Any]:
    """(the policy, a copy with the node's LoRA adapters, its tokenizer), on ``args.device``; the adapters' B matrices
    are drawn small and non-zero, as after training. With ``args.random_weights`` the policy has the model's shapes and
    random weights (float32, as the node loads the default model on either device)."""
    import torch
    from peft import get_peft_model

    from sapo.models import LoraSpec, default_model_path, load_policy, lora_config, save_tiny_model

    path = args.model or (save_tiny_model(workdir / "tiny") if args.quick else None)
    if getattr(args, "random_weights", False):
        model, tokenizer = random_policy(path or default_model_path(), args.seed)
    else:
        model, tokenizer = load_policy(path)
    model = model.to(getattr(args, "device", "cpu"))
    lora = get_peft_model(copy.deepcopy(model), lora_config(LoraSpec(r=16, alpha=32, dropout=0.0)))
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 1e-3)
    return model, lora, tokenizer


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages."""
    return list(os.getloadavg())


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Everything the report shows."""
    import torch

    from sapo.speed.devices import cpu_has_native_bf16
    from sapo.tasks import DEFAULT_TASKS, build_reasoning_gym_dataset

    warnings.filterwarnings("ignore")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    device = getattr(args, "device", "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("step_limit: --device cuda, but torch sees no CUDA GPU")
    if args.threads and device == "cpu":
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    native_bf16 = cpu_has_native_bf16() if device == "cpu" else torch.cuda.is_bf16_supported()
    bf16 = {"auto": native_bf16, "on": True, "off": False}[args.bf16]
    started, load_start = time.monotonic(), load_average()
    with tempfile.TemporaryDirectory(prefix="step-limit-") as tmp:
        workdir = Path(tmp)
        base, lora, tokenizer = load_model(args, workdir)
        # the feeder samples twice as many questions from the tail as the node configurations take steps
        size = max(64, 2 * args.steps * len(node_configs(bf16, device)) + PROMPTS)
        dataset = build_reasoning_gym_dataset(DEFAULT_TASKS, size=size, seed=args.seed)
        rows = default_step_prompts(tokenizer, dataset)
        prompt = round(statistics.mean(len(r) for r in rows))
        config = base.config
        where = f"{torch.get_num_threads()} threads" if device == "cpu" else torch.cuda.get_device_name(0)
        print(f"step_limit: measuring the machine ({where})", flush=True)
        shape_rows = {"decode": len(rows), "prefill": PROMPTS * prompt, "train": len(rows) * (prompt + NEW_TOKENS)}
        dtypes = [torch.float32, *([torch.bfloat16] if bf16 else [])]
        limits = machine_limits(config, shape_rows, dtypes, device, quick=args.quick)
        print("step_limit: generation variants", flush=True)
        generation = time_generation(lora, tokenizer, rows, args.reps, bf16, not args.skip_continuous_batching,
                                     device)  # fmt: skip
        print("step_limit: training steps", flush=True)
        steps = run_steps(args, base, tokenizer, dataset, bf16, workdir)
    bounds = {str(d).replace("torch.", ""): phase_bounds(config, limits, str(d).replace("torch.", ""), prompt,
                                                          NEW_TOKENS) for d in dtypes}  # fmt: skip
    model = args.model or ("tiny" if args.quick else "SmolLM2-135M-Instruct")
    return {
        "settings": {
            "quick": args.quick,
            "model": model + (f" ({RANDOM_WEIGHTS_NOTE})" if getattr(args, "random_weights", False) else ""),
            "random_weights": bool(getattr(args, "random_weights", False)),
            "device": device,
            "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None,
            "threads": torch.get_num_threads(),
            "reps": args.reps,
            "steps": args.steps,
            "seed": args.seed,
            "bf16_measured": bf16,
            "native_bf16": native_bf16,
            "prompt_tokens_mean": prompt,
            "rows": len(rows),
            "new_tokens": NEW_TOKENS,
        },  # fmt: skip
        "limits": limits,
        "bounds": bounds,
        "generation": generation,
        "steps": steps,
        "step_summary": {
            name: summarize_steps(records, swarm_groups=1 if name.startswith("node") else 0)
            for name, records in steps.items()
        },
        "load_average": {"start": load_start, "end": load_average()},
        "elapsed_seconds": time.monotonic() - started,
    }


def main(argv: list[str] | None = None) -> int:
    """Run, write the report, print its path."""
    args = parse_args(argv)
    if args.export_shapes is not None:
        print(f"wrote {export_shapes(args.export_shapes)}")
        return 0
    record, git = run_record(), git_state()  # the code that runs: the tree as it is now, before the long run
    data = run(args)
    data["record"], data["git"] = record, git
    paths = write_report(args.output_dir, "step_limit", data, report_lines(data, data["record"]))
    plot(data, args.output_dir / "step_limit.png")
    print("\n".join(report_lines(data, data["record"])))
    print(f"wrote {paths['md']}, {paths['json']}, {args.output_dir / 'step_limit.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
