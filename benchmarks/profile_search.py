"""The CPU profile search: settings under which one node, training alone, raises its held-out pass@1.

Each run trains the embedded SmolLM2-135M-Instruct with `SAPOTrainer` alone (J = 0, no swarm) for `--steps`
steps and measures greedy pass@1 on `--questions` held-out questions (`sapo.tasks.build_held_out_dataset`:
generator seeds training never uses) at step 0, halfway and at the end. A setting *learns* when the end's
pass@1 exceeds step 0's by more than two standard errors of the paired (per-question) difference.

    python -m benchmarks.profile_search                         # every setting, seeds 0 and 1, resumable
    python -m benchmarks.profile_search --settings lora-mix --seeds 0,1,2
    python -m benchmarks.profile_search --report-only           # the table and plot from the runs so far
    python -m benchmarks.profile_search --timing 8 --settings lora-mix-small   # s/step alone (no evaluation)

One JSON per run goes to RESULTS_DIR/profile_search/<setting>-seed<S>.json (with the commit it ran on and
whether the tree was clean); a run whose file exists is not run again. Each run is its own process. The
report is RESULTS_DIR/profile_search.{md,png}.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.harness import ROOT, code_label, git_state, json_safe, machine, pyplot
from benchmarks.results_archive import restored


@dataclass(frozen=True)
class Setting:
    """One candidate CPU profile."""

    name: str
    tasks: str  # "mix" (sapo.tasks.DEFAULT_TASKS) or one default-mix task name
    lora_r: int  # 0: full fine-tuning
    learning_rate: float
    num_generations: int
    groups_per_step: int
    max_completion_length: int
    lr_scheduler_type: str = "constant"
    rewards: tuple[str, ...] = ("reasoning_gym", "format")
    bf16: bool | None = None  # None: as the machine decides (sapo.speed.devices.device_defaults)


SETTINGS = {
    s.name: s
    for s in (
        Setting("lora-mix-small", "mix", 16, 2e-4, 4, 2, 48),
        Setting("lora-mix", "mix", 16, 2e-4, 8, 2, 64),
        Setting("full-mix", "mix", 0, 2e-5, 8, 2, 64),
        Setting("lora-arith", "basic_arithmetic", 16, 2e-4, 8, 2, 64),
        Setting("node-default", "mix", 0, 5e-6, 4, 4, 128, lr_scheduler_type="linear"),
        # The bf16 learning check (issue 27): the node's profile with bf16 autocast forced off and on, paired seeds.
        Setting("lora-mix-small-fp32", "mix", 16, 2e-4, 4, 2, 48, bf16=False),
        Setting("lora-mix-small-bf16", "mix", 16, 2e-4, 4, 2, 48, bf16=True),
    )
}
"""The candidates, in the order they run. `node-default` is today's sapo-node CPU default (2 local + 2 external
groups, all generated here when alone; full fine-tuning at 5e-6 decaying linearly over 10000 steps, which over
30 steps is a constant 5e-6 to within 0.3 %), as the control."""


# ----------------------------------------------------------------------------------------------------
# one run (in its own process)


def run_one(
    setting: Setting, seed: int, steps: int, questions: int, out: Path, model_dir: str | None = None
) -> dict[str, Any]:
    """Train one setting alone for ``steps`` steps; evaluate at 0, steps/2 and steps (not at all when ``questions``
    is 0: a timing run); write ``out``."""
    import torch
    from transformers import TrainerCallback

    from sapo import SAPOConfig, SAPOTrainer
    from sapo.models import LoraSpec, load_policy
    from sapo.node.runner import build_rewards
    from sapo.tasks import DEFAULT_TASKS, build_held_out_dataset, build_reasoning_gym_dataset

    code = git_state()
    torch.manual_seed(seed)
    tasks = list(DEFAULT_TASKS) if setting.tasks == "mix" else [t for t in DEFAULT_TASKS if t.name == setting.tasks]
    train = build_reasoning_gym_dataset(tasks, size=4000, seed=seed)
    held_out = build_held_out_dataset(tasks, size=questions) if questions else None
    train_questions = {row[-1]["content"] for row in train["prompt"]}
    overlap = sum(p[-1]["content"] in train_questions for p in held_out["prompt"]) / len(held_out) if questions else 0
    lora = LoraSpec(r=setting.lora_r, alpha=2 * setting.lora_r, dropout=0.0) if setting.lora_r else None
    model, tokenizer = load_policy(model_dir, lora=lora)
    rows = setting.groups_per_step * setting.num_generations
    args = SAPOConfig(
        output_dir=tempfile.mkdtemp(prefix=f"profile-search-{out.stem}-"),  # nothing is saved there
        num_local=setting.groups_per_step,
        num_external=0,
        num_generations=setting.num_generations,
        per_device_train_batch_size=rows,
        max_completion_length=setting.max_completion_length,
        learning_rate=setting.learning_rate,
        lr_scheduler_type=setting.lr_scheduler_type,
        warmup_steps=0,
        max_steps=steps if setting.lr_scheduler_type == "constant" else 10000,
        eval_strategy="steps" if questions else "no",
        eval_steps=max(1, steps // 2),
        eval_on_start=bool(questions),
        eval_questions=max(questions, 1),
        per_device_eval_batch_size=32,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        gradient_checkpointing=False,
        bf16=setting.bf16,
        seed=seed,
        disable_tqdm=True,
    )
    history: list[dict[str, Any]] = []
    evaluations: dict[int, Any] = {}

    class Record(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "reward" in logs:
                history.append({"step": state.global_step, **{k: v for k, v in logs.items() if _number(v)}})

        def on_evaluate(self, args, state, control, metrics=None, **kwargs):
            evaluations[state.global_step] = trainer.last_evaluation.to_json()
            print(f"step {state.global_step}: held-out pass@1 {metrics['eval/pass@1']:.3f}", flush=True)

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step >= steps:  # linear schedules run over 10000 steps: stop here, evaluate first
                control.should_evaluate = bool(questions)
                control.should_training_stop = True

    trainer = SAPOTrainer(
        model=model,
        reward_funcs=build_rewards(list(setting.rewards)),
        args=args,
        train_dataset=train,
        # No eval_dataset: the trainer derives the same held-out set (these tasks, `eval_questions`) and measures it
        # by greedy pass@1 alone, as a node does; an explicit eval set would add TRL's sampled evaluation loop.
        held_out_tasks=tasks,
        processing_class=tokenizer,
        swarm=None,
        callbacks=[Record()],
    )
    started = time.time()
    trainer.train()
    result = {
        "setting": asdict(setting),
        "seed": seed,
        "steps": steps,
        "questions": questions,
        "held_out_text_overlap": overlap,
        "history": history,
        "evaluations": {str(k): v for k, v in sorted(evaluations.items())},
        "wall_seconds": time.time() - started,
        "code": code,
        "machine": machine(),
        "command": " ".join(sys.argv),
        "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
        "threads": torch.get_num_threads(),
        "model": model_dir or "default",
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(json_safe(result)))
    os.replace(tmp, out)  # a run's file exists only once it is complete
    return result


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


# ----------------------------------------------------------------------------------------------------
# summary


def summarize(run: dict[str, Any]) -> dict[str, Any]:
    """Per run: s/step, reward first vs last third, held-out pass@1 at start/end, paired difference and its s.e."""
    from sapo.evaluation import HeldOutResult, paired_difference

    evaluations = {int(k): HeldOutResult.from_json(v) for k, v in run["evaluations"].items()}
    first, last = evaluations[min(evaluations)], evaluations[max(evaluations)]
    difference, se = paired_difference(first, last)
    rewards = [h["reward"] for h in run["history"]]
    third = max(1, len(rewards) // 3)
    step_times = [h["step_time"] for h in run["history"] if "step_time" in h]
    return {
        "setting": run["setting"]["name"],
        "seed": run["seed"],
        "seconds_per_step": statistics.median(step_times) if step_times else math.nan,
        "reward_first": statistics.fmean(rewards[:third]),
        "reward_last": statistics.fmean(rewards[-third:]),
        "base": first.pass_at_1(),
        "base_se": first.standard_error(),
        "final": last.pass_at_1(),
        "final_se": last.standard_error(),
        "difference": difference,
        "difference_se": se,
        "z": difference / se if se else math.nan,
        "curve": {step: r.pass_at_1() for step, r in sorted(evaluations.items())},
        "per_task_final": {task: last.pass_at_1(task) for task in last.tasks()},
        "overlap": run["held_out_text_overlap"],
        "code": run["code"],
    }


def _outcomes(run: dict[str, Any], which: str) -> list[float]:
    """Per-question 0/1 of a run's first (``"start"``) or last (``"end"``) evaluation."""
    from sapo.evaluation import HeldOutResult

    steps = sorted(int(k) for k in run["evaluations"])
    step = steps[0] if which == "start" else steps[-1]
    return [float(q.correct) for q in HeldOutResult.from_json(run["evaluations"][str(step)]).questions]


