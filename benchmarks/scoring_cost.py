"""What scoring one received answer with a reasoning-gym scorer costs, honest or crafted, against a base commit.

The default reward (`rewards.reasoning_gym_reward`) scores each completion with its task's own reasoning-gym scorer,
in the training process. Five of them hand the answer to sympy, which computes exact numbers as it parses (a short
power asks for an integer of millions of digits) and simplifies symbolic answers (a short power of a sum expands into
millions of terms). This script scores each answer with this tree's `rewards/functions.py` and a base commit's (read
with `git show`) alternately in one process, and reports CPU seconds per answer:

    python -m benchmarks.scoring_cost --base 3635fdf

Each crafted answer is scored with a fresh exponent every round (sympy caches what it computed). Then a received
group whose every answer takes just under the deadline (``--group-size`` answers of ``(x+a+b+c+d)**k``, each with
letters of its own, ``k`` the largest whose answer takes under ``--group-target`` seconds here): the wall seconds
``reasoning_gym_reward`` spends on it with each code. Writes ``scoring_cost.{json,md}`` into ``--output-dir``
(default benchmarks/results).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from benchmarks.answer_search_cost import base_and_this_tree
from benchmarks.harness import RESULTS, record_lines, run_record, write_report

ANSWERS: dict[str, tuple[str, Callable[[int], str] | None]] = {
    "countdown, its gold answer": ("countdown", None),
    "countdown, 9**(2,000,000 - round)": ("countdown", lambda r: f"9**{2_000_000 - r}"),
    "countdown, 9**(4,000,000 - round)": ("countdown", lambda r: f"9**{4_000_000 - r}"),
    "simple_integration, its gold answer": ("simple_integration", None),
    "simple_integration, (x+1)**(99 - round)/(x-1)**99": ("simple_integration", lambda r: f"(x+1)**{99 - r}/(x-1)**99"),
    "simple_integration, (x+y+z+w+v)**(20 - round)": ("simple_integration", lambda r: f"(x+y+z+w+v)**{20 - r}"),
}
"""Each answer's task and its text in a round (None: the entry's own answer). ``9**9**9`` is left out: on a code
without the bound it never ends."""


def entry_of(task: str) -> dict[str, Any]:
    """One reasoning-gym entry of ``task`` (seed 1)."""
    import reasoning_gym

    from sapo.reasoning_gym import reasoning_gym_entry

    return reasoning_gym_entry(reasoning_gym.create_dataset(task, seed=1, size=1)[0])


def entries() -> dict[str, dict[str, Any]]:
    """One reasoning-gym entry of each task the answers are scored against."""
    return {task: entry_of(task) for task in sorted({task for task, _ in ANSWERS.values()})}


def cpu_seconds(module: ModuleType, answer: str, entry: dict[str, Any]) -> tuple[float, float]:
    """CPU seconds of scoring ``answer`` against ``entry`` with ``module``'s ``score_reasoning_gym_answer``, and the
    score."""
    began = time.process_time()
    score = module.score_reasoning_gym_answer(answer, entry)
    return time.process_time() - began, score


def measure(codes: dict[str, ModuleType], rounds: int) -> dict[str, dict[str, dict[str, float]]]:
    """Per code and answer, the median CPU seconds over ``rounds`` and the last score, the codes alternating."""
    by_task = entries()
    samples: dict[str, dict[str, list[float]]] = {code: {name: [] for name in ANSWERS} for code in codes}
    scores: dict[str, dict[str, float]] = {code: {} for code in codes}
    for round_ in range(rounds):
        for name, (task, text) in ANSWERS.items():
            entry = by_task[task]
            answer = entry["answer"] if text is None else text(round_)
            for code, module in codes.items():
                seconds, scores[code][name] = cpu_seconds(module, answer, entry)
                samples[code][name].append(seconds)
    return {
        code: {n: {"cpu_s": sorted(v)[len(v) // 2], "score": scores[code][n]} for n, v in by_answer.items()}
        for code, by_answer in samples.items()
    }


LETTERS = "abcdfghjkmnpqrstuvwyzABDFGHJKLMPRTUVWXYZ"
"""Single letters sympy reads as plain symbols (none of ``e i l o x C E I N O Q S``): four for each answer of a
group, so that no answer finds what another computed in sympy's cache."""


