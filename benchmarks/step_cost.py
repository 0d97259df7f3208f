"""What the swarm costs in a training step: step time of a SAPO peer (4/4 and 8/0) against plain TRL.

In one process, from the same weights, dataset and seed, three trainers take turns, ``--steps-per-turn``
optimizer steps each (A, B, C, A, B, C, ...), so machine noise spreads over all three:

- ``sapo 4/4``: SAPOTrainer, 4 local + 4 external groups, on a real hivemind DHT;
- ``sapo 8/0``: SAPOTrainer, 8 local groups, publishing to the same DHT peer (the same peer at 8/0);
- ``trl``: plain ``trl.GRPOTrainer`` at the same batch (8 groups), timed by a thin subclass that only wraps
  ``_generate`` and ``_calculate_rewards`` with a timer.

For the 4/4 peer to take external groups, a feeder process (benchmarks/feeder.py) runs a second DHT peer on
127.0.0.1 and publishes realistic groups at a steady rate.

Each step is split into generation, scoring, swarm (publish + swarm fetch + external scoring) and
training. TRL's ``step_time`` is the wall time of ``training_step`` over the round's micro-batches
(generation, scoring and forward/backward, not the optimizer step); training = step_time - generation -
scoring - swarm. The wall time of the whole optimizer step (step begin to step end callbacks, optimizer
included) is reported beside it. Medians over the steps after the first (warm-up) one.

Usage:
    python -m benchmarks.step_cost                 # default model (about 30 min on 2 cores)
    python -m benchmarks.step_cost --quick         # tiny model, 2 steps each, seconds

A node's memory is measured by ``python -m benchmarks.node_memory`` (``--part memory`` here still runs it).

Writes ``step_cost.{json,md,png}`` into ``--output-dir`` (default benchmarks/results). A rerun with the same
settings as the saved results does nothing (``--force`` reruns). Every process and DHT peer it starts is stopped,
also on failure.
"""

from __future__ import annotations

import argparse
import copy
import os
import random
import statistics
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.feeder import Feeder, plausible_completion
from benchmarks.harness import (
    RESULTS,
    cpu_seconds,
    model_label,
    run_record,
    saved_settings_match,
)
from benchmarks.step_cost_report import SPLIT, STEP_NOTES, fmt_value, ratio, step_cost_table, write_step_cost

CONFIGS = ("sapo 4/4", "sapo 8/0", "trl")
PHASES = ("generation", "scoring", "swarm_fetch", "external_scoring", "publish")
SWARM_PHASES = ("publish", "swarm_fetch", "external_scoring")
EXTRA_TIMED = ("select", "retokenize")  # benchmark-side timers inside the SAPO step, left in "training"


# ------------------------------------------------------------------------------------------------
# statistics


def median(values: Sequence[float]) -> float | None:
    """Median of ``values``; None when empty."""
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def step_split(step: dict[str, float]) -> dict[str, float]:
    """One step's split: generation, scoring, swarm (publish + swarm fetch + external scoring) and
    training = TRL's step_time minus the three others."""
    phases = {p: float(step.get(p) or 0.0) for p in PHASES}
    swarm = sum(phases[p] for p in SWARM_PHASES)
    training = float(step["step_time"]) - phases["generation"] - phases["scoring"] - swarm
    if training < 0:  # the timed phases overlap, or step_time is not the whole step: the split would be a lie
        raise ValueError(
            f"timed phases ({float(step['step_time']) - training:.3f} s) exceed the step time "
            f"({float(step['step_time']):.3f} s)"
        )
    return {"generation": phases["generation"], "scoring": phases["scoring"], "swarm": swarm, "training": training}


