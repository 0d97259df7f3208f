"""How often the base model's group of G completions carries a gradient, per reasoning-gym task and config.

GRPO learns only from a group whose rewards differ (reward *spread*); SAPO's paper sampler takes an external group
only if it has spread under the receiver's rewards, and sharing can help most where a peer's own groups rarely have
spread but some peer solves the question. This script measures, for the default model as a node starts (its LoRA
adapters are zero at first, so the base model), per task:

- ``spread``: share of groups whose rewards under the node's reward functions (default ``reasoning_gym`` +
  ``format``, summed as TRL does with unit weights) are not all equal: the groups that carry a gradient;
- ``spread_correct``: the same under the correctness reward alone (``reasoning_gym``);
- ``any_correct``: share of groups holding at least one completion with full marks from the correctness reward;
- ``correct``: share of completions with full marks;

each with its 95 % Wilson interval over the groups (one question each). Generation is the node's: the prompt is the
node's (``sapo.tasks`` rows: the default system prompt and the question, under the tokenizer's chat template),
sampling at the node's temperature (TRL's default 1.0, top_p 1, no top_k), ``max_new_tokens`` = the node's
``max_completion_length`` (48), G = the node's ``num_generations`` (4), float32 on a CPU.

From the rates it predicts the informative groups (groups with spread) a peer trains on per step, for an I/J peer in
a swarm of N peers (see :func:`predict_informative`), for the default mix and a proposed hard mix.

    python -m benchmarks.task_rates --groups 24            # writes benchmarks/results/task_rates.{json,md}
    python -m benchmarks.task_rates --tasks default --groups 8 --model DIR --out /tmp/rates   # a quick look

Results are written after every task, so an interrupted run keeps what it measured; ``--time-limit`` stops
starting new tasks after that many seconds.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.harness import RESULTS, commit_label, machine, utc_now
from benchmarks.stats import wilson_interval

_FULL_MARKS = 1.0 - 1e-9

_CANDIDATES: list[tuple[str, dict[str, Any], str]] = [
    # (task, config, why it is a candidate)
    ("chain_sum", {"min_terms": 3, "max_terms": 3, "min_digits": 1, "max_digits": 1}, "three 1-digit terms"),
    ("products", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}, "1-digit products"),
    ("leg_counting", {"min_animals": 1, "max_animals": 2, "min_instances": 1, "max_instances": 3}, "few animals"),
    ("gcd", {"min_numbers": 2, "max_numbers": 2, "min_value": 1, "max_value": 20}, "small numbers"),
    ("lcm", {"min_numbers": 2, "max_numbers": 2, "min_value": 1, "max_value": 10}, "small numbers"),
    ("simple_equations", {"min_terms": 2, "max_terms": 2, "min_value": 1, "max_value": 10, "operators": ["+", "-"],
                          "operators_weights": [0.5, 0.5]},
     "x + a = b"),
    ("decimal_arithmetic", {"max_num_decimal_places": 1, "min_num_decimal_places": 1, "max_terms": 2},
     "paper task, easiest"),
    ("count_bits", {"min_n": 1, "max_n": 16}, "small numbers"),
    ("letter_counting", {"min_words": 3, "max_words": 5}, "short texts"),
    ("basic_arithmetic", {"min_terms": 2, "max_terms": 2, "min_digits": 2, "max_digits": 2, "operators": ["+", "-"],
                          "allow_parentheses": False, "allow_negation": False}, "default task, two 2-digit terms"),
]  # fmt: skip
"""Tasks beside the node's default mix: medium difficulty for a small model, short answers (48 tokens)."""