def precision_pairs(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The bf16 learning check: every setting ``X-bf16`` against ``X-fp32`` on the seeds both ran.

    Per seed, paired by question (the held-out questions are the same in every run): the end's pass@1 bf16 - fp32,
    and the difference of the gains, (end - start under bf16) - (end - start under fp32), which also removes what
    the precision changes at step 0. Over seeds, `benchmarks.stats.seeds_and_questions` on the seeds x questions
    table, and the plain t-interval over seeds (`benchmarks.stats.t_over_seeds`) beside it.
    """
    from benchmarks.stats import paired_difference, seeds_and_questions, t_over_seeds

    by_key = {(r["setting"]["name"], r["seed"]): r for r in runs}
    pairs = []
    for name in sorted({n for n, _ in by_key if n.endswith("-bf16")}):
        base = name.removesuffix("-bf16")
        seeds = sorted(s for n, s in by_key if n == name and (f"{base}-fp32", s) in by_key)
        if not seeds:
            continue
        end, gain = [], []
        for seed in seeds:
            low, full = by_key[(name, seed)], by_key[(f"{base}-fp32", seed)]
            low_end, full_end = _outcomes(low, "end"), _outcomes(full, "end")
            end.append([a - b for a, b in zip(low_end, full_end, strict=True)])
            low_gain = [e - s for e, s in zip(low_end, _outcomes(low, "start"), strict=True)]
            full_gain = [e - s for e, s in zip(full_end, _outcomes(full, "start"), strict=True)]
            gain.append([a - b for a, b in zip(low_gain, full_gain, strict=True)])
        zeros = [0.0] * len(end[0])
        pairs.append({
            "setting": base, "seeds": seeds,
            "end": [paired_difference([row], [zeros]) for row in end],
            "gain": [paired_difference([row], [zeros]) for row in gain],
            "end_over_seeds": seeds_and_questions(end), "gain_over_seeds": seeds_and_questions(gain),
            "end_t_over_seeds": t_over_seeds([sum(row) / len(row) for row in end]),
            "gain_t_over_seeds": t_over_seeds([sum(row) / len(row) for row in gain]),
        })  # fmt: skip
    return pairs


def learning_over_seeds(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per setting run on two seeds or more: its held-out change (end - start) over seeds, from the seeds x questions
    table (`benchmarks.stats.seeds_and_questions`), with the plain t-interval over seeds beside it."""
    from benchmarks.stats import seeds_and_questions, t_over_seeds

    out = []
    for name in dict.fromkeys(r["setting"]["name"] for r in runs):
        mine = sorted((r for r in runs if r["setting"]["name"] == name and r["evaluations"]), key=lambda r: r["seed"])
        if len(mine) < 2:
            continue
        table = [[e - s for e, s in zip(_outcomes(r, "end"), _outcomes(r, "start"), strict=True)] for r in mine]
        out.append({"setting": name, "seeds": [r["seed"] for r in mine], "change": seeds_and_questions(table),
                    "t_over_seeds": t_over_seeds([sum(row) / len(row) for row in table])})  # fmt: skip
    return out


def _ci(estimate: Any) -> str:
    low, high = estimate.interval()
    return f"{estimate.value:+.3f} (95 % CI {low:+.3f} to {high:+.3f})"


def _plain(estimate: Any) -> str:
    low, high = estimate.interval()
    return f"{low:+.3f} to {high:+.3f}"


def learning_lines(learning: list[dict[str, Any]]) -> list[str]:
    """The learning over seeds as markdown lines (empty when no setting ran on two seeds)."""
    if not learning:
        return []
    lines = ["", "Learning over seeds (end - start; `benchmarks.stats.seeds_and_questions`, the seed and question "
             "terms each at its own t quantile; the plain t-interval over seeds beside it; *no learning* when the "
             "interval holds zero):", "", "| setting | seeds | change, mean over seeds | plain t over seeds | learns |",
             "|---|---|---|---|---|"]  # fmt: skip
    for entry in learning:
        change = entry["change"]
        low, high = change.interval()
        verdict = "yes" if low > 0 else ("no: a loss" if high < 0 else "no learning resolved")
        lines.append(f"| {entry['setting']} | {','.join(map(str, entry['seeds']))} | {_ci(change)} | "
                     f"{_plain(entry['t_over_seeds'])} | {verdict} |")  # fmt: skip
    return lines


def precision_lines(pairs: list[dict[str, Any]]) -> list[str]:
    """The bf16 learning check as markdown lines (empty when no pair ran)."""
    if not pairs:
        return []
    lines = ["", "bf16 against fp32 (the same setting and seed; paired by question; over seeds "
             "`benchmarks.stats.seeds_and_questions`, and the plain t-interval over seeds):", "",
             "| setting | seed | end pass@1 bf16 - fp32 | gain bf16 - gain fp32 |", "|---|---|---|---|"]  # fmt: skip
    for pair in pairs:
        for seed, end, gain in zip(pair["seeds"], pair["end"], pair["gain"], strict=True):
            lines.append(f"| {pair['setting']} | {seed} | {end.value:+.3f} ± {end.se:.3f} | "
                         f"{gain.value:+.3f} ± {gain.se:.3f} |")  # fmt: skip
        if len(pair["seeds"]) > 1:
            lines.append(f"| {pair['setting']} | over {len(pair['seeds'])} | {_ci(pair['end_over_seeds'])} | "
                         f"{_ci(pair['gain_over_seeds'])} |")  # fmt: skip
            lines.append(f"| {pair['setting']} | plain t over {len(pair['seeds'])} | "
                         f"{_plain(pair['end_t_over_seeds'])} | {_plain(pair['gain_t_over_seeds'])} |")  # fmt: skip
    return lines


def report(runs: list[dict[str, Any]], results_dir: Path) -> Path:
    """RESULTS_DIR/profile_search.md and .png from the finished runs."""
    rows = [summarize(run) for run in runs]
    order = list(SETTINGS)
    rows.sort(key=lambda r: (order.index(r["setting"]) if r["setting"] in order else 99, r["seed"]))
    commits = sorted({code_label(r["code"], 10) for r in rows})
    lines = [
        "# CPU profile search: does one node, training alone, raise its held-out pass@1?",
        "",
        "Command: `python -m benchmarks.profile_search` (resumable; one process per run). "
        f"Commits the runs ran on: {', '.join(commits)}. Machine: {runs[0]['machine'] if runs else '?'}.",
        "",
        "Held-out: greedy pass@1 on the same questions at every evaluation (`sapo.tasks.build_held_out_dataset`, "
        "generator seeds training never uses); *diff* is the paired per-question difference end - start with its "
        "standard error; *learns* when diff > 2 s.e. Reward: mean training reward (reasoning_gym + format) of the "
        "first and last third of the steps. s/step: median `step_time`.",
        "",
        "| setting | seed | s/step | reward first → last third | held-out start | held-out end | diff ± s.e. | z "
        "| learns |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['setting']} | {r['seed']} | {r['seconds_per_step']:.1f} | {r['reward_first']:.3f} → "
            f"{r['reward_last']:.3f} | {r['base']:.3f} ± {r['base_se']:.3f} | {r['final']:.3f} ± {r['final_se']:.3f} "
            f"| {r['difference']:+.3f} ± {r['difference_se']:.3f} | {r['z']:.1f} | "
            f"{'yes' if r['z'] > 2 else 'no'} |"
        )
    lines += ["", "Settings:", ""]
    for name in order:
        if any(r["setting"] == name for r in rows):
            s = SETTINGS[name]
            lines.append(
                f"- `{name}`: tasks {s.tasks}, {'LoRA r=' + str(s.lora_r) if s.lora_r else 'full fine-tuning'}, "
                f"lr {s.learning_rate:g} ({s.lr_scheduler_type}), G={s.num_generations}, "
                f"{s.groups_per_step} groups per step, {s.max_completion_length} completion tokens, rewards "
                f"{', '.join(s.rewards)}"
            )
    lines += learning_lines(learning_over_seeds(runs))
    lines += precision_lines(precision_pairs(runs))
    alone = timing_lines(results_dir)
    if alone:
        lines += ["", "Step time with the machine alone (`python -m benchmarks.profile_search --timing 8 --settings "
                  "NAME`, no evaluation; the table's s/step were taken while other work shared the 2 cores):", "",
                  *alone]  # fmt: skip
    lines += ["", "Per-task held-out pass@1 at the end:", ""]
    for r in rows:
        tasks = ", ".join(f"{t} {v:.2f}" for t, v in r["per_task_final"].items())
        lines.append(f"- {r['setting']} seed {r['seed']}: {tasks} (held-out texts also drawn in training: "
                     f"{r['overlap']:.0%})")  # fmt: skip
    md = results_dir / "profile_search.md"
    md.write_text("\n".join(lines) + "\n")
    plot(runs, results_dir / "profile_search.png")
    return md


def plot(runs: list[dict[str, Any]], path: Path) -> Path:
    """Left: training reward per step (moving average of 5); right: held-out pass@1 over steps, per run."""
    plt = pyplot()
    fig, (ax_reward, ax_eval) = plt.subplots(1, 2, figsize=(13, 4.8))
    colors: dict[str, Any] = {}
    for run in runs:
        name = run["setting"]["name"]
        color = colors.setdefault(name, f"C{len(colors)}")
        steps = [h["step"] for h in run["history"]]
        rewards = [h["reward"] for h in run["history"]]
        smooth = [statistics.fmean(rewards[max(0, i - 4) : i + 1]) for i in range(len(rewards))]
        style = "-" if run["seed"] == 0 else "--"
        ax_reward.plot(steps, smooth, style, color=color, label=f"{name} s{run['seed']}")
        summary = summarize(run)
        ax_eval.plot(list(summary["curve"]), list(summary["curve"].values()), style + "o", color=color,
                     label=f"{name} s{run['seed']}")  # fmt: skip
    ax_reward.set(title="Training reward (moving average, 5 steps)", xlabel="step", ylabel="reward")
    ax_eval.set(title="Held-out greedy pass@1", xlabel="step", ylabel="pass@1")
    for ax in (ax_reward, ax_eval):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ----------------------------------------------------------------------------------------------------
# driver


def run_file(results_dir: Path, setting: str, seed: int) -> Path:
    return results_dir / "profile_search" / f"{setting}-seed{seed}.json"


def timing_file(results_dir: Path, setting: str) -> Path:
    return results_dir / "profile_search" / "timing" / f"{setting}.json"


def load_runs(results_dir: Path) -> list[dict[str, Any]]:
    runs = restored(results_dir / "profile_search")  # the run records packed into results/archive are read there
    return [json.loads(p.read_text()) for p in sorted(runs.glob("*.json"))]


def timing_lines(results_dir: Path) -> list[str]:
    """The step-time-alone measurements (``--timing``) as markdown lines."""
    lines = []
    for path in sorted((restored(results_dir / "profile_search") / "timing").glob("*.json")):
        run = json.loads(path.read_text())
        times = [h["step_time"] for h in run["history"] if "step_time" in h][1:]  # step 1 warms up
        commit = code_label(run["code"], 10)
        lines.append(
            f"- `{run['setting']['name']}`: median {statistics.median(times):.1f} s per step (steps 2-{run['steps']}, "
            f"range {min(times):.1f}-{max(times):.1f} s), commit {commit}, {run['finished']}"
        )
    return lines


def run_process(command: list[str]) -> int:
    """Run ``python -m benchmarks.profile_search ...`` in a process of its own and return its exit code: forked warm
    where a program that started this one shares its server (`sapo.node.warm_start`), cold otherwise."""
    from sapo.node.warm_start import WarmStarter, WarmStartRefused

    starter = WarmStarter.shared()
    if starter is not None:
        try:
            return starter.start(command[3:], module=command[2], cwd=ROOT, stdout=1, stderr=2).wait()  # as inherited
        except WarmStartRefused:
            pass
    return subprocess.call(command, cwd=ROOT)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile_search", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    searched = ",".join(n for n, s in SETTINGS.items() if s.bf16 is None)  # the bf16 check runs when named
    parser.add_argument("--settings", default=searched, help="comma-separated setting names")
    parser.add_argument("--seeds", default="0,1", help="comma-separated seeds (default 0,1)")
    parser.add_argument("--steps", type=int, default=30, help="training steps per run (default 30)")
    parser.add_argument("--questions", type=int, default=128, help="held-out questions (default 128)")
    parser.add_argument("--results-dir", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--model", default=None, help="a local model directory (default: the embedded SmolLM2-135M)")
    parser.add_argument("--report-only", action="store_true", help="only rebuild the table and plot")
    parser.add_argument("--allow-dirty", action="store_true", help="run on a tree with uncommitted changes")
    parser.add_argument("--timing", type=int, default=None, metavar="STEPS",
                        help="measure s/step alone instead: STEPS steps of each setting, no evaluation")  # fmt: skip
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a single run, in this process
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    names = [n.strip() for n in args.settings.split(",")]
    unknown = [n for n in names if n not in SETTINGS]
    if unknown:
        parser.error(f"unknown setting(s) {unknown}; choose from {list(SETTINGS)}")
    if args.one:
        timing = not args.questions
        out = timing_file(args.results_dir, args.one) if timing else run_file(args.results_dir, args.one, seeds[0])
        run_one(SETTINGS[args.one], seeds[0], args.steps, args.questions, out, args.model)
        return 0
    if args.timing:
        for name in names:
            command = [sys.executable, "-m", "benchmarks.profile_search", "--one", name, "--seeds", str(seeds[0]),
                       "--steps", str(args.timing), "--questions", "0", "--results-dir", str(args.results_dir),
                       *(["--model", args.model] if args.model else [])]  # fmt: skip
            if run_process(command) != 0:
                return 1
        print(report(load_runs(args.results_dir), args.results_dir).read_text())
        return 0
    if not args.report_only:
        if git_state()["dirty"] and not args.allow_dirty:
            parser.error("the tree has uncommitted changes: commit them (results name the commit) or --allow-dirty")
        todo = [(n, s) for s in seeds for n in names if not run_file(args.results_dir, n, s).exists()]
        print(f"profile_search: {len(todo)} run(s) to do: {todo}", flush=True)
        for k, (name, seed) in enumerate(todo, 1):
            print(f"profile_search: run {k}/{len(todo)}: {name} seed {seed}", flush=True)
            command = [sys.executable, "-m", "benchmarks.profile_search", "--one", name, "--seeds", str(seed),
                       "--steps", str(args.steps), "--questions", str(args.questions),
                       "--results-dir", str(args.results_dir),
                       *(["--model", args.model] if args.model else [])]  # fmt: skip
            code = run_process(command)
            if code != 0:
                print(f"profile_search: {name} seed {seed} failed with exit code {code}", flush=True)
                return code
            report(load_runs(args.results_dir), args.results_dir)
    runs = load_runs(args.results_dir)
    if runs:
        print(report(runs, args.results_dir).read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