def summarize(steps: list[dict[str, float]], warmup: int = 1) -> dict[str, Any]:
    """Medians of one configuration's steps after the first ``warmup`` ones.

    ``split`` holds the median of each phase and training = median(step_time) - the other phases' medians,
    so the split adds up to the median step time; ``split_of_steps`` holds the medians of each per-step
    split (those need not add up); ``swarm_share`` = split swarm / median step time.
    """
    measured = steps[warmup:]
    if not measured:
        raise ValueError(f"no measured steps: {len(steps)} steps, {warmup} warm-up")
    step_time = median([s["step_time"] for s in measured])
    phases = {p: median([float(s.get(p) or 0.0) for s in measured]) for p in PHASES}
    extra = {p: median([float(s.get(p) or 0.0) for s in measured]) for p in EXTRA_TIMED}
    swarm = sum(phases[p] for p in SWARM_PHASES)
    split = {
        "generation": phases["generation"],
        "scoring": phases["scoring"],
        "swarm": swarm,
        "training": step_time - phases["generation"] - phases["scoring"] - swarm,
    }
    per_step = [step_split(s) for s in measured]
    return {
        "steps_measured": len(measured),
        "step_time": step_time,
        "step_time_min_max": [min(s["step_time"] for s in measured), max(s["step_time"] for s in measured)],
        "wall": median([s.get("wall") for s in measured]),
        "phases": phases,
        "extra_timed": extra,
        "split": split,
        "split_of_steps": {k: median([d[k] for d in per_step]) for k in SPLIT},
        "swarm_share": ratio(swarm, step_time),
        "external_groups": median([s.get("external_groups") for s in measured]),
        "fill_ins": median([s.get("fill_ins") for s in measured]),
        "completion_tokens": median([s.get("completion_tokens") for s in measured]),
    }


