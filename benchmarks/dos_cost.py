"""What a denial-of-service group costs a receiver before training: ground-truth verification, completion hygiene,
reward scoring and tokenization of 4 completions padded to the transport's per-completion limit, against the same
group as its sender wrote it.

    python -m benchmarks.dos_cost --pool runs/poisoning/pools/adaptive-format-seed0-6.jsonl

The groups come from an attack pool of :mod:`testbed.adaptive_attack` (policy text sampled from the default model);
each one's denial-of-service twin is :func:`testbed.adaptive_attack.dos_completion` of its clean completions (about
32,000 characters each, ending in the same answer). Training itself is bounded by ``max_completion_length`` (48
tokens: the receiver truncates), so this is the part a long completion adds. Results:
benchmarks/results/dos_cost.{json,md}.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.harness import RESULTS, record_lines, run_record, write_report


def receive_seconds(group: Any, tokenizer: Any, max_tokens: int, repeats: int) -> float:
    """Median seconds to verify, check, score and tokenize ``group`` as a receiver does."""
    from rewards.functions import reasoning_gym_reward
    from sapo.hygiene import CompletionHygiene
    from sapo.sources import ReasoningGymSource, SourceRegistry

    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        columns = SourceRegistry([ReasoningGymSource()]).columns_for(group)
        CompletionHygiene().group_problem(group.completions)
        n = len(group.completions)
        reasoning_gym_reward(prompts=[group.prompt] * n, completions=group.completions, entry=[columns["entry"]] * n)
        for text in group.completions:
            tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"][:max_tokens]
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Measure and write the report."""
    import dataclasses

    from sapo.models import load_smollm2_tokenizer
    from swarm.records import GroupRecord, encode_record
    from testbed.adaptive_attack import carries_payload, dos_completion, load_pool

    parser = argparse.ArgumentParser(prog="python -m benchmarks.dos_cost", description=__doc__.split("\n")[0])
    parser.add_argument("--pool", required=True, help="an attack pool (JSON lines) of testbed.adaptive_attack")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--results-dir", default=str(RESULTS))
    args = parser.parse_args(argv)
    record = run_record()
    tokenizer = load_smollm2_tokenizer()
    rows = []
    for group in load_pool(Path(args.pool)):
        clean = [text for text in group.completions if not carries_payload(text)]
        dos = dataclasses.replace(group, completions=[dos_completion(clean, text[-40:]) for text in group.completions])
        sizes = [len(encode_record(GroupRecord(groups=[g], created_at=time.time()))) for g in (group, dos)]
        rows.append(
            {
                "as_sent_s": receive_seconds(group, tokenizer, 48, args.repeats),
                "dos_s": receive_seconds(dos, tokenizer, 48, args.repeats),
                "as_sent_bytes": sizes[0],
                "dos_bytes": sizes[1],
            }
        )
    report = {**record, "pool": args.pool, "groups": rows}
    mean = {key: statistics.fmean(r[key] for r in rows) for key in rows[0]}
    lines = [
        "# What a denial-of-service group costs a receiver before training",
        "",
        *record_lines(record),
        f"Groups: {len(rows)} of `{args.pool}`, each also padded to ~32,000 characters per completion.",
        "",
        "| group | verify + hygiene + reward + tokenize, ms | record bytes |",
        "|---|---|---|",
        f"| as sent | {1000 * mean['as_sent_s']:.1f} | {mean['as_sent_bytes']:.0f} |",
        f"| padded (dos) | {1000 * mean['dos_s']:.1f} | {mean['dos_bytes']:.0f} |",
        "",
        "The receiver trains on at most `max_completion_length` tokens of any completion (48 by default), so training "
        "and the plausibility pass cost what an own group costs; a node scores at most `external_pool_size` received "
        "groups per step (4 by default), so a swarm of such groups adds at most 4 times the padded figure per step.",
    ]
    write_report(Path(args.results_dir), "dos_cost", report, lines)
    print("\n".join(lines))
    return report


if __name__ == "__main__":
    main()