@dataclass
class TaskRates:
    """One task's measurement: per group, its rewards under the node's rewards and under correctness alone."""

    task: str
    config: dict[str, Any]
    note: str
    total: list[list[float]]
    correct: list[list[float]]
    seconds: float

    def rates(self) -> dict[str, Any]:
        """Each rate with its 95 % Wilson interval over the groups."""
        groups = len(self.total)
        spread = sum(len(set(rewards)) > 1 for rewards in self.total)
        spread_correct = sum(len(set(rewards)) > 1 for rewards in self.correct)
        any_correct = sum(max(rewards) >= _FULL_MARKS for rewards in self.correct)
        mixed = sum(max(rewards) >= _FULL_MARKS > min(rewards) for rewards in self.correct)
        completions = [r for rewards in self.correct for r in rewards]
        solved = sum(r >= _FULL_MARKS for r in completions)
        out: dict[str, Any] = {"groups": groups, "completions": len(completions)}
        for name, count, n in (
            ("spread", spread, groups),
            ("spread_correct", spread_correct, groups),
            ("any_correct", any_correct, groups),
            ("mixed_success", mixed, groups),
            ("correct", solved, len(completions)),
        ):
            low, high = wilson_interval(count, n)
            out[name] = {"count": count, "n": n, "rate": count / n, "ci_low": low, "ci_high": high}
        out["mean_reward"] = statistics.fmean(r for rewards in self.total for r in rewards)
        return out


def candidate_tasks(which: str) -> list[tuple[str, dict[str, Any], str]]:
    """The task configs to measure: ``default`` (the node's mix), ``candidates`` (the others) or ``all``."""
    from sapo.tasks import DEFAULT_TASKS

    default = [(task.name, dict(task.config), "node default mix") for task in DEFAULT_TASKS]
    if which == "default":
        return default
    if which == "candidates":
        return list(_CANDIDATES)
    if which == "all":
        return default + list(_CANDIDATES)
    names = which.split(",")
    chosen = [entry for entry in default + _CANDIDATES if entry[0] in names]
    if len({entry[0] for entry in chosen}) != len(set(names)):
        known = sorted({entry[0] for entry in default + _CANDIDATES})
        raise SystemExit(f"task_rates: --tasks {which!r}: unknown name(s); use default, candidates, all or of {known}")
    return chosen


