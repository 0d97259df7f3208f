"""What one announcement costs on GossipSub: network bytes per message per subscriber and delivery latency, by topic
size, on real p2pd daemons on loopback.

For each topic size T, T daemons with pubsub (``swarm.hivemind_bridge.PubsubP2P``) join through the first one, connect
in a ring as well, and subscribe to one topic; after the mesh has formed, they publish ``--messages`` real announcements
(signed by ``swarm.announcements``, one record listed: the size a peer sends) in turn over ``--seconds``. The TCP
bytes of all their sockets (``ss``), less the idle traffic measured just before, over the messages and subscribers,
are the network bytes one subscriber costs per announcement: GossipSub's flood publish and mesh forwarding send each
message to a subscriber several times (its duplicates), plus the gossip about it. These per-message costs feed
``benchmarks.transport_scale``.

    python -m benchmarks.transport_gossip_cost                  # T = 2, 4, 8, 16
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.harness import RESULTS, percentile, record_lines, run_record, write_report
from benchmarks.transport_accounting import tcp_sockets
from swarm.config import nat_options

LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]


def _tcp_total(snapshot: dict) -> int:
    return sum(s["sent"] + s["received"] for s in snapshot.values())


def announcement_bytes() -> bytes:
    """A real announcement of one record, as a peer sends it."""
    from hivemind.utils.crypto import RSAPrivateKey

    from swarm.announcements import AnnouncedRecord, encode_announcement, record_digest

    record = AnnouncedRecord(1795000000000, time.time(), 4, 48000, record_digest(b"record"), ("basic_arithmetic",))
    host = "12D3KooWQpaYgivmo8DEWoSmdtKQ9p9axecXpWsnMrQE9DUbrbyn"  # a libp2p id's length
    return encode_announcement(RSAPrivateKey(), "sapo", "bench", time.time(), host, [record])


async def measure(size: int, messages: int, seconds: float, idle_seconds: float = 5.0) -> dict[str, Any]:
    """Start ``size`` daemons on one topic, publish ``messages`` announcements, return bytes and latencies."""
    from hivemind.utils.multiaddr import Multiaddr

    from swarm.daemon import close_p2p
    from swarm.hivemind_bridge import PubsubP2P, connect, daemon_process
    from swarm.pubsub import publish, subscribe, topic_peers

    data = announcement_bytes()
    daemons: list[Any] = []
    readers: list[asyncio.Task] = []
    received: list[float] = []
    try:
        first = await PubsubP2P.create(host_maddrs=LOOPBACK, **nat_options(LOOPBACK))
        daemons.append(first)
        entry = [str(a) for a in await first.get_visible_maddrs()]
        for _ in range(size - 1):
            daemons.append(await PubsubP2P.create(initial_peers=entry, host_maddrs=LOOPBACK, **nat_options(LOOPBACK)))
        for left, right in zip(daemons, daemons[1:] + daemons[:1], strict=True):
            if left is not right:
                addrs = [a.decapsulate(Multiaddr(f"/p2p/{right.peer_id}")) for a in await right.get_visible_maddrs()]
                await connect(left, right.peer_id, addrs)
        sent_at: dict[bytes, float] = {}

        async def read(subscription: Any) -> None:
            async for message in subscription.messages():
                if message.data[:8] in sent_at:
                    received.append(time.perf_counter() - sent_at[message.data[:8]])

        for p2p in daemons:
            readers.append(asyncio.ensure_future(read(await subscribe(p2p, "sapo/bench"))))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            meshed = [len(await topic_peers(p2p, "sapo/bench")) for p2p in daemons]
            if min(meshed) >= min(size - 1, 1):
                break
            await asyncio.sleep(0.5)
        await asyncio.sleep(2.0)  # a heartbeat or two: the mesh settles
        pids = {daemon_process(p2p).pid for p2p in daemons}
        before = tcp_sockets(pids)
        await asyncio.sleep(idle_seconds)
        idle = _tcp_total(tcp_sockets(pids)) - _tcp_total(before)
        before, started = tcp_sockets(pids), time.monotonic()
        for n in range(messages):
            tag = n.to_bytes(8, "big")
            message = tag + data[8:]
            sent_at[tag] = time.perf_counter()
            await publish(daemons[n % size], "sapo/bench", message)
            await asyncio.sleep(seconds / messages)
        await asyncio.sleep(2.0)
        elapsed = time.monotonic() - started
        moved = _tcp_total(tcp_sockets(pids)) - _tcp_total(before) - idle * elapsed / idle_seconds
        network = moved / 2  # each byte is counted by the socket that sent it and the one that received it
        return {
            "topic_peers": size,
            "messages": messages,
            "message_bytes": len(data),
            "delivered": len(received),
            "expected": messages * size,
            "network_bytes_per_message_per_subscriber": network / (messages * size),
            "copies_per_message_per_subscriber": network / (messages * size) / len(data),
            "idle_network_bytes_per_peer_second": idle / 2 / idle_seconds / size,
            "latency_median_s": statistics.median(received) if received else None,
            "latency_p95_s": percentile(received, 0.95),
        }
    finally:
        for task in readers:
            task.cancel()
        for p2p in daemons:
            await close_p2p(p2p)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Measure each topic size and write transport_gossip_cost.{json,md}."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.transport_gossip_cost", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[2, 4, 8, 16], help="topic sizes (daemons)")
    parser.add_argument("--messages", type=int, default=80, help="announcements published per size")
    parser.add_argument("--seconds", type=float, default=10.0, help="over how long they are published")
    parser.add_argument("--results-dir", default=str(RESULTS), help="where the outputs go")
    args = parser.parse_args(argv)
    record = run_record()
    runs = []
    for size in args.sizes:
        print(f"transport_gossip_cost: T={size} ...", flush=True)
        runs.append(asyncio.run(measure(size, args.messages, args.seconds)))
        print(runs[-1], flush=True)
    report = {**record, "settings": vars(args), "runs": runs}
    lines = [
        "# What an announcement costs on GossipSub (p2pd, loopback)",
        "",
        *record_lines(report),
        "Setup: T daemons (swarm.hivemind_bridge.PubsubP2P) joined through the first and connected in a ring, "
        f"one topic; "
        f"{args.messages} real announcements ({runs[0]['message_bytes'] if runs else '-'} bytes: one record, signed) "
        f"published in turn over {args.seconds:g} s; TCP bytes of every socket (ss) less the idle rate.",
        "",
        "| T (peers on the topic) | delivered / expected | network bytes per message per subscriber | copies "
        "| latency ms median / p95 | idle bytes per peer-second |",
        "|---|---|---|---|---|---|",
    ]
    for r in runs:
        latency = (
            "-"
            if r["latency_median_s"] is None
            else f"{r['latency_median_s'] * 1e3:.1f} / {r['latency_p95_s'] * 1e3:.1f}"
        )
        lines.append(
            f"| {r['topic_peers']} | {r['delivered']} / {r['expected']} "
            f"| {r['network_bytes_per_message_per_subscriber']:.0f} | {r['copies_per_message_per_subscriber']:.1f} "
            f"| {latency} | {r['idle_network_bytes_per_peer_second']:.0f} |"
        )
    lines += [
        "",
        "Copies: network bytes per message per subscriber over the message's size (TLS, yamux and the pubsub envelope "
        "included, so one copy counts for a little more than one). The publisher sends to every topic peer it is "
        "connected to (GossipSub's flood publish), and each forwards to its mesh peers: a subscriber receives a "
        "message about min(T, ~10) times. Latency: publish call to each subscriber's arrival, in one process.",
    ]
    write_report(Path(args.results_dir), "transport_gossip_cost", report, lines)
    print("\n".join(lines))
    return report


if __name__ == "__main__":
    main()
