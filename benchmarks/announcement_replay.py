"""What a flood of announcements from one libp2p peer makes a node spend: the same signed announcement published over
and over, one signed afresh each time, and one with a forged signature each time.

Two `DHTTransport`s on 127.0.0.1: the node, idle, and a hostile peer in its own process that publishes announcements
on the node's topic for ``--seconds`` seconds, ``--publishers`` publishes at once through its own p2pd. Arm "replay":
one announcement, signed once, published again and again (a node drops a copy from the same publisher before its
signature check: :class:`swarm.repeats.RecentMessages`). Arm "signed afresh": each announcement dated and signed anew
(about 1 ms of the attacker's CPU each), so every one is checked. Arm "forged": a valid announcement's signature
replaced by random bytes each time, which costs the attacker nothing and the node a signature check. Per arm: what the
hostile peer sent, what the node took, dropped as repeated, dropped unread by the announcement gate
(:mod:`swarm.announcement_gate`) and refused, and the CPU seconds of the node's Python process (its p2pd apart) per
second and per message delivered:

    python -m benchmarks.announcement_replay

Writes ``announcement_replay.{json,md}`` into ``--output-dir`` (default benchmarks/results).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import RESULTS, record_lines, run_record, write_report

LOOPBACK = {"host_maddrs": ["/ip4/127.0.0.1/tcp/0"], "check_reachability": False}
ARMS = ("replay", "signed afresh", "forged")
UNREAD = ("rejected/announce_rested", "rejected/announce_budget", "rejected/announce_strangers")
"""What the announcement gate drops before reading (:mod:`swarm.announcement_gate`)."""


def _hostile(addresses: list[str], arm: str, seconds: float, publishers: int, sent: Any) -> None:
    """The hostile peer: join through ``addresses``, then publish announcements for ``seconds`` (``arm``'s way)."""
    import msgpack
    from hivemind.utils.crypto import RSAPrivateKey

    from swarm.announcements import AnnouncedRecord, encode_announcement
    from swarm.levels import publish_topics
    from swarm.pubsub import publish
    from testbed.dht_peers import dht_peer_factory

    with dht_peer_factory(LOOPBACK) as make:
        transport = make(initial_peers=addresses)
        time.sleep(8)  # the node's subscription reaches this peer's p2pd
        key = RSAPrivateKey()
        records = [AnnouncedRecord(i, time.time(), 1, 1000, os.urandom(32), ("t",)) for i in range(4)]
        topic = publish_topics(transport.peer_id, 0, transport.config)[0]

        def announcement() -> bytes:
            return encode_announcement(key, transport.config.swarm_name, "m", time.time(), None, records)

        once = announcement()
        payload, key_blob, _ = msgpack.unpackb(once)

        def message() -> bytes:
            if arm == "replay":
                return once
            if arm == "forged":  # no signing: random bytes where the signature goes
                return msgpack.packb([payload, key_blob, os.urandom(256)], use_bin_type=True)
            return announcement()

        async def flood() -> int:
            count, end = 0, time.monotonic() + seconds

            async def publisher() -> None:
                nonlocal count
                while time.monotonic() < end:
                    try:
                        await publish(transport.peer.p2p, topic, message())
                        count += 1
                    except Exception:  # p2pd's queue full: wait a little
                        await asyncio.sleep(0.01)

            await asyncio.gather(*(publisher() for _ in range(publishers)))
            return count

        sent.put(asyncio.run_coroutine_threadsafe(flood(), transport.peer.loop).result(seconds + 60))


def _sent(queue: Any) -> int:
    """What the hostile peer says it sent; an error if it never got to flood (its traceback is on stderr)."""
    try:
        return queue.get(timeout=10)
    except Exception as e:
        raise RuntimeError("the hostile peer did not finish its flood: see its traceback above") from e


def run_arm(arm: str, seconds: float, publishers: int) -> dict[str, Any]:
    """One arm: the node's counts and CPU while the hostile peer floods it."""
    from testbed.dht_peers import dht_peer_factory

    spawn = mp.get_context("spawn")
    with dht_peer_factory(LOOPBACK) as make:
        node = make()
        sent = spawn.Queue()
        hostile = spawn.Process(target=_hostile, args=(node.visible_addresses(), arm, seconds, publishers, sent))
        hostile.start()
        try:
            time.sleep(8)  # the hostile peer's start and join
            before, times, started = node.readout().counters, os.times(), time.monotonic()
            hostile.join(seconds + 90)
            after, ended = node.readout().counters, time.monotonic()
            end_times = os.times()
        finally:
            if hostile.is_alive():
                hostile.kill()
                hostile.join()
        cpu = (end_times.user - times.user) + (end_times.system - times.system)
        counts = {
            name: after.get(name, 0) - before.get(name, 0)
            for name in ("announcements_received", "announcements_repeated")
        }
        dropped_unread = sum(after.get(k, 0) - before.get(k, 0) for k in UNREAD)
        refused = sum(
            after.get(k, 0) - before.get(k, 0) for k in after if k.startswith("rejected/") and k not in UNREAD
        )
        delivered = counts["announcements_received"] + counts["announcements_repeated"] + refused + dropped_unread
        return {
            "arm": arm,
            "sent": _sent(sent),
            "taken": counts["announcements_received"],
            "repeated": counts["announcements_repeated"],
            "dropped_unread": dropped_unread,
            "refused": refused,
            "wall_seconds": ended - started,
            "node_cpu_seconds": cpu,
            "node_cpu_us_per_message": 1e6 * cpu / delivered if delivered else None,
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="how long each arm floods (default 10)")
    parser.add_argument("--publishers", type=int, default=8, help="publishes at once (default 8)")
    parser.add_argument("--output-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    record = run_record()
    rows = [run_arm(arm, args.seconds, args.publishers) for arm in ARMS]
    lines = [
        "# A flood of announcements from one libp2p peer",
        "",
        *record_lines(record),
        "",
        "| arm | sent | taken | dropped as repeated | dropped unread by the gate | refused | node CPU s (per s) "
        "| node CPU per message |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        per_second = row["node_cpu_seconds"] / row["wall_seconds"]
        per_message = row["node_cpu_us_per_message"]
        lines.append(
            f"| {row['arm']} | {row['sent']} | {row['taken']} | {row['repeated']} | {row['dropped_unread']} "
            f"| {row['refused']} "
            f"| {row['node_cpu_seconds']:.2f} ({per_second:.2f}) "
            f"| {'-' if per_message is None else f'{per_message:.0f} µs'} |"
        )
    lines += [
        "",
        "The node's Python process only (its p2pd apart), over the flood's length. The node is idle otherwise.",
    ]
    paths = write_report(args.output_dir, "announcement_replay", {**record, "arms": rows}, lines)
    print("\n".join(lines))
    print(f"wrote {paths['md']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
