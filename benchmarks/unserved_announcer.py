"""What a sender announcing records it never serves takes of a reader's refills, against a base commit.

A reader's book (`swarm.senders.SenderBook`, the real one, on a simulated clock) hears two unknown senders for
``--steps`` steps of a second: an honest one announcing one record of ``--groups`` groups a step and serving every
record asked for, and a ghost announcing ``--burst`` fresh records a step (each pushing out older ones before a second
try) and answering every request without the record. Each step the reader chooses records for ``--need`` groups and
asks for each: the honest one's arrive, the ghost's are answered without. Both codes (a ``git worktree`` of
``--base``, and this tree) run the same steps in a process of their own:

    python -m benchmarks.unserved_announcer --base bbd0acd

Reported per code: the ghost's records asked for (requests spent in vain), the honest records fetched, the honest
records heard and never fetched, and the ghost's strikes. Writes ``unserved_announcer.{json,md}`` into
``--output-dir`` (default benchmarks/results).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.harness import RESULTS, ROOT, base_worktree, record_lines, run_record, write_report

SIMULATION = r"""
import json, random, sys
from swarm.announcements import AnnouncedRecord, Announcement
from swarm.clock import ManualClock
from swarm.config import DHTTransportConfig
from swarm.senders import SenderBook
from swarm.transport import SwarmCounters

steps, need, groups, burst = (int(arg) for arg in sys.argv[1:5])
clock, counters = ManualClock(), SwarmCounters()
book = SenderBook(DHTTransportConfig(), counters, clock, random.Random(0))
seqs = {"honest": 0, "ghost": 0}
figures = {"ghost_asked": 0, "honest_fetched": 0, "ghost_strikes": 0, "honest_strikes": 0}


def announce(sender, count):
    now, first = clock.time(), seqs[sender] + 1
    seqs[sender] += count
    records = tuple(AnnouncedRecord(seq, now, groups, 1000, b"d" * 32) for seq in range(first, seqs[sender] + 1))
    host = "host-of-" + sender
    book.take_announcement(Announcement(sender, b"key-" + sender.encode(), "m", now, host, records), origin=host)


for _ in range(steps):
    announce("honest", 1)
    announce("ghost", burst)
    chosen, _spares = book.choose(need)
    for choice in chosen:
        if choice.sender == "honest":
            book.mark_fetched(choice.sender, choice.ref, choice.host)
            figures["honest_fetched"] += 1
        else:
            book.record_missing(choice.sender, choice.ref)  # answered without it
            figures["ghost_asked"] += 1
    for sender, reason in book.refusals():
        figures[sender + "_strikes"] += 1
    clock.advance(1.0)
figures["honest_published"] = seqs["honest"]
figures["heard_never_fetched"] = counters.snapshot().get("heard_never_fetched", 0)
print(json.dumps(figures))
"""


def simulate(tree: Path, steps: int, need: int, groups: int, burst: int) -> dict[str, int]:
    """The simulation's figures with ``tree``'s code."""
    argv = [sys.executable, "-c", SIMULATION, *(str(n) for n in (steps, need, groups, burst))]
    result = subprocess.run(argv, cwd=tree, capture_output=True, text=True, check=True, timeout=600)
    return json.loads(result.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the simulation with both codes and write the report."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", required=True, help="the commit whose sender book is compared")
    parser.add_argument("--steps", type=int, default=300, help="steps of a second (default 300)")
    parser.add_argument("--need", type=int, default=8, help="groups the reader wants a step (default 8)")
    parser.add_argument("--groups", type=int, default=4, help="groups in each record (default 4)")
    parser.add_argument("--burst", type=int, default=16, help="records the ghost announces a step (default 16)")
    parser.add_argument("--output-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    record = run_record(" ".join(["python -m benchmarks.unserved_announcer", *(argv or sys.argv[1:])]))
    sizes = (args.steps, args.need, args.groups, args.burst)
    with base_worktree(args.base) as base_tree:
        results = {f"base {args.base}": simulate(base_tree, *sizes), "this tree": simulate(ROOT, *sizes)}
    sized = {"steps": args.steps, "need": args.need, "groups": args.groups, "burst": args.burst}
    data = {**record, "base": args.base, **sized, "results": results}
    lines = [
        "# What a sender announcing records it never serves takes of a reader's refills",
        "",
        *record_lines(record),
        "",
        f"{args.steps} steps of a (simulated) second; the reader wants {args.need} groups a step; an honest sender "
        f"announces a record of {args.groups} groups a step and serves it, a ghost announces {args.burst} a step and "
        "serves none.",
        "",
        "| code | ghost's records asked | its strikes | honest records fetched | of published | heard, never fetched |",
        "|---|---|---|---|---|---|",
        *(
            f"| {code} | {r['ghost_asked']} | {r['ghost_strikes']} | {r['honest_fetched']} | {r['honest_published']} "
            f"| {r['heard_never_fetched']} |"
            for code, r in results.items()
        ),
    ]
    write_report(args.output_dir, "unserved_announcer", data, lines)
    print("\n".join(lines))
    return data


if __name__ == "__main__":
    main()
