"""The transport's reading side at swarm sizes one machine cannot host: N publishers and one reader on an in-memory
DHT and a manual clock, with the real publisher, reader, record encoding and index layout.

What it answers (issue 14, "beyond this machine"): as N grows with the load per peer held constant, how many
bytes of index and of records does a reader pull per step, how many records does it fetch, how old are the groups
it takes, how many different senders do they come from, how large is the largest single sender's share, and how
many index entries does a publisher store per publication? What it leaves out: the network (latency, loss,
hivemind's routing and replication), which benchmarks/swarm_transport.py measures on real p2pd daemons for the N
this machine holds, and signatures (peers' public keys are random bytes of an RSA key's size: DictDHT checks
nothing, and generating 2048 RSA keys would take minutes).

Every publisher writes its index entry up to the level its own peer's reader would choose; the simulation has one
reader, so every publisher uses that reader's :meth:`~swarm.reader.SwarmReader.write_levels` (peers of one swarm
see the same N).

    python -m benchmarks.transport_simulation --sizes 8 64 512 2048
    python -m benchmarks.transport_simulation --sizes 512 --set index_refresh_interval=60
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import random
import statistics
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.harness import RESULTS, record_lines, run_record, write_report


def _public_key(rng: random.Random) -> bytes:
    """Random bytes shaped like an OpenSSH RSA public key (380 bytes), standing in for a real one."""
    return b"ssh-rsa " + base64.b64encode(rng.randbytes(279))


def simulate(
    peers: int, steps: int, step_seconds: float, j: int, seed: int = 0, overrides: dict[str, Any] | None = None
) -> dict[str, Any]:
    """``peers`` publishers each publish one record of 2 groups per step; one reader takes ``j`` groups per step.

    ``overrides`` replace fields of the (default) DHTTransportConfig that every peer uses.
    """
    from swarm.clock import ManualClock
    from swarm.config import DHTTransportConfig
    from swarm.memory import DictDHT
    from swarm.publisher import SwarmPublisher
    from swarm.reader import SwarmReader
    from swarm.records import Group, Provenance
    from swarm.transport import SwarmCounters, TimingLog

    rng = random.Random(seed)
    clock = ManualClock()
    dht = DictDHT(clock)
    config = DHTTransportConfig(**{"prefetch_groups": 2 * j, **(overrides or {})})
    reader_counters = SwarmCounters()
    reader = SwarmReader(config, _public_key(rng), reader_counters, TimingLog(clock), clock, rng)
    publisher_counters = SwarmCounters()  # shared: only totals are reported
    publishers = [
        SwarmPublisher(
            config, _public_key(rng), publisher_counters, TimingLog(clock), clock, write_levels=reader.write_levels
        )
        for _ in range(peers)
    ]
    offsets = [rng.uniform(0, step_seconds) for _ in range(peers)]  # peers step out of phase
    ages, senders, index_bytes, record_fetches = [], Counter(), [], []
    levels: Counter[int] = Counter()
    index_bytes_at_step_end = []  # the reader's index bytes so far, at the end of each step
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
            reads_before = reader_counters.snapshot().get("index_reads", 0)
            level = reader.read_level()
            asyncio.run(reader.poll(dht))
            if reader_counters.snapshot().get("index_reads", 0) > reads_before:
                levels[level] += 1
            index_bytes.append(dht.bytes_read - before)
            record_fetches.append(reader_counters.snapshot().get("fetched_records", 0) - fetched_before)
            clock.advance(config.poll_interval)
        index_bytes_at_step_end.append(reader_counters.snapshot().get("index_bytes_read", 0))
        taken = reader.take(j)  # the reader's training step
        ages += [clock.time() - item.group.created_at for item in taken]
        senders.update(item.sender for item in taken)
    taken_total = sum(senders.values())
    read = reader_counters.snapshot()
    published = publisher_counters.snapshot()
    publications = max(1, published.get("published_records", 0))
    estimate = reader.estimated_peers()
    return {
        "peers": peers,
        "steps": steps,
        "overrides": overrides or {},
        "bytes_read_per_poll": statistics.fmean(index_bytes),
        "bytes_read_per_step": statistics.fmean(index_bytes) * polls_per_step,
        "index_bytes_per_step": read.get("index_bytes_read", 0) / steps,
        # the second half of the run: every peer joined at t = 0, so the first reads see the swarm fill up
        "index_bytes_per_step_second_half": (
            (index_bytes_at_step_end[-1] - index_bytes_at_step_end[steps // 2 - 1]) / (steps - steps // 2)
            if steps >= 2
            else None
        ),
        "record_bytes_per_step": read.get("fetched_bytes", 0) / steps,
        "index_reads_per_step": read.get("index_reads", 0) / steps,
        "index_entries_per_read": read.get("index_entries_read", 0) / max(1, read.get("index_reads", 0)),
        "levels_read": dict(sorted(levels.items())),
        "estimated_peers": estimate,
        "index_stores_per_publication": published.get("index_stores", 0) / publications,
        "records_fetched_per_step": sum(record_fetches) / steps,
        "fill_rate": taken_total / (steps * j),
        "age_median_seconds": statistics.median(ages) if ages else None,
        "distinct_senders": len(senders),
        "largest_sender_share": max(senders.values()) / taken_total if taken_total else None,
        "known_peers": len(reader.peers()),
    }


def _override(text: str) -> tuple[str, Any]:
    """``name=value`` of a DHTTransportConfig field, the value read as an int, a float, or else text."""
    name, _, value = text.partition("=")
    for kind in (int, float):
        try:
            return name, kind(value)
        except ValueError:
            pass
    return name, value


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Simulate each size and write transport_simulation.{json,md}."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.transport_simulation", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[8, 64, 512], help="numbers of publishing peers")
    parser.add_argument("--steps", type=int, default=20, help="steps of the reader (and of every publisher)")
    parser.add_argument("--step-seconds", type=float, default=30.0, help="seconds of one step (every peer's)")
    parser.add_argument("--j", type=int, default=4, help="external groups the reader takes per step")
    parser.add_argument(
        "--set", action="append", default=[], metavar="FIELD=VALUE", help="a DHTTransportConfig field (repeatable)"
    )
    parser.add_argument("--results-dir", default=str(RESULTS), help="where the outputs go")
    parser.add_argument("--stem", default="transport_simulation", help="name of the report files")
    args = parser.parse_args(argv)
    overrides = dict(_override(text) for text in args.set)
    record = run_record()
    runs = []
    for peers in args.sizes:
        print(f"transport_simulation: N={peers} ...", flush=True)
        started = time.perf_counter()
        runs.append(simulate(peers, args.steps, args.step_seconds, args.j, overrides=overrides))
        print(f"  {time.perf_counter() - started:.0f} s", flush=True)
    report = {**record, "settings": vars(args), "runs": runs}
    from swarm.config import DHTTransportConfig

    config = DHTTransportConfig(**overrides)
    lines = [
        "# Transport reading side, simulated to larger swarms (real publisher, reader and records; in-memory DHT)",
        "",
        *record_lines(report),
        f"Setup: every peer publishes one record of 2 groups per {args.step_seconds:g} s step (out of phase); one "
        f"reader polls every {config.poll_interval:g} s ({config.index_shards} index shards at level 0, up to level "
        f"{config.index_max_level}; {config.index_shards_per_poll} shards per index read, at the level whose shards "
        f"hold about {config.index_shard_entries} entries; index read when the cache needs groups, at most every "
        f"{config.index_min_interval:g} s, and every {config.index_refresh_interval:g} s) and takes J = {args.j} "
        f"groups per step, for {args.steps} steps"
        + (f"; settings changed: {', '.join(args.set)}" if args.set else "")
        + ". No network: bytes are the values the reader's lookups return (no keys, subkeys or signatures).",
        "",
        "| N | index KB read per step | index KB per step, 2nd half | record KB read per step | index reads per step "
        "| entries per index read | levels read | index stores per publication | records fetched per step | fill rate "
        "| group age at take s (median) | distinct senders taken | largest sender's share | peers known |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        age = "-" if r["age_median_seconds"] is None else f"{r['age_median_seconds']:.0f}"
        share = "-" if r["largest_sender_share"] is None else f"{r['largest_sender_share']:.2f}"
        levels = ", ".join(f"{level}: {count}" for level, count in r["levels_read"].items())
        half = r["index_bytes_per_step_second_half"]
        lines.append(
            f"| {r['peers']} | {r['index_bytes_per_step'] / 1e3:.2f} | {'-' if half is None else f'{half / 1e3:.2f}'} "
            f"| {r['record_bytes_per_step'] / 1e3:.2f} "
            f"| {r['index_reads_per_step']:.1f} | {r['index_entries_per_read']:.1f} | {levels} "
            f"| {r['index_stores_per_publication']:.1f} | {r['records_fetched_per_step']:.1f} | {r['fill_rate']:.2f} "
            f"| {age} | {r['distinct_senders']} | {share} | {r['known_peers']} |"
        )
    lines += [
        "",
        "Levels read: `level: index reads at it`. Entries per index read counts the valid entries the reader "
        "decoded; index stores per publication is the index entries (one per level) each publisher stored with each "
        "record (a peer's first publication, before it has an estimate of N, goes to every level). Every peer joins "
        "at t = 0, so the reader's first reads see the swarm fill up (its estimate of N lags, it reads low levels); "
        "the 2nd-half column leaves that start out.",
    ]
    write_report(Path(args.results_dir), args.stem, report, lines)
    print("\n".join(lines))
    return report


if __name__ == "__main__":
    main()