def generate_groups(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[list[dict[str, str]]],
    num_generations: int,
    max_new_tokens: int,
    temperature: float,
    batch_questions: int,
) -> list[list[str]]:
    """``num_generations`` sampled completions per chat prompt, as the node generates them (left-padded batches
    under the chat template, sampling at ``temperature`` with top_p 1 and no top_k)."""
    import torch

    tokenizer.padding_side = "left"
    groups: list[list[str]] = []
    for start in range(0, len(prompts), batch_questions):
        texts = [
            tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=False)
            for p in prompts[start : start + batch_questions]
        ]
        batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            output = model.generate(
                **batch,
                do_sample=True,
                temperature=temperature,
                top_p=1.0,
                top_k=0,
                max_new_tokens=max_new_tokens,
                num_return_sequences=num_generations,
                pad_token_id=tokenizer.pad_token_id,
            )
        completions = tokenizer.batch_decode(output[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
        for i in range(0, len(completions), num_generations):
            groups.append(completions[i : i + num_generations])
    return groups


def measure_task(
    model: Any, tokenizer: Any, task: str, config: dict[str, Any], note: str, args: argparse.Namespace
) -> TaskRates:
    """Generate ``args.groups`` groups of one task with the node's prompts and score them with its rewards."""
    from sapo.tasks import TaskSpec, build_reasoning_gym_dataset

    rows = build_reasoning_gym_dataset([TaskSpec(task, config)], size=args.groups, seed=args.seed).to_list()
    started = time.perf_counter()
    groups = generate_groups(
        model,
        tokenizer,
        [row["prompt"] for row in rows],
        args.num_generations,
        args.max_new_tokens,
        args.temperature,
        args.batch_questions,
    )
    scored = [score_group(row, completions, args.format_reward) for row, completions in zip(rows, groups, strict=True)]
    total, correct = [t for t, _ in scored], [c for _, c in scored]
    return TaskRates(task, config, note, total, correct, time.perf_counter() - started)


def score_group(row: dict[str, Any], completions: Sequence[str], with_format: bool) -> tuple[list[float], list[float]]:
    """A group's rewards as the node computes them: the sum of ``reasoning_gym`` and (``with_format``) ``format``
    (unit weights, a missing reward counted as 0), and the correctness reward alone."""
    from rewards import format_reward, reasoning_gym_reward

    messages = [[{"role": "assistant", "content": text}] for text in completions]
    prompts = [row["prompt"]] * len(completions)
    columns = {key: [row[key]] * len(completions) for key in ("answer", "task", "entry", "provenance")}
    correct = [0.0 if r is None else r for r in reasoning_gym_reward(prompts, messages, **columns)]
    shaping = [0.0 if r is None else r for r in format_reward(prompts, messages, **columns)] if with_format else []
    total = [c + f for c, f in zip(correct, shaping, strict=True)] if with_format else list(correct)
    return total, correct


def predict_informative(
    spread: float, local: int, external: int, peers: int, sender_local: int | None = None
) -> dict[str, float]:
    """Expected informative groups (groups with reward spread) a peer trains on per step, from the rate ``spread``.

    The peer generates ``local`` groups (each informative with probability ``spread``); for its ``external`` slots
    the paper's sampler takes groups with spread among the fresh candidates, the ``sender_local`` (default:
    ``local``) groups each of the other ``peers - 1`` peers generated, and the slots it cannot fill are generated
    locally (fill-ins, informative like its own). Candidates' spread under the receiver's rewards is taken equal to
    the receiver's own rate (one base model, one reward); older groups in the pool are left out (conservative).
    """
    candidates = (peers - 1) * (local if sender_local is None else sender_local) if external else 0
    taken = sum(min(external, x) * _binomial(candidates, x, spread) for x in range(candidates + 1))
    fill_ins = external - taken
    informative = (local + fill_ins) * spread + taken
    return {
        "informative": informative,
        "of": local + external,
        "share": informative / (local + external),
        "own_groups_generated": local + fill_ins,
        "external_taken": taken,
        "candidates": candidates,
    }


def _binomial(n: int, k: int, p: float) -> float:
    return math.comb(n, k) * p**k * (1 - p) ** (n - k)


def mix_rates(measured: dict[str, dict[str, Any]], tasks: Sequence[str]) -> dict[str, float]:
    """Mean rates of an equal-weight mix of ``tasks`` (keys of ``measured``)."""
    return {
        name: statistics.fmean(measured[task][name]["rate"] for task in tasks)
        for name in ("spread", "spread_correct", "any_correct", "mixed_success", "correct")
    }


def predictions(measured: dict[str, dict[str, Any]], mixes: dict[str, list[str]]) -> dict[str, Any]:
    """Per mix: its rates, the chance that a swarm's step solves some question, and informative groups per step
    for 8/0 and 4/4 peers (paper batch, 4 and 8 peers) and for 2/0 and 1/1 (the cpu-learn batch, 4 peers)."""
    out: dict[str, Any] = {}
    for name, tasks in mixes.items():
        if not tasks or any(task not in measured for task in tasks):
            continue
        rates = mix_rates(measured, tasks)
        entry: dict[str, Any] = {"tasks": tasks, "rates": rates, "settings": {}}
        for label, local, external, peers in (
            ("8/0, 4 peers", 8, 0, 4),
            ("4/4, 4 peers", 4, 4, 4),
            ("4/4, 8 peers", 4, 4, 8),
            ("2/0 (cpu-learn), 4 peers", 2, 0, 4),
            ("1/1 (cpu-learn), 4 peers", 1, 1, 4),
        ):
            for reward in ("spread", "mixed_success"):
                key = f"{label} [{reward}]"
                entry["settings"][key] = predict_informative(rates[reward], local, external, peers)
            groups = peers * (local + external)
            entry["settings"][f"{label} [spread]"]["swarm_solves_some"] = 1 - (1 - rates["any_correct"]) ** groups
        out[name] = entry
    return out


def propose_hard_mix(measured: dict[str, dict[str, Any]], low: float = 0.05, target: float = 0.25) -> list[str]:
    """A mix hard for one peer that the swarm still solves: among the tasks where at least ``low`` of the groups
    hold a right answer beside a wrong one (mixed success: a verified success to learn from), take them in
    increasing order of spread (ties: more mixed success first) while the equal-weight mix's spread rate under the
    node's rewards stays at most ``target`` (0.25: inside the issue's 5-30 % band, with a margin for the rates'
    error). Point estimates: a task near the edge may fall on either side with more groups."""
    eligible = [task for task, rates in measured.items() if rates["mixed_success"]["rate"] >= low]
    eligible.sort(key=lambda t: (measured[t]["spread"]["rate"], -measured[t]["mixed_success"]["rate"]))
    mix: list[str] = []
    for task in eligible:
        if statistics.fmean(measured[t]["spread"]["rate"] for t in [*mix, task]) > target:
            break
        mix.append(task)
    return mix


def _key(task: str, config: dict[str, Any]) -> str:
    return f"{task} {json.dumps(config, sort_keys=True, separators=(',', ':'))}"


def markdown(data: dict[str, Any]) -> str:
    """The report page."""
    lines = [
        "# Reward spread of the base model's groups, per reasoning-gym task",
        "",
        f"Command: `{data['command']}` (report code `{data['code']}`)",
        "",
        f"Model {data['model']} (float32, CPU), G = {data['num_generations']} completions of at most "
        f"{data['max_new_tokens']} tokens at temperature {data['temperature']}, the node's prompts; rewards "
        f"{'reasoning_gym + format' if data['format_reward'] else 'reasoning_gym'}; one question per group. "
        "Measurements (their groups add up per task):",
        "",
        *(
            f"- `{m['command']}`: code `{m['code']}`, {m['date']}, {m['machine']}; {m['groups']} groups per task, "
            f"seed {m['seed']}, {m['seconds']:.0f} s"
            for m in data["measurements"]
        ),
        "",
        "Rates are shares of groups (correct: of completions) with their 95 % Wilson interval. *spread*: the group's "
        "rewards under the node's reward functions differ (it carries a gradient; the paper sampler keeps it); "
        "*spread (correct)*: under the correctness reward alone (reasoning-gym gives partial credit, so this is not "
        "success); *any correct*: at least one completion with full marks; *mixed success*: a completion with full "
        "marks beside one without (a verified success to learn from; what `success_gated` keeps).",
        "",
        "| task | config | groups | spread | spread (correct) | any correct | mixed success | correct (completions) | "
        "mean reward |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def cell(rate: dict[str, float]) -> str:
        return f"{rate['rate']:.2f} ({rate['ci_low']:.2f}-{rate['ci_high']:.2f})"

    for key, rates in data["tasks"].items():
        task, config = key.split(" ", 1)
        lines.append(
            f"| {task} | `{config}` | {rates['groups']} | {cell(rates['spread'])} | {cell(rates['spread_correct'])} | "
            f"{cell(rates['any_correct'])} | {cell(rates['mixed_success'])} | {cell(rates['correct'])} | "
            f"{rates['mean_reward']:.3f} |"
        )
    lines += [
        "",
        "## Predicted informative groups per step",
        "",
        "From the rates (module docstring of benchmarks/task_rates.py, `predict_informative`): a peer's own groups "
        "carry a gradient at the mix's spread rate; its J external slots are filled from the other peers' fresh "
        "groups with spread (the paper sampler drops the rest) and generated locally when too few have spread. "
        "*[spread]*: a group is informative when it has spread under the node's rewards (any gradient; the paper "
        "sampler); *[mixed_success]*: when it holds a right answer beside a wrong one, as the `success_gated` sampler "
        "takes them (and as a full-marks-only reward would make them). Hard mix (`propose_hard_mix`): tasks with at "
        "least 5 % mixed success, added in increasing order of spread while the mix's spread stays at most 25 %.",
        "",
    ]
    for name, entry in data["predictions"].items():
        rates = entry["rates"]
        lines += [
            f"### {name}: {len(entry['tasks'])} tasks, equal weights",
            "",
            f"Tasks: {', '.join(f'`{t}`' for t in entry['tasks'])}.  ",
            f"Mix rates: spread {rates['spread']:.2f}, spread (correct) {rates['spread_correct']:.2f}, any correct "
            f"{rates['any_correct']:.2f}, mixed success {rates['mixed_success']:.2f}, correct {rates['correct']:.2f}.",
            "",
            "| setting [reward] | informative groups / step | share of the batch | own groups generated | "
            "external taken | swarm solves some question in a step |",
            "|---|---|---|---|---|---|",
        ]
        for label, p in entry["settings"].items():
            solves = f"{p['swarm_solves_some']:.3f}" if "swarm_solves_some" in p else ""
            lines.append(
                f"| {label} | {p['informative']:.2f} of {p['of']} | {p['share']:.2f} | "
                f"{p['own_groups_generated']:.2f} | {p['external_taken']:.2f} | {solves} |"
            )
        lines.append("")
    observed = data.get("observed") or {}
    if isinstance(observed, str):  # reports written before the cpu-hard runs: the cpu-learn check alone
        observed = {"cpu-learn": observed}
    for profile, text in observed.items():
        if text:
            mix = "default mix" if profile == "cpu-learn" else "proposed hard mix"
            lines += [f"## Check against the {profile} runs ({mix}, 2/0 and 1/1 rows above)", "", text, ""]
    return "\n".join(lines)


def observed_runs(results: Path, profile: str, first_steps: int = 5) -> str | None:
    """The share of trained groups with spread in the first steps of the archived runs of ``profile`` (the base model,
    nearly), to set beside the prediction for its mix (cpu-learn: the default mix; cpu-hard: the hard mix)."""
    archive = results / "sapo_table_runs" / profile
    if not archive.exists():
        return None
    parts = []
    for setting in ("2-0", "1-1"):
        shares = []
        for metrics in sorted(archive.glob(f"{setting}/seed-*/node-*/metrics.jsonl")):
            for line in metrics.read_text().splitlines():
                row = json.loads(line)
                if "frac_reward_zero_std" in row and 1 <= row["step"] <= first_steps:
                    shares.append(1 - row["frac_reward_zero_std"])
        if shares:
            low, high = wilson_interval(round(statistics.fmean(shares) * len(shares) * 2), len(shares) * 2)
            parts.append(
                f"{setting}: {statistics.fmean(shares):.2f} of the trained groups had reward spread in steps "
                f"1-{first_steps}, {2 * statistics.fmean(shares):.2f} informative groups of 2 per step "
                f"({len(shares)} peer-steps of 2 groups; share about {low:.2f}-{high:.2f})"
            )
    return "; ".join(parts) + "." if parts else None


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Measure the rates of ``--tasks``, predict informative groups per step, write ``--out``.{json,md}."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.task_rates", description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="default", help="'default' (SmolLM2-135M-Instruct) or a model directory")
    parser.add_argument("--tasks", default="all", help="default, candidates, all, or comma-separated task names")
    parser.add_argument("--groups", type=int, default=24, help="groups (questions) per task")
    parser.add_argument("--num-generations", type=int, default=4, help="G: completions per group (node: 4)")
    parser.add_argument("--max-new-tokens", type=int, default=48, help="node's max_completion_length (48)")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (node: 1.0)")
    parser.add_argument("--no-format-reward", dest="format_reward", action="store_false",
                        help="score with reasoning_gym only (the node's default adds format)")  # fmt: skip
    parser.add_argument("--batch-questions", type=int, default=8, help="questions per generate call")
    parser.add_argument("--seed", type=int, default=0, help="question and sampling seed")
    parser.add_argument("--time-limit", type=float, default=None, help="start no new task after these seconds")
    parser.add_argument("--out", default=str(RESULTS / "task_rates"), help="output path without extension")
    parser.add_argument("--report-only", nargs="+", metavar="JSON", default=None,
                        help="measure nothing: merge these task_rates JSON files (groups of a task add up) and "
                        "write the report to --out")  # fmt: skip
    args = parser.parse_args(argv)
    command = "python -m benchmarks.task_rates " + " ".join(sys.argv[1:] if argv is None else argv)
    if args.report_only:
        return report(args.report_only, Path(args.out), command)
    if args.groups < 1 or args.num_generations < 2:
        raise SystemExit("task_rates: --groups must be >= 1 and --num-generations >= 2")
    import torch
    import transformers

    from sapo.models import load_policy

    code = commit_label()
    tasks = candidate_tasks(args.tasks)
    torch.manual_seed(args.seed)
    transformers.set_seed(args.seed)
    model, tokenizer = load_policy(None if args.model == "default" else args.model, dtype=torch.float32)
    model.eval()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    measurement = {"command": command, "code": code, "date": utc_now(), "machine": machine()}
    measurement |= {"groups": args.groups, "seed": args.seed, "seconds": 0.0}
    data: dict[str, Any] = {
        **measurement,
        "measurements": [measurement],
        "model": args.model,
        "num_generations": args.num_generations,
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "format_reward": args.format_reward,
        "groups": args.groups,
        "seed": args.seed,
        "seconds": 0.0,
        "tasks": {},
        "raw": {},
    }
    started = time.perf_counter()
    for task, config, note in tasks:
        if args.time_limit is not None and time.perf_counter() - started > args.time_limit:
            print(f"time limit reached: {task} and later tasks not measured", flush=True)
            break
        measured = measure_task(model, tokenizer, task, config, note, args)
        key = _key(task, config)
        data["tasks"][key] = measured.rates() | {"note": note, "seconds": measured.seconds}
        data["raw"][key] = {"total": measured.total, "correct": measured.correct}
        data["seconds"] = measurement["seconds"] = time.perf_counter() - started
        write(data, out)
        rates = data["tasks"][key]
        print(
            f"{key}: spread {rates['spread']['rate']:.2f}, spread(correct) {rates['spread_correct']['rate']:.2f}, "
            f"any correct {rates['any_correct']['rate']:.2f} ({measured.seconds:.0f} s)",
            flush=True,
        )
    return data


def write(data: dict[str, Any], out: Path) -> None:
    """Add the hard-mix proposal, the predictions and the check against the archived runs to ``data``; write
    ``out``.{json,md}."""
    default = [_key(t, c) for t, c, _ in candidate_tasks("default")]
    hard = propose_hard_mix(data["tasks"])
    data["proposed_hard_mix"] = hard
    data["predictions"] = predictions(data["tasks"], {"default mix": default, "proposed hard mix": hard})
    data["observed"] = {profile: observed_runs(RESULTS, profile) for profile in ("cpu-learn", "cpu-hard")}
    Path(f"{out}.json").write_text(json.dumps(data, indent=1) + "\n")
    Path(f"{out}.md").write_text(markdown(data))


def report(inputs: Sequence[str], out: Path, command: str) -> dict[str, Any]:
    """Merge measurements (the groups of a task add up; generation settings must agree) and write the report."""
    merged: dict[str, Any] | None = None
    for path in inputs:
        part = json.loads(Path(path).read_text())
        settings = {k: part[k] for k in ("model", "num_generations", "max_new_tokens", "temperature", "format_reward")}
        if merged is None:
            merged = {**settings, "measurements": [], "raw": {}, "notes": {}}
        elif any(merged[k] != v for k, v in settings.items()):
            raise SystemExit(f"task_rates: {path} was measured with other settings ({settings}); not merged")
        fields = ("command", "code", "date", "machine", "groups", "seed", "seconds")
        merged["measurements"] += part.get("measurements") or [{k: part[k] for k in fields}]
        for key, raw in part["raw"].items():
            into = merged["raw"].setdefault(key, {"total": [], "correct": []})
            into["total"] += raw["total"]
            into["correct"] += raw["correct"]
            merged["notes"][key] = part["tasks"][key].get("note", "")
    assert merged is not None
    merged |= {"command": command, "code": commit_label(), "date": utc_now(), "machine": machine()}
    merged["tasks"] = {}
    for key, raw in merged["raw"].items():
        task, config = key.split(" ", 1)
        rates = TaskRates(task, json.loads(config), merged["notes"][key], raw["total"], raw["correct"], 0.0)
        merged["tasks"][key] = rates.rates() | {"note": merged["notes"][key]}
    write(merged, out)
    print(Path(f"{out}.md").read_text())
    return merged


if __name__ == "__main__":
    main()
