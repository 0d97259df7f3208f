"""The transport's reading side at swarm sizes one machine cannot host: N publishers and one reader on an in-memory
DHT and a manual clock, with the real publisher, reader, record encoding and index layout.

What it answers (issue 14, "beyond this machine"): as N grows with the load per peer held constant, how many
bytes of index does a reader pull per poll, how many records does it fetch, how old are the groups it takes, how
many different senders do they come from, and how large is the largest single sender's share? What it leaves out:
the network (latency, loss, hivemind's routing and replication), which benchmarks/swarm_transport.py measures on
real p2pd daemons for the N this machine holds.

    python -m benchmarks.transport_simulation --sizes 8 64 512
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: the repository's packages come first
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import RESULTS, run_record, write_report  # noqa: E402


def simulate(peers: int, steps: int, step_seconds: float, j: int, seed: int = 0) -> dict[str, Any]:
    """``peers`` publishers each publish one record of 2 groups per step; one reader takes ``j`` groups per step."""
    from hivemind.utils.crypto import RSAPrivateKey

    from swarm.clock import ManualClock
    from swarm.config import DHTTransportConfig
    from swarm.memory import DictDHT
    from swarm.publisher import SwarmPublisher
    from swarm.reader import SwarmReader
    from swarm.records import Group, Provenance
    from swarm.transport import SwarmCounters, TimingLog

    rng = random.Random(seed)
    clock, dht = ManualClock(), DictDHT()
    config = DHTTransportConfig(prefetch_groups=2 * j)
    publishers = []
    for _ in range(peers):
        key = RSAPrivateKey().get_public_key().to_bytes()
        publishers.append(SwarmPublisher(config, key, SwarmCounters(), TimingLog(clock), clock))
    reader_counters = SwarmCounters()
    reader = SwarmReader(
        config, RSAPrivateKey().get_public_key().to_bytes(), reader_counters, TimingLog(clock), clock, rng
    )
    offsets = [rng.uniform(0, step_seconds) for _ in range(peers)]  # peers step out of phase
    ages, senders, index_bytes, record_fetches = [], Counter(), [], []
    polls_per_step = max(1, round(step_seconds / config.poll_interval))
    for step in range(steps):
        for tick in range(polls_per_step):
            start = step * step_seconds + tick * config.poll_interval
            for index, publisher in enumerate(publishers):
                due = step * step_seconds + offsets[index]
                if start <= due < start + config.poll_interval:
                    groups = [
                        Group(
                            group_id=f"{index}-{step}-{g}",
                            prompt=[{"role": "user", "content": f"What is {step} + {g}?"}],
                            completions=[f"<answer>{step + g}</answer> " * 4] * 4,
                            provenance=Provenance("reasoning_gym", "basic_arithmetic", {}, seed=index, index=step),
                            created_at=clock.time(),
                        )
                        for g in range(2)
                    ]
                    publisher.queue(groups)
                    asyncio.run(publisher.flush(dht))
            before, fetched_before = dht.bytes_read, reader_counters.snapshot().get("fetched_records", 0)
            asyncio.run(reader.poll(dht))
            index_bytes.append(dht.bytes_read - before)
            record_fetches.append(reader_counters.snapshot().get("fetched_records", 0) - fetched_before)
            clock.advance(config.poll_interval)
        taken = reader.take(j)  # the reader's training step
        ages += [clock.time() - item.group.created_at for item in taken]
        senders.update(item.sender for item in taken)
    taken_total = sum(senders.values())
    return {
        "peers": peers,
        "steps": steps,
        "bytes_read_per_poll": statistics.fmean(index_bytes),
        "bytes_read_per_step": statistics.fmean(index_bytes) * polls_per_step,
        "records_fetched_per_step": sum(record_fetches) / steps,
        "fill_rate": taken_total / (steps * j),
        "age_median_seconds": statistics.median(ages) if ages else None,
        "distinct_senders": len(senders),
        "largest_sender_share": max(senders.values()) / taken_total if taken_total else None,
        "known_peers": len(reader.peers()),
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Simulate each size and write transport_simulation.{json,md}."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.transport_simulation", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[8, 64, 512], help="numbers of publishing peers")
    parser.add_argument("--steps", type=int, default=20, help="steps of the reader (and of every publisher)")
    parser.add_argument("--step-seconds", type=float, default=30.0, help="seconds of one step (every peer's)")
    parser.add_argument("--j", type=int, default=4, help="external groups the reader takes per step")
    parser.add_argument("--results-dir", default=str(RESULTS), help="where the outputs go")
    args = parser.parse_args(argv)
    record = run_record()
    runs = []
    for peers in args.sizes:
        print(f"transport_simulation: N={peers} ...", flush=True)
        runs.append(simulate(peers, args.steps, args.step_seconds, args.j))
    report = {**record, "settings": vars(args), "runs": runs}
    lines = [
        "# Transport reading side, simulated to larger swarms (real publisher, reader and records; in-memory DHT)",
        "",
        f"Command: `{report['command']}`  ",
        f"Commit: `{report['git_commit']}`, {report['date']}, {report['machine']}  ",
        f"Setup: every peer publishes one record of 2 groups per {args.step_seconds:g} s step (out of phase); one "
        f"reader polls every second with the default settings (8 index shards, 2 read per poll) and takes "
        f"J = {args.j} groups per step, for {args.steps} steps. No network: bytes are what the reader's lookups "
        "return.",
        "",
        "| N | index+record KB read per step | records fetched per step | fill rate | group age at take s (median) "
        "| distinct senders taken | largest sender's share | peers known |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        age = "-" if r["age_median_seconds"] is None else f"{r['age_median_seconds']:.0f}"
        share = "-" if r["largest_sender_share"] is None else f"{r['largest_sender_share']:.2f}"
        lines.append(
            f"| {r['peers']} | {r['bytes_read_per_step'] / 1e3:.1f} | {r['records_fetched_per_step']:.1f} "
            f"| {r['fill_rate']:.2f} | {age} | {r['distinct_senders']} | {share} | {r['known_peers']} |"
        )
    write_report(Path(args.results_dir), "transport_simulation", report, lines)
    print("\n".join(lines))
    return report


if __name__ == "__main__":
    main()
