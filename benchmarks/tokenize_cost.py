"""What tokenizing one received completion costs the intake, honest or long, against a base commit.

The intake tokenizes every completion of a received group under this peer's tokenizer (`PolicyProbe.tokenize`) and
keeps its first `max_completion_length` tokens. A sender chooses the length of its text, up to the wire's
`max_completion_chars` (32,768 characters). This script times `tokenize` with this tree's `sapo/probe.py` and a base
commit's (read with `git show`) alternately in one process, on the default model's tokenizer, for each completion
shape and each local limit, and reports CPU milliseconds per completion and each shape's cost as a multiple of the
honest one's:

    python -m benchmarks.tokenize_cost --base 5a1b2c3

Writes ``tokenize_cost.{json,md}`` into ``--output-dir`` (default benchmarks/results).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

from benchmarks.answer_search_cost import CHARS, base_and_this_tree
from benchmarks.harness import RESULTS, record_lines, run_record, write_report


def shapes() -> dict[str, str]:
    """Each completion shape's text: an honest answer, and texts of the wire's most characters whose tokens are
    short (digits, CJK, code points of any script), usual (prose) or long (runs of spaces)."""
    rng = random.Random(0)
    words = "the of and to in is that it for was on are as with his they at be this from".split()
    return {
        "honest": "Let me add them. 2 + 3 = 5, so the sum is five.\n<answer>5</answer>",
        "prose": " ".join(rng.choice(words) for _ in range(CHARS))[:CHARS],
        "digits": "".join(rng.choice("0123456789") for _ in range(CHARS)),
        "CJK": "".join(chr(rng.randint(0x4E00, 0x9FFF)) for _ in range(CHARS)),
        "any script": "".join(chr(rng.randint(0x21, 0x2FFF)) for _ in range(CHARS)),
        "spaces": " " * CHARS,
    }


def probe_for(module: ModuleType, tokenizer: Any, limit: int) -> Any:
    """``module``'s `PolicyProbe` over the trainer parts `tokenize` reads: the tokenizer, the limit, no answer end."""
    trainer = SimpleNamespace(
        args=SimpleNamespace(max_completion_length=limit, external_answer_end=None),
        text_tokenizer=tokenizer,
        eos_token_ids=[tokenizer.eos_token_id],
    )
    return module.PolicyProbe(trainer, ["prompt"])


def cpu_ms(probe: Any, text: str, repeats: int) -> float:
    """CPU milliseconds of one ``probe.tokenize(text)``, the mean of ``repeats``."""
    began = time.process_time()
    for _ in range(repeats):
        probe.tokenize(text)
    return 1000 * (time.process_time() - began) / repeats


def measure(
    codes: dict[str, ModuleType], tokenizer: Any, limits: list[int], rounds: int
) -> dict[str, dict[str, dict[str, float]]]:
    """Per code, limit and shape, the median over ``rounds`` of CPU ms per completion, the codes alternating."""
    texts = shapes()
    probes = {code: {limit: probe_for(module, tokenizer, limit) for limit in limits} for code, module in codes.items()}
    samples = {code: {str(limit): {shape: [] for shape in texts} for limit in limits} for code in codes}
    for _ in range(rounds):
        for limit in limits:
            for shape, text in texts.items():
                repeats = 200 if shape == "honest" else 3
                for code in codes:
                    samples[code][str(limit)][shape].append(cpu_ms(probes[code][limit], text, repeats))
    return {
        code: {limit: {s: sorted(v)[len(v) // 2] for s, v in by_shape.items()} for limit, by_shape in by_limit.items()}
        for code, by_limit in samples.items()
    }


def markdown(costs: dict[str, dict[str, dict[str, float]]]) -> list[str]:
    """The table: per limit and shape, CPU ms per completion with each code, and the base's over this tree's."""
    base, this = list(costs)
    lines = [
        f"| limit (tokens) | completion | characters | {base}: CPU ms | this tree: CPU ms | {base} / this tree |",
        "|---|---|---|---|---|---|",
    ]
    texts = shapes()
    for limit, by_shape in costs[this].items():
        for shape, ms in by_shape.items():
            old = costs[base][limit][shape]
            lines.append(f"| {limit} | {shape} | {len(texts[shape])} | {old:.3f} | {ms:.3f} | {old / ms:.1f} |")
    return lines


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Time both codes on every shape and limit, and write the report."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", required=True, help="the commit whose sapo/probe.py is compared")
    parser.add_argument("--limits", type=int, nargs="+", default=[48, 256, 1024], help="max_completion_length values")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of every shape, limit and code (default 5)")
    parser.add_argument("--output-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    from sapo.models import load_smollm2_tokenizer

    codes = base_and_this_tree("sapo/probe.py", args.base)
    record = run_record(" ".join(["python -m benchmarks.tokenize_cost", *(argv or sys.argv[1:])]))
    costs = measure(codes, load_smollm2_tokenizer(), args.limits, args.rounds)
    data = {**record, "base": args.base, "rounds": args.rounds, "cpu_ms_per_completion": costs}
    lines = [
        "# What tokenizing a received completion costs",
        "",
        *record_lines(record),
        "",
        f"`PolicyProbe.tokenize` of one completion under the default model's tokenizer (SmolLM2), CPU ms (the median "
        f"of {args.rounds} rounds, the two codes alternating in each).",
        "",
        *markdown(costs),
    ]
    write_report(args.output_dir, "tokenize_cost", data, lines)
    print("\n".join(lines))
    return data


if __name__ == "__main__":
    main()
