"""What `rewards.math_reward` spends on one received group of crafted answers, against a base commit.

`math_reward` (the default reward of a node on its own `--dataset`) hands each answer to math-verify, which parses it
with sympy under an alarm of its own. A group of answers such as ``9**9**9`` kept it busy until that alarm, for each
answer. This script scores a group of ``--group-size`` such answers to one question, and an honest group, with this
tree's `rewards/functions.py` and a base commit's (read with `git show`), alternately in one process, and reports the
wall seconds of each call (wall time: the deadlines count it):

    python -m benchmarks.math_reward_cost --base c7ab464

Writes ``math_reward_cost.{json,md}`` into ``--output-dir`` (default benchmarks/results).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.answer_search_cost import base_and_this_tree
from benchmarks.harness import RESULTS, record_lines, run_record, write_report

GROUPS = {
    "crafted: 9**9**9": ("<answer>9**9**9</answer>", "3"),
    "crafted: 10^(10^10)": ("<answer>10^(10^10)</answer>", "3"),
    "honest: 2/4 for 0.5": ("<answer>2/4</answer>", "0.5"),
}
"""Each group's completion (all of its answers alike) and its gold answer."""


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Score each group with both codes, ``--rounds`` times alternately; write the report and return its data."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the commit to compare with (its rewards/functions.py)")
    parser.add_argument("--group-size", type=int, default=8, help="answers in a group (num_generations); default 8")
    parser.add_argument("--rounds", type=int, default=3, help="calls per group and code; default 3")
    parser.add_argument("--output-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    codes = base_and_this_tree("rewards/functions.py", args.base)
    codes[next(iter(codes))].math_answers_match("1", "1")  # imports outside the measurement
    seconds: dict[str, dict[str, list[float]]] = {code: {group: [] for group in GROUPS} for code in codes}
    rewards: dict[str, dict[str, list[float | None]]] = {code: {} for code in codes}
    for _ in range(args.rounds):
        for group, (completion, gold) in GROUPS.items():
            for code, module in codes.items():
                began = time.monotonic()
                scored = module.math_reward(["q"] * args.group_size, [completion] * args.group_size,
                                            answer=[gold] * args.group_size)  # fmt: skip
                seconds[code][group].append(time.monotonic() - began)
                rewards[code][group] = scored
    medians = {
        code: {group: statistics.median(v) for group, v in by_group.items()} for code, by_group in seconds.items()
    }
    record = run_record()
    lines = [
        "# What `math_reward` spends on one group",
        "",
        *record_lines(record),
        "",
        f"Wall seconds of one `math_reward` call on a group of {args.group_size} answers to one question, the median "
        f"of {args.rounds} calls, each code in turn.",
        "",
        "| group | " + " | ".join(codes) + " |",
        "|---|" + "---|" * len(codes),
        *(f"| {group} | " + " | ".join(f"{medians[code][group]:.2f}" for code in codes) + " |" for group in GROUPS),
    ]
    data = {**record, "base": args.base, "group_size": args.group_size, "seconds": seconds, "median_seconds": medians,
            "rewards": rewards}  # fmt: skip
    write_report(args.output_dir, "math_reward_cost", data, lines)
    print("\n".join(lines))
    return data


if __name__ == "__main__":
    main()
