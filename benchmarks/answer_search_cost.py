"""What reading a received completion's answer costs, honest or crafted, against a base commit.

The intake finds a received completion's answer end (`rewards.final_answer`) and the rewards read its answer
(`rewards.extract_answer`: answer tags, boxes, reasoning blocks). A pattern search over a text of many unclosed tags
retries every tag to the text's end: its time grows with the square of the text's length, which a sender chooses (up
to `max_completion_chars`, 32,768 characters). This script times both functions on each completion shape, with this
tree's `rewards/extract.py` and a base commit's (read with `git show`) alternately in one process, and reports CPU
milliseconds per completion and each shape's cost as a multiple of the honest one's:

    python -m benchmarks.answer_search_cost --base deb2b55

Writes ``answer_search_cost.{json,md}`` into ``--output-dir`` (default benchmarks/results).
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from benchmarks.harness import RESULTS, ROOT, record_lines, run_record, write_report

CHARS = 32768
"""A crafted completion's length: the wire's most characters of one completion
(`swarm.records.RecordLimits.max_completion_chars`)."""

SHAPES: dict[str, str] = {
    "honest": "Let me add them. 2 + 3 = 5, so the sum is five.\n<answer>5</answer>",
    "unclosed answer tags": "<answer>" * (CHARS // len("<answer>")),
    "unclosed reasoning tags": "<think>" * (CHARS // len("<think>")),
    "unclosed boxes": "\\boxed{" * (CHARS // len("\\boxed{")),
}


def load_extract(source: str, name: str) -> ModuleType:
    """A Python file's ``source`` (here ``rewards/extract.py``'s) as a module of its own (``name``), beside the
    imported one."""
    spec = importlib.util.spec_from_loader(name, loader=None)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before it runs: a dataclass finds its module's names there
    exec(compile(source, f"<{name}>", "exec"), module.__dict__)  # noqa: S102  (this repository's own file)
    return module


def base_and_this_tree(path: str, base: str) -> dict[str, ModuleType]:
    """The repository file ``path`` twice as modules: the ``base`` commit's (``git show``) and this tree's, keyed
    ``"base BASE"`` and ``"this tree"``."""
    base_source = subprocess.run(
        ["git", "show", f"{base}:{path}"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    stem = Path(path).stem
    return {
        f"base {base}": load_extract(base_source, f"base_{stem}"),
        "this tree": load_extract((ROOT / path).read_text(), f"this_{stem}"),
    }


def cpu_ms(module: ModuleType, text: str, repeats: int) -> float:
    """CPU milliseconds of one ``final_answer`` and one ``extract_answer`` of ``text``, the mean of ``repeats``."""
    began = time.process_time()
    for _ in range(repeats):
        module.final_answer(text)
        module.extract_answer(text)
    return 1000 * (time.process_time() - began) / repeats


def measure(codes: dict[str, ModuleType], rounds: int) -> dict[str, dict[str, float]]:
    """Per code and shape, the median over ``rounds`` of CPU ms per completion, the codes alternating in each round."""
    samples: dict[str, dict[str, list[float]]] = {code: {shape: [] for shape in SHAPES} for code in codes}
    for _ in range(rounds):
        for shape, text in SHAPES.items():
            repeats = 200 if shape == "honest" else 1
            for code, module in codes.items():
                samples[code][shape].append(cpu_ms(module, text, repeats))
    return {code: {s: sorted(v)[len(v) // 2] for s, v in by_shape.items()} for code, by_shape in samples.items()}


def markdown(costs: dict[str, dict[str, float]]) -> list[str]:
    """The table: CPU ms per completion and the multiple of the honest completion's, per code."""
    codes = list(costs)
    lines = [
        "| completion | characters | " + " | ".join(f"{c}: CPU ms | {c}: x honest" for c in codes) + " |",
        "|---|---|" + "---|---|" * len(codes),
    ]
    for shape, text in SHAPES.items():
        cells = [f"{costs[c][shape]:.3f} | {costs[c][shape] / costs[c]['honest']:.0f}" for c in codes]
        lines.append(f"| {shape} | {len(text)} | " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Time both codes on every shape and write the report."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", required=True, help="the commit whose rewards/extract.py is compared")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of every shape and code (default 5)")
    parser.add_argument("--output-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    codes = base_and_this_tree("rewards/extract.py", args.base)
    record = run_record(" ".join(["python -m benchmarks.answer_search_cost", *(argv or sys.argv[1:])]))
    costs = measure(codes, args.rounds)
    data = {**record, "base": args.base, "rounds": args.rounds, "cpu_ms_per_completion": costs}
    lines = [
        "# What reading a received completion's answer costs",
        "",
        *record_lines(record),
        "",
        f"`final_answer` and `extract_answer` of one completion, CPU ms (the median of {args.rounds} rounds, the two "
        "codes alternating in each).",
        "",
        *markdown(costs),
    ]
    write_report(args.output_dir, "answer_search_cost", data, lines)
    print("\n".join(lines))
    return data


if __name__ == "__main__":
    main()