def slow_answer(k: int, index: int) -> str:
    """A simple_integration answer whose check (``simplify`` of its derivative) grows steeply with ``k``, in letters
    of its own for each ``index``."""
    a, b, c, d = LETTERS[4 * index : 4 * index + 4]
    return f"(x+{a}+{b}+{c}+{d})**{k}"


def just_under(module: ModuleType, entry: dict[str, Any], target: float) -> tuple[int, float]:
    """The largest power ``k`` whose answer ``module`` scores in under ``target`` wall seconds here, and its seconds."""
    from sympy.core.cache import clear_cache

    best = (1, 0.0)
    for k in range(2, 21):
        clear_cache()
        began = time.perf_counter()
        module.score_reasoning_gym_answer(slow_answer(k, 0), entry)
        seconds = time.perf_counter() - began
        if seconds >= target:
            break
        best = (k, seconds)
    return best


def group_cost(codes: dict[str, ModuleType], size: int, target: float) -> dict[str, Any]:
    """Wall seconds of ``reasoning_gym_reward`` over one group of ``size`` answers each just under ``target``, per
    code (sympy's cache cleared before each), and the power used."""
    from sympy.core.cache import clear_cache

    if size * 4 > len(LETTERS):
        raise ValueError(f"--group-size is at most {len(LETTERS) // 4}, got {size}")
    entry = entry_of("simple_integration")
    k, one = just_under(codes["this tree"], entry, target)
    completions = [f"<answer>{slow_answer(k, i)}</answer>" for i in range(size)]
    costs: dict[str, Any] = {"power": k, "one_answer_s": one, "size": size}
    for code, module in codes.items():
        clear_cache()
        began = time.perf_counter()
        rewards = module.reasoning_gym_reward(["q"] * size, completions, entry=[json.dumps(entry)] * size)
        costs[code] = {"wall_s": time.perf_counter() - began, "rewards": rewards}
    return costs


def markdown(costs: dict[str, dict[str, dict[str, float]]]) -> list[str]:
    """The table: CPU seconds per answer and its score, per code."""
    codes = list(costs)
    lines = [
        "| answer | " + " | ".join(f"{c}: CPU s | {c}: score" for c in codes) + " |",
        "|---|" + "---|---|" * len(codes),
    ]
    for name in ANSWERS:
        cells = [f"{costs[c][name]['cpu_s']:.3f} | {costs[c][name]['score']:.2f}" for c in codes]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Score every answer with both codes and write the report."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", required=True, help="the commit whose rewards/functions.py is compared")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every answer and code (default 3)")
    parser.add_argument("--group-size", type=int, default=8, help="answers of the slow group (default 8)")
    parser.add_argument(
        "--group-target", type=float, default=0.9, help="wall seconds each of its answers stays under (default 0.9)"
    )
    parser.add_argument("--output-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    codes = base_and_this_tree("rewards/functions.py", args.base)
    record = run_record(" ".join(["python -m benchmarks.scoring_cost", *(argv or sys.argv[1:])]))
    costs = measure(codes, args.rounds)
    group = group_cost(codes, args.group_size, args.group_target)
    data = {**record, "base": args.base, "rounds": args.rounds, "answers": costs, "group": group}
    lines = [
        "# What scoring one received answer costs",
        "",
        *record_lines(record),
        "",
        f"`score_reasoning_gym_answer` of one answer, CPU seconds (the median of {args.rounds} rounds, the two codes "
        "alternating in each, each round a fresh exponent) and the score it gave.",
        "",
        *markdown(costs),
        "",
        f"A group of {group['size']} answers `(x+a+b+c+d)**{group['power']}` to one simple_integration question, each "
        f"in letters of its own (one alone: {group['one_answer_s']:.2f} s here), scored by `reasoning_gym_reward` in "
        "one call, wall seconds:",
        "",
        "| code | wall s | rewards |",
        "|---|---|---|",
        *(f"| {code} | {group[code]['wall_s']:.2f} | {group[code]['rewards']} |" for code in codes),
    ]
    write_report(args.output_dir, "scoring_cost", data, lines)
    print("\n".join(lines))
    return data


if __name__ == "__main__":
    main()