def ratios(summaries: dict[str, dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Step-time ratios between configurations (TRL step_time and wall time)."""
    pairs = [("sapo 4/4", "trl"), ("sapo 8/0", "trl"), ("sapo 4/4", "sapo 8/0")]
    out = {}
    for a, b in pairs:
        if a in summaries and b in summaries:
            out[f"{a} / {b}"] = {key: ratio(summaries[a][key], summaries[b][key]) for key in ("step_time", "wall")}
    return out


# ------------------------------------------------------------------------------------------------
# taking turns


class Aborted(Exception):
    """Another trainer failed: this one stops at its next step."""


class Baton:
    """Whose turn it is among trainers running in threads; one trainer computes at a time."""

    def __init__(self, order: Sequence[str]):
        self._cond = threading.Condition()
        self._active = list(order)
        self.turn: str | None = self._active[0] if self._active else None
        self.aborted = False
        self.history: list[str] = []  # names in the order their steps ran

    def wait(self, name: str, timeout: float = 7200) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: self.aborted or self.turn == name, timeout):
                raise TimeoutError(f"{name} waited {timeout:.0f} s for its turn")
            if self.aborted:
                raise Aborted(name)
            self.history.append(name)

    def pass_on(self, name: str) -> None:
        """Give the turn to the next active trainer (if ``name`` holds it)."""
        with self._cond:
            if self.turn == name and self._active:
                i = self._active.index(name)
                self.turn = self._active[(i + 1) % len(self._active)]
                self._cond.notify_all()

    def finish(self, name: str) -> None:
        """``name`` is done: pass the turn on and leave the rotation."""
        with self._cond:
            if name in self._active:
                if self.turn == name:
                    i = self._active.index(name)
                    rest = self._active[i + 1 :] + self._active[:i]
                    self.turn = rest[0] if rest else None
                self._active.remove(name)
            self._cond.notify_all()

    def abort(self) -> None:
        with self._cond:
            self.aborted = True
            self._cond.notify_all()


def make_turn_callback(name: str, baton: Baton, steps_per_turn: int, on_step: Callable[[str], None]):
    """A TrainerCallback that waits for ``name``'s turn before a step, passes it on after
    ``steps_per_turn`` steps, and records each step's wall time (step begin to step end)."""
    from transformers import TrainerCallback

    class TakeTurns(TrainerCallback):
        def __init__(self) -> None:
            self.in_turn = 0
            self.started = 0.0
            self.wall: dict[int, float] = {}

        def on_step_begin(self, args, state, control, **kwargs):
            if self.in_turn >= steps_per_turn:
                baton.pass_on(name)
                self.in_turn = 0
            baton.wait(name)
            self.started = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.wall[state.global_step] = time.perf_counter() - self.started
            self.in_turn += 1
            on_step(name)

    return TakeTurns()


# ------------------------------------------------------------------------------------------------
# trainers


def train_in_turns(trainers: dict[str, Any], baton: Baton, threads: list[threading.Thread]) -> None:
    """Train each trainer in a thread of its own, the baton passing turns between them, until all have finished.

    The threads are appended to ``threads`` (so that a caller's cleanup can join them after an abort). The first
    trainer to fail aborts the others, and its error is raised here, naming the trainer."""
    errors: dict[str, BaseException] = {}

    def train(name: str) -> None:
        try:
            trainers[name].train()
        except Aborted:
            pass
        except BaseException as e:  # noqa: BLE001 - raised by the main thread below
            errors[name] = e
            baton.abort()
        finally:
            baton.finish(name)

    for name in trainers:
        threads.append(threading.Thread(target=train, args=(name,), name=f"bench-{name}", daemon=True))
        threads[-1].start()
    for thread in threads:
        thread.join()
    if errors:
        name, error = next(iter(errors.items()))
        raise RuntimeError(f"trainer {name!r} failed: {type(error).__name__}: {error}") from error


def timed_grpo_trainer_class():
    """``trl.GRPOTrainer`` with the same phase timers as SAPOTrainer around generation and scoring."""
    from trl import GRPOTrainer

    class TimedGRPOTrainer(GRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            if not self.model.training:
                return super()._generate_and_score_completions(inputs)
            self._bench_seconds = {}
            output = super()._generate_and_score_completions(inputs)
            for phase, seconds in self._bench_seconds.items():
                self._metrics["train"][f"sapo/time/{phase}"].append(seconds)
            return output

        def _timed_call(self, phase, fn, *args):
            start = time.perf_counter()
            try:
                return fn(*args)
            finally:
                seconds = getattr(self, "_bench_seconds", {})
                seconds[phase] = seconds.get(phase, 0.0) + time.perf_counter() - start

        def _generate(self, prompts):
            return self._timed_call("generation", super()._generate, prompts)

        def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
            return self._timed_call(
                "scoring", super()._calculate_rewards, inputs, prompts, completions, completion_ids_list
            )

    return TimedGRPOTrainer


def timed_sapo_trainer_class():
    """SAPOTrainer plus a benchmark-side timer in its phase table: the sampler's choice (``select``)."""
    from sapo.trainer import SAPOTrainer

    class TimedSampler:
        def __init__(self, inner, seconds):
            self.inner, self.seconds = inner, seconds

        def select(self, *args, **kwargs):
            start = time.perf_counter()
            try:
                return self.inner.select(*args, **kwargs)
            finally:
                self.seconds["select"] += time.perf_counter() - start

        def __getattr__(self, name):
            return getattr(self.inner, name)

    class TimedSAPOTrainer(SAPOTrainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.intake.sampler = TimedSampler(self.intake.sampler, self._phase_seconds)

    return TimedSAPOTrainer


def bench_settings(args: argparse.Namespace) -> dict[str, Any]:
    """Everything that defines a step-cost result: a rerun with the same settings may skip the part."""
    return {
        "model": model_label(args.quick, args.model),
        "quick": args.quick,
        "steps": args.steps,
        "steps_per_turn": args.steps_per_turn,
        "num_generations": args.num_generations,
        "groups": 8,
        "per_device_train_batch_size": args.per_device_train_batch_size,
        "max_completion_length": args.max_completion_length,
        "seed": args.seed,
        "feeder_interval": args.feeder_interval,
    }


def training_args(kind: str, args: argparse.Namespace, output_dir: str):
    """The config of one of the three trainers: identical GRPO settings, bf16 off, no gradient checkpointing."""
    from trl import GRPOConfig

    from sapo.config import SAPOConfig

    rows = 8 * args.num_generations
    common = dict(
        output_dir=output_dir,
        num_generations=args.num_generations,
        per_device_train_batch_size=args.per_device_train_batch_size,
        max_completion_length=args.max_completion_length,
        learning_rate=5e-6,
        beta=0.0,
        epsilon=0.2,
        epsilon_high=0.28,
        max_steps=args.steps,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        bf16=False,  # GRPOConfig turns bf16 autocast on by default; on this CPU that is ~8x slower
        gradient_checkpointing=False,
        seed=args.seed,
        disable_tqdm=True,
    )
    if kind == "sapo 4/4":
        return SAPOConfig(**common, num_local=4, num_external=4)
    if kind == "sapo 8/0":
        return SAPOConfig(**common, num_local=8, num_external=0)
    return GRPOConfig(**common, gradient_accumulation_steps=rows // args.per_device_train_batch_size)


def quiet_libraries() -> None:
    """No library progress bars or notices between our own progress bar's lines."""
    from transformers.utils import logging as hf_logging

    warnings.filterwarnings("ignore", category=FutureWarning)  # transformers 5's renamed-argument notices
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def load_model(args: argparse.Namespace, workdir: Path) -> tuple[Any, Any]:
    """(model, tokenizer): ``--model``, the embedded default, or (``--quick``) a tiny random model."""
    from sapo.models import load_policy, save_tiny_model

    if args.model or not args.quick:
        return load_policy(args.model)
    return load_policy(save_tiny_model(workdir / "tiny-model"))


def per_step_records(trainer, wall: dict[int, float]) -> list[dict[str, float]]:
    """One record per optimizer step from the trainer's log history."""
    steps = []
    for entry in trainer.state.log_history:
        if "step_time" not in entry or "train_runtime" in entry:
            continue
        record = {"step": entry["step"], "step_time": entry["step_time"], "wall": wall.get(entry["step"])}
        for phase in PHASES + EXTRA_TIMED:
            record[phase] = entry.get(f"sapo/time/{phase}", 0.0) or 0.0
        for key, name in (
            ("sapo/external_groups", "external_groups"),
            ("sapo/fill_ins", "fill_ins"),
            ("completions/mean_length", "completion_tokens"),
            ("reward", "reward"),
        ):
            if entry.get(key) is not None:
                record[name] = entry[key]
        steps.append(record)
    return steps


def run_step_cost(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Build the three trainers, let them take turns on the CPU, return per-step records and summaries."""
    import torch
    from tqdm.auto import tqdm
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    from rewards import format_reward, reasoning_gym_reward
    from sapo.tasks import DEFAULT_TASKS, build_reasoning_gym_dataset
    from swarm.dht import DHTTransport, DHTTransportConfig

    torch.manual_seed(args.seed)
    model, tokenizer = load_model(args, workdir)
    dataset = build_reasoning_gym_dataset(DEFAULT_TASKS, size=max(256, 8 * args.steps * 2), seed=args.seed)
    max_chars = int(args.max_completion_length * args.chars_per_token)

    feeder = swarm = None
    threads: list[threading.Thread] = []
    baton = Baton(CONFIGS)
    try:
        feeder = Feeder(args.num_generations, max_chars, args.feeder_interval)
        swarm = DHTTransport(DHTTransportConfig(initial_peers=[feeder.address], model_name="bench-peer"))
        deadline = time.monotonic() + 120
        while swarm.readout().gauges["cached_groups"] < 16 and time.monotonic() < deadline:
            time.sleep(0.5)  # the 4/4 peer's first round should find a full candidate pool

        timed_sapo, timed_trl = timed_sapo_trainer_class(), timed_grpo_trainer_class()
        progress = tqdm(total=len(CONFIGS) * args.steps, desc="steps", unit="step", dynamic_ncols=True)
        lock = threading.Lock()

        def on_step(name: str) -> None:
            with lock:
                progress.set_postfix_str(name)
                progress.update(1)

        trainers, callbacks = {}, {}
        for name in CONFIGS:
            config = training_args(name, args, str(workdir / name.replace(" ", "_").replace("/", "-")))
            callbacks[name] = make_turn_callback(name, baton, args.steps_per_turn, on_step)
            cls = timed_trl if name == "trl" else timed_sapo
            extra = {} if name == "trl" else {"swarm": swarm}
            trainers[name] = cls(
                model=copy.deepcopy(model),
                reward_funcs=[reasoning_gym_reward, format_reward],
                args=config,
                train_dataset=dataset,
                processing_class=tokenizer,
                callbacks=[callbacks[name]],
                **extra,
            )
        for trainer in trainers.values():  # our progress bar replaces the per-step log lines
            trainer.remove_callback(PrinterCallback)
            trainer.remove_callback(ProgressCallback)
        del model

        swarm_thread = swarm.peer.thread_id  # the DHT peer's background thread, for its CPU time
        cpu_start = {
            "swarm_thread": cpu_seconds(os.getpid(), swarm_thread),
            "p2pd": cpu_seconds(swarm.p2pd_pid),
            "feeder": feeder.cpu_seconds(),
            "process": cpu_seconds(os.getpid()),
        }
        started = time.monotonic()
        train_in_turns({name: trainers[name] for name in CONFIGS}, baton, threads)
        elapsed = time.monotonic() - started
        progress.close()
        cpu = {
            "swarm_thread": cpu_seconds(os.getpid(), swarm_thread) - cpu_start["swarm_thread"],
            "p2pd": cpu_seconds(swarm.p2pd_pid) - cpu_start["p2pd"],
            "feeder": feeder.cpu_seconds() - cpu_start["feeder"],
            "process": cpu_seconds(os.getpid()) - cpu_start["process"],
        }
        swarm_counters = swarm.readout().counters
        sapo_totals = {name: dict(trainers[name].swarm_totals) for name in CONFIGS if name != "trl"}
    finally:
        baton.abort()
        for thread in threads:
            thread.join(timeout=60)
        if swarm is not None:
            swarm.close()
        if feeder is not None:
            feeder.close()

    steps = {name: per_step_records(trainers[name], callbacks[name].wall) for name in CONFIGS}
    summaries = {name: summarize(steps[name]) for name in CONFIGS}
    feeder_tokens = _feeder_completion_tokens(tokenizer, args, max_chars)
    return {
        "settings": bench_settings(args),
        "order": baton.history,
        "elapsed_seconds": elapsed,
        "steps": steps,
        "summary": summaries,
        "ratios": ratios(summaries),
        "background_cpu_seconds": cpu,
        "background_cpu_cores": {k: v / elapsed for k, v in cpu.items()},
        "swarm_counters": swarm_counters,
        "sapo_totals": sapo_totals,
        "feeder_completion_tokens_median": feeder_tokens,
    }


def _feeder_completion_tokens(tokenizer, args: argparse.Namespace, max_chars: int) -> float:
    """Median token length (this tokenizer) of completions the feeder makes, to compare with the local ones."""
    rng = random.Random(0)
    texts = [plausible_completion("What is 12 + 30 in base 7?", "42", rng, max_chars) for _ in range(64)]
    return statistics.median(len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts)


# ------------------------------------------------------------------------------------------------
# outputs


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The benchmark's options, with the defaults that depend on ``--quick`` filled in."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny model, 2 steps per configuration, seconds")
    parser.add_argument(
        "--part",
        choices=("steps", "memory"),
        default="steps",
        help="steps: this benchmark; memory: runs benchmarks/node_memory.py (its own command now)",
    )
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps per configuration (first = warm-up)")
    parser.add_argument("--steps-per-turn", type=int, default=1, help="steps a trainer takes before the next")
    parser.add_argument("--model", default=None, help="local HF model directory (default: the embedded default)")
    parser.add_argument("--num-generations", type=int, default=None, help="G (default 4, quick 2)")
    parser.add_argument("--per-device-train-batch-size", type=int, default=None, help="default 8 (quick: 8 G)")
    parser.add_argument("--max-completion-length", type=int, default=None, help="default 128 (quick: 8)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--feeder-interval", type=float, default=None, help="seconds between feeder publishes")
    parser.add_argument(
        "--chars-per-token", type=float, default=3.7, help="characters per token of the feeder's completions"
    )
    parser.add_argument("--output-dir", default=str(RESULTS))
    parser.add_argument("--force", action="store_true", help="rerun even if results with these settings are saved")
    # --part memory only, handed to benchmarks/node_memory.py as --steps, --timeout, --sample-interval
    parser.add_argument("--memory-steps", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--memory-timeout", type=float, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--sample-interval", type=float, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.steps is None:
        args.steps = 2 if args.quick else 9
    if args.num_generations is None:
        args.num_generations = 2 if args.quick else 4
    if args.per_device_train_batch_size is None:  # quick: the whole round in one micro-batch
        args.per_device_train_batch_size = 8 * args.num_generations if args.quick else 8
    if args.max_completion_length is None:
        args.max_completion_length = 8 if args.quick else 128
    if args.feeder_interval is None:
        args.feeder_interval = 1.0 if args.quick else 5.0
    if args.steps < 2:
        parser.error("--steps must be at least 2 (the first step is a warm-up)")
    return args


def node_memory_argv(args: argparse.Namespace) -> list[str]:
    """The ``benchmarks/node_memory.py`` arguments that ``--part memory`` stands for."""
    argv = ["--output-dir", args.output_dir]
    for flag, value in (
        ("--model", args.model),
        ("--steps", args.memory_steps),
        ("--timeout", args.memory_timeout),
        ("--sample-interval", args.sample_interval),
    ):
        if value is not None:
            argv += [flag, str(value)]
    return argv + ["--quick"] * args.quick + ["--force"] * args.force


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the benchmark, write the report, print the table; the result, or {} when skipped."""
    args = parse_args(argv)
    if args.part == "memory":
        from benchmarks import node_memory

        print("step_cost: --part memory is now its own command: python -m benchmarks.node_memory", flush=True)
        return node_memory.main(node_memory_argv(args))
    out = Path(args.output_dir)
    if not args.force and saved_settings_match(out / "step_cost.json", bench_settings(args)):
        print(f"step cost: results with these settings already in {out / 'step_cost.json'}; skipped")
        return {}
    quiet_libraries()
    record = run_record()  # at the start: the commit the measured code ran on
    record["load_average_at_start"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    with tempfile.TemporaryDirectory(prefix="step-cost-") as tmp:
        result = run_step_cost(args, Path(tmp))
    result.update(record)
    result["setup"] = (
        f"{result['settings']['model']}, CPU, G={args.num_generations}, 8 groups per round "
        f"({8 * args.num_generations} completions), per-device batch {args.per_device_train_batch_size} "
        f"(one round = one optimizer step), max_completion_length {args.max_completion_length}, "
        f"{args.steps} steps per configuration ({args.steps_per_turn} per turn), seed {args.seed}, "
        f"feeder publishes 4 groups every {args.feeder_interval:g} s"
    )
    write_step_cost(result, out, STEP_NOTES)
    print("\n".join(step_cost_table(result)))
    for pair, r in result["ratios"].items():
        print(f"{pair}: step_time {fmt_value(r['step_time'], '{:.3f}')}, wall {fmt_value(r['wall'], '{:.3f}')}")
    return result


if __name__ == "__main__":
    main()
